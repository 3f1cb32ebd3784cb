-- A submit is published again (later): owe it until its message starts.
-- A.id = lease id (solve id), A.job (JSON), A.due_ms = ms until the message counts as
--   lost, A.deadline_ms = ms until the solve's deadline, A.unclaim = true to give up the
--   claim (it is this message's)
-- returns 1
local K = {
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[1],
  dispatch = KEYS[2],
  -- the solve's submit claim (lib/record.lua)
  claim = KEYS[3],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
owed.owe(A.id, now + A.deadline_ms, A.job, now + A.due_ms)
if A.unclaim then redis.call('DEL', K.claim) end
return 1
