-- A solve leaves this provider before it ends (it goes to another one, or its batch was
-- cancelled, or the provider is out of rotation): free what it holds here (its slot, its
-- place in a queue, its deferral) and hand the slot on.
-- A.id = lease id, A.forget = true when its submit message started here (a cancelled
--   batch's: it is owed no message either), A.handout = the handout table H
--   (lib/slots.lua; absent: hand nothing on, the provider being out of rotation)
-- returns {given, expired}: the submits handed out (owed a message)
local K = {
  -- the provider's slots and queues (lib/slots.lua), and every key the handout reads
  slots = KEYS[1],
  parked = KEYS[2],
  lanes = KEYS[3],
  owners = KEYS[4],
  counts = KEYS[5],
  fair = KEYS[6],
  waits = KEYS[7],
  deferred = KEYS[8],
  prepaid = KEYS[9],
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[10],
  dispatch = KEYS[11],
  -- the tenants' daily budgets (the handout hands on a spent tenant's submits)
  budget = KEYS[12],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/budget.lua
--@include lib/slots.lua
--@include lib/handout.lua
slots.leave(A.id)
if A.forget then owed.forget(A.id) end
if not A.handout then return {{}, {}} end
return handout.run(A.handout)
