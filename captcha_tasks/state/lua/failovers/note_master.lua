-- Remember the master's run id; count a change.
-- A.run_id = the master's run id now
-- returns 1 when the master changed since it was last seen (0 the first time, or same)
local K = {
  master = KEYS[1],  -- string: the run id last seen
  events = KEYS[2],  -- hash: counters
}
local A = cjson.decode(ARGV[1])
local seen = redis.call('GET', K.master)
if seen == A.run_id then return 0 end
redis.call('SET', K.master, A.run_id)
if not seen then return 0 end
redis.call('HINCRBY', K.events, 'master_changes', 1)
return 1
