-- Add to a counter (the HA tests' script: a write that must reach the new master).
-- A.by = how much to add
-- returns the counter after adding
local K = {
  counter = KEYS[1],
}
local A = cjson.decode(ARGV[1])
return redis.call('INCRBY', K.counter, A.by)
