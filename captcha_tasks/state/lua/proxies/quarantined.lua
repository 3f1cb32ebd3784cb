-- The proxies cooling off (expired entries are dropped).
-- A (nothing)
-- returns the proxies still cooling off
local K = {
  quarantine = KEYS[1],  -- zset: proxy -> when it comes back (ms)
}
--@include lib/now.lua
redis.call('ZREMRANGEBYSCORE', K.quarantine, '-inf', now)
return redis.call('ZRANGEBYSCORE', K.quarantine, '(' .. now, '+inf')
