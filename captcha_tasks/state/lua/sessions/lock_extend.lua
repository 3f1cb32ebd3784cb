-- Reset the TTL of a domain's session lock, if it still holds the caller's token (one whose
-- lock expired cannot extend the next holder's).
-- A.token = the token the caller acquired it with, A.ttl_ms = the new TTL
-- returns 1 when extended, 0 when the lock is not the caller's
local K = {
  lock = KEYS[1],  -- string with a TTL: the holder's token
}
local A = cjson.decode(ARGV[1])
if redis.call('GET', K.lock) ~= A.token then return 0 end
redis.call('PEXPIRE', K.lock, A.ttl_ms)
return 1
