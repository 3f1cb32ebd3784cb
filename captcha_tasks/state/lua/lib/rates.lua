-- rates: a provider's request budgets (state/limiter.py).  K.rate_in (zset: recent in.php
-- requests), K.rate_hourly (hash: requests per hour, 'in:<hour>', 'res:<hour>',
-- 'noslot:<hour>', and 'pause' = until when an HTTP 429 holds every request, ms).
-- R (a budget table, ThreadLimiter.lua_budgets): window_ms, per_window (0: no window),
-- no_slot_ratio (0: no NO_SLOT budget).
--@include lib/now.lua
local rates = {}

rates.HOUR_MS = 3600000

-- ms an HTTP 429 still holds every request (0: none).
function rates.paused()
  local until_ms = tonumber(redis.call('HGET', K.rate_hourly, 'pause') or '0')
  if until_ms > now then return until_ms - now end
  return 0
end

-- Count one in.php request, or say how long to wait (ms) and for which budget.
function rates.submit(R, request_id)
  local pause = rates.paused()
  if pause > 0 then return pause, 'pause' end
  local hour = math.floor(now / rates.HOUR_MS)
  if R.no_slot_ratio > 0 then
    local made = tonumber(redis.call('HGET', K.rate_hourly, 'in:' .. hour) or '0')
    local refused = tonumber(redis.call('HGET', K.rate_hourly, 'noslot:' .. hour) or '0')
    if refused >= R.no_slot_ratio * math.max(made - refused, 10) then
      return (hour + 1) * rates.HOUR_MS - now, 'no_slot'
    end
  end
  if R.per_window > 0 then
    redis.call('ZREMRANGEBYSCORE', K.rate_in, '-inf', now - R.window_ms)
    if redis.call('ZCARD', K.rate_in) >= R.per_window then
      local oldest = redis.call('ZRANGE', K.rate_in, 0, 0, 'WITHSCORES')
      return math.max(1, tonumber(oldest[2]) + R.window_ms - now), 'submit_rate'
    end
    redis.call('ZADD', K.rate_in, now, request_id)
    redis.call('PEXPIRE', K.rate_in, R.window_ms * 2)
  end
  redis.call('HINCRBY', K.rate_hourly, 'in:' .. hour, 1)
  redis.call('HDEL', K.rate_hourly, 'in:' .. (hour - 2), 'res:' .. (hour - 2),
    'noslot:' .. (hour - 2))
  redis.call('PEXPIRE', K.rate_hourly, 3 * rates.HOUR_MS)
  return 0, ''
end
