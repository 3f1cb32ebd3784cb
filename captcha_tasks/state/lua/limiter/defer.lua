-- A submit goes again later (a back-off): it waits in Redis, keeping the slot it holds,
-- and housekeeping hands it out when its time comes (hand_out_deferred).
-- A.id = lease id (solve id), A.job (JSON), A.at_ms = ms until it goes, A.deadline_ms =
--   ms until the solve's deadline, A.lease_ms = a lease's length, A.unclaim = true to
--   give up the claim (it is this message's)
-- returns 1
local K = {
  -- the provider's held slots and deferred submits
  slots = KEYS[1],
  deferred = KEYS[2],
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[3],
  dispatch = KEYS[4],
  -- the solve's submit claim (lib/record.lua)
  claim = KEYS[5],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/slots.lua
slots.defer({lease_ms = A.lease_ms}, A.id, now + A.deadline_ms, A.job, now + A.at_ms)
if A.unclaim then redis.call('DEL', K.claim) end
return 1
