-- Take a domain's session lock if nobody holds it (toolkit/sessions.py, SessionLock): the
-- lock holds the acquirer's random token, so only it can extend or release it.
-- A.token = a random token of this acquire, A.ttl_ms = how long the lock lives
-- returns 1 when taken, 0 when another holder has it
local K = {
  lock = KEYS[1],  -- string with a TTL: the holder's token
}
local A = cjson.decode(ARGV[1])
if redis.call('SET', K.lock, A.token, 'NX', 'PX', A.ttl_ms) then return 1 end
return 0
