-- Admit one submit message, step 2 of 3 (after admit_gate, before admit_charge): keep or
-- take its solve's thread slot, or park the job in its lane and hand free slots on.  Acts
-- only on the admit mark admit_gate left for this call (else 'skip': the gate said no, or
-- another copy of the message is being admitted right now), and stamps it with what it
-- did, for admit_charge (which acts on that, not on where the slot is by then: a submit
-- parked here may be handed a slot before admit_charge runs, and its own message goes on
-- then).
-- A.token (admit_gate's), A.id = lease id, A.lane, A.tenant, A.asked_ms = when the solve
--   was asked for (ms; absent: now), A.job = the job (JSON, parked if it must wait),
--   A.deadline_ms = ms until the solve's deadline, A.handout = the handout table H
--   (lib/slots.lua), A.park_limit = most parked submits before this one is turned away
--   (absent: no limit)
-- returns {status, {given, expired}}: the submits handed out on the way (owed a message);
--   status 'held' (it keeps the slot it held), 'took' (it took a free slot), 'parked',
--   'full' (no slot, and more than park_limit wait already: nothing kept here),
--   'over_budget' (its tenant spent today's budget: nothing is sent; the completion frees
--   what it holds), 'skip' (not marked: nothing done)
local K = {
  -- the solve's record: the admit mark
  record = KEYS[1],
  -- the provider's slots and queues (lib/slots.lua): whether it holds or takes a slot, or
  -- parks; and every key the handout reads (lib/handout.lua)
  slots = KEYS[2],
  parked = KEYS[3],
  lanes = KEYS[4],
  owners = KEYS[5],
  counts = KEYS[6],
  fair = KEYS[7],
  waits = KEYS[8],
  deferred = KEYS[9],
  -- the deployment's waiting jobs and owed messages (lib/owed.lua): this message started,
  -- so the submit is owed none; a parked one keeps its job there
  waiting = KEYS[10],
  dispatch = KEYS[11],
  -- the tenants' daily budgets (lib/budget.lua): one that spent its budget parks nothing
  budget = KEYS[12],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/record.lua
--@include lib/budget.lua
--@include lib/slots.lua
--@include lib/handout.lua
local none = {{}, {}}
local mark = record.marked('admit')
local seq = mark and string.match(mark, '^' .. A.token .. '|(%d+)$')
if not seq then return {'skip', none} end
local id, H = A.id, A.handout
local function stamped(status, out)
  record.mark('admit', A.token .. '|' .. status)
  return {status, out}
end
if redis.call('ZSCORE', K.parked, id) then return stamped('parked', none) end
owed.forget(id)
redis.call('ZREM', K.deferred, id)
slots.reclaim()
if redis.call('ZSCORE', K.slots, id) then
  redis.call('ZADD', K.slots, now + H.lease_ms, id)
  return stamped('held', none)
end
if budget.spent(A.tenant, slots.tenant(H, A.tenant).daily) then
  return stamped('over_budget', none)
end
local ahead = redis.call('ZCARD', K.parked)
-- A newcomer takes its turn like any parked submit: it parks, and the handout may pick it.
slots.park(H, id, A.lane, A.tenant, A.asked_ms, tonumber(seq))
owed.keep(id, now + A.deadline_ms, A.job)
local out = handout.run(H)
local mine_at
for i = 1, #out[1], 2 do
  if out[1][i] == id then mine_at = i end
end
if not mine_at then
  if A.park_limit and ahead >= A.park_limit then
    -- the queue is too long: an overflow provider takes it (nothing is kept here; its
    -- prepaid mark, if any, goes in admit_charge)
    slots.vacate(id)
    owed.forget(id)
    return stamped('full', out)
  end
  return stamped('parked', out)
end
-- it took a slot itself: this very message goes on, no other is owed
table.remove(out[1], mine_at)
table.remove(out[1], mine_at)
owed.forget(id)
return stamped('took', out)
