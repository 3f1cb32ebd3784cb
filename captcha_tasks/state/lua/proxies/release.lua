-- Free the owner's proxy.
-- A.owner, A.proxy = that proxy
-- returns 1 if the proxy was freed, 0 if it is not (or no longer) held by this owner
local K = {
  assignment = KEYS[1],  -- string with a TTL: the owner's proxy
  owner = KEYS[2],  -- string with a TTL: which owner holds the proxy the assignment named
}
local A = cjson.decode(ARGV[1])
if redis.call('GET', K.assignment) == A.proxy then
  redis.call('DEL', K.assignment)
end
if redis.call('GET', K.owner) == A.owner then
  redis.call('DEL', K.owner)
  return 1
end
return 0
