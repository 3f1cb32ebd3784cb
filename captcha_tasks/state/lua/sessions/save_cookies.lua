-- Replace one domain's cookies at once and bump its version: a reader sees the old cookies
-- or the new ones, never a mix or a gap (toolkit/sessions.py, CookieStore.save).
-- A.cookies = {name: value, ...} (at least one), A.ttl_ms = how long the cookies live
-- returns the new version
local K = {
  cookies = KEYS[1],  -- hash with a TTL: cookie name -> value
  version = KEYS[2],  -- counter, no TTL: it outlives the cookies (bumped by every save)
}
local A = cjson.decode(ARGV[1])
redis.call('DEL', K.cookies)
for name, value in pairs(A.cookies) do
  redis.call('HSET', K.cookies, name, value)
end
redis.call('PEXPIRE', K.cookies, A.ttl_ms)
return redis.call('INCR', K.version)
