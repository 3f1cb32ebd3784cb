-- Delete a domain's session lock, if it still holds the caller's token (one whose lock
-- expired cannot delete the next holder's).
-- A.token = the token the caller acquired it with
-- returns 1 when released, 0 when the lock is not the caller's
local K = {
  lock = KEYS[1],  -- string with a TTL: the holder's token
}
local A = cjson.decode(ARGV[1])
if redis.call('GET', K.lock) ~= A.token then return 0 end
redis.call('DEL', K.lock)
return 1
