-- The one completion of a solve, step 2 of 3 (after finish_claim): free the thread of a
-- solve that is over and hand it to the next parked submit.  It acts on the record: a
-- solve not over (finish_claim found another captcha of it, or did not run) keeps what it
-- holds.  Freeing twice frees nothing more.  Its deferral, if it has one, is dropped by
-- finish_tally (this script has no key left for it; one left behind has no job, and the
-- next hand_out_deferred drops it).
-- A.lease = lease id, A.handout = the handout table H (lib/slots.lua)
-- returns {given, expired}: the submits handed out (owed a message)
local K = {
  -- the solve's record: over, or not
  record = KEYS[1],
  -- the provider's slots and queues (lib/slots.lua), and every key the handout reads
  slots = KEYS[2],
  parked = KEYS[3],
  lanes = KEYS[4],
  owners = KEYS[5],
  counts = KEYS[6],
  fair = KEYS[7],
  waits = KEYS[8],
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
if redis.call('HEXISTS', K.record, 'done') == 0 then return {{}, {}} end
slots.vacate(A.lease)
redis.call('SREM', K.prepaid, A.lease)
owed.forget(A.lease)
return handout.run(A.handout)
