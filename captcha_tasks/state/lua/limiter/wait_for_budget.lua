-- A submit admitted with its slot must wait for a request budget (admit_charge said
-- 'deferred'): it gives the slot back, its job waits in Redis until its time
-- (housekeeping hands it out then: hand_out_deferred), and the slot goes to the next
-- parked submit.  Should the caller die before this, the slot's lease runs out and the
-- task message, never acknowledged, comes again: nothing is lost.
-- A.id = lease id, A.job (JSON), A.deadline_ms = ms until the solve's deadline, A.at =
--   when it goes (ms, admit_charge's), A.handout = the handout table H (lib/slots.lua)
-- returns {given, expired}: the submits handed out (owed a message)
local K = {
  -- the provider's slots and queues, and every key the handout reads (lib/handout.lua)
  slots = KEYS[1],
  parked = KEYS[2],
  lanes = KEYS[3],
  owners = KEYS[4],
  counts = KEYS[5],
  fair = KEYS[6],
  waits = KEYS[7],
  deferred = KEYS[8],
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[9],
  dispatch = KEYS[10],
  -- the tenants' daily budgets (the handout hands on a spent tenant's submits)
  budget = KEYS[11],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/budget.lua
--@include lib/slots.lua
--@include lib/handout.lua
slots.drop(A.id)
owed.wait(A.id, now + A.deadline_ms, A.job)
redis.call('ZADD', K.deferred, A.at, A.id)
return handout.run(A.handout)
