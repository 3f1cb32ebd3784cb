-- Hear answers of captchas that asked for a callback: update the channel's figures and
-- the lateness histogram.
-- A.heard = [[by, captcha id, late s, bucket index, overdue 0/1], ...] (by: callback,
--   poll or late), A.weight = how far one answer moves the share, A.keep_ms and A.most =
--   how long and how many answered captchas K.polled remembers
-- returns {state, share (string), misses, hits, since}
local K = {
  channel = KEYS[1],  -- hash: state, share, misses, hits, since
  polled = KEYS[2],  -- zset: captcha id -> when a poll found its answer (ms)
  lateness = KEYS[3],  -- hash: b:<bucket>, sum, count, overdue
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local c = redis.call('HMGET', K.channel, 'state', 'share', 'misses', 'hits', 'since')
local state = c[1] or 'up'
local share = tonumber(c[2] or '1')
local misses, hits, since = tonumber(c[3] or '0'), tonumber(c[4] or '0'), tonumber(c[5] or '0')
for _, h in ipairs(A.heard) do
  local by, cid = h[1], h[2]
  local counts = true
  if by == 'late' then
    -- once per captcha, and only for one a poll found: never a duplicate or a forgery
    counts = redis.call('ZREM', K.polled, cid) == 1
    if counts then share = math.min(1, share + A.weight) end
  elseif by == 'callback' then
    share = share + A.weight * (1 - share)
  else
    share = share * (1 - A.weight)
    redis.call('ZADD', K.polled, now, cid)
  end
  if counts then
    if by == 'poll' then
      misses, hits = misses + 1, 0
    else
      misses, hits = 0, hits + 1
    end
    since = since + 1
  end
  if by ~= 'late' then
    redis.call('HINCRBY', K.lateness, 'b:' .. h[4], 1)
    redis.call('HINCRBYFLOAT', K.lateness, 'sum', h[3])
    redis.call('HINCRBY', K.lateness, 'count', 1)
    if h[5] == 1 then redis.call('HINCRBY', K.lateness, 'overdue', 1) end
  end
end
redis.call('HSET', K.channel, 'share', tostring(share), 'misses', misses, 'hits', hits,
  'since', since)
redis.call('ZREMRANGEBYSCORE', K.polled, '-inf', now - A.keep_ms)
redis.call('ZREMRANGEBYRANK', K.polled, 0, -(A.most + 1))
return {state, tostring(share), misses, hits, since}
