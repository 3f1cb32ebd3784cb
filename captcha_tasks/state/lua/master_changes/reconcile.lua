-- After a master change: every message Redis remembers owing is due now, whatever the
-- solve queue holds (the next housekeeping sweep sends them again), a poll round is
-- scheduled anew and the provider's thread count looked at.
-- A (nothing)
-- returns {solve messages, owed submits} made due
local K = {
  -- what the deployment is owed (lib/owed.lua)
  requested = KEYS[1],
  dispatch = KEYS[2],
  -- the pending poll round (string) and the thread count check (string with a PX)
  round = KEYS[3],
  threads_check = KEYS[4],
}
local function all_due(key)
  local ids = redis.call('ZRANGE', key, 0, -1)
  for _, id in ipairs(ids) do redis.call('ZADD', key, 0, id) end
  return #ids
end
local solves = all_due(K.requested)
local submits = all_due(K.dispatch)
redis.call('DEL', K.round, K.threads_check)
return {solves, submits}
