-- Hand the provider's free slots to its parked submits (expired leases reclaimed first);
-- housekeeping's step 2 of 3 at a provider (after repair).
-- A.handout = the handout table H (lib/slots.lua)
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
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[8],
  dispatch = KEYS[9],
  -- the tenants' daily budgets (the handout hands on a spent tenant's submits)
  budget = KEYS[10],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/budget.lua
--@include lib/slots.lua
--@include lib/handout.lua
return handout.run(A.handout)
