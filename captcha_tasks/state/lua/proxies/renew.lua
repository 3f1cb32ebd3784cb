-- Reset the TTL of one owner's assignment, if it is still the owner's.
-- A.owner, A.proxy = that proxy, A.ttl_ms = assignment TTL
-- returns 1 if both keys still name each other and their TTLs were reset, else 0
local K = {
  assignment = KEYS[1],  -- string with a TTL: the owner's proxy
  owner = KEYS[2],  -- string with a TTL: which owner holds the proxy the assignment named
}
local A = cjson.decode(ARGV[1])
if redis.call('GET', K.assignment) == A.proxy and redis.call('GET', K.owner) == A.owner then
  redis.call('PEXPIRE', K.assignment, A.ttl_ms)
  redis.call('PEXPIRE', K.owner, A.ttl_ms)
  return 1
end
return 0
