-- Exclude a proxy for a while and drop its assignment.
-- A.proxy, A.cool_ms = cool-off
-- returns when the proxy comes back (ms, Redis clock)
local K = {
  quarantine = KEYS[1],  -- zset: proxy -> when it comes back (ms)
  owner = KEYS[2],  -- string with a TTL: which owner holds the proxy
  -- string with a TTL: the proxy of the owner that held it when read (a blank owner's
  -- key, which no owner has, when nobody did)
  assignment = KEYS[3],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local back = now + A.cool_ms
redis.call('ZADD', K.quarantine, back, A.proxy)
redis.call('DEL', K.owner)
if redis.call('GET', K.assignment) == A.proxy then
  redis.call('DEL', K.assignment)
end
return back
