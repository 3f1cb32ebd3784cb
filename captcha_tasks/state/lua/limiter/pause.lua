-- The API answered HTTP 429: hold every in.php and res.php request of the account.
-- A.ms = ms to hold (a later hold already set is kept)
-- returns ms the account is held from now
local K = {
  -- the provider's requests per hour; field 'pause' = until when, ms (lib/rates.lua)
  rate_hourly = KEYS[1],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/rates.lua
local until_ms = now + A.ms
local current = tonumber(redis.call('HGET', K.rate_hourly, 'pause') or '0')
if until_ms > current then
  redis.call('HSET', K.rate_hourly, 'pause', until_ms)
  redis.call('PEXPIRE', K.rate_hourly, math.max(3 * rates.HOUR_MS, until_ms - now))
  return until_ms - now
end
return current - now
