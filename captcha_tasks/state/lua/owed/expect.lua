-- A solve message is about to be published: remember it until it starts.
-- A.id = solve id, A.message = its keyword arguments (JSON), A.wait_ms = ms it may wait
-- returns 1
local K = {
  -- solve messages on their way (lib/owed.lua)
  requested = KEYS[1],
  requested_messages = KEYS[2],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
redis.call('HSET', K.requested_messages, A.id, A.message)
redis.call('ZADD', K.requested, now + A.wait_ms, A.id)
return 1
