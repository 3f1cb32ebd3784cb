-- Switch the channel's state, once: only while it is still A.from.
-- A.from, A.to = the states, A.share = the share it starts with (absent: as it is)
-- returns 1 when switched, 0 when another process switched it first
local K = {
  channel = KEYS[1],  -- hash: state, since, switched_ms, share
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
if (redis.call('HGET', K.channel, 'state') or 'up') ~= A.from then return 0 end
redis.call('HSET', K.channel, 'state', A.to, 'since', 0, 'switched_ms', now)
if A.share then redis.call('HSET', K.channel, 'share', tostring(A.share)) end
return 1
