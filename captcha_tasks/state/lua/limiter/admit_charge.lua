-- Admit one submit message, step 3 of 3 (after admit_slot): a submit holding its slot
-- claims the right to call in.php for this attempt, its request counted against the
-- provider's budgets and its tenant's daily budget (once per attempt); a parked one tells
-- its caller so.  Acts only on the admit mark admit_slot stamped for this call, on what
-- that says admit_slot did, and takes it (else 'skip').
-- A.token (admit_gate's), A.id = lease id, A.attempt, A.tenant, A.daily = the tenant's
--   daily budget (absent: none), A.message_id (takes the claim), A.claim_ms (0: take no
--   claim), A.budgets = the budget table R (lib/rates.lua), A.request_id (of the in.php
--   request), A.warn_every_ms (budget warnings), A.parked_record = what the caller's
--   result key says while the solve is parked (absent: nothing), A.record_ttl_s
-- returns {status, ms, budget, warn, at}: 'go' (slot held, claim taken, request
--   counted), 'deferred' (it must wait ms for the budget named, until at (ms): the caller
--   gives its slot back and defers it, limiter/wait_for_budget), 'over_budget' (its
--   tenant spent today's budget: nothing is sent; the completion frees what it holds),
--   'parked', 'left' (neither held nor parked here: admit_slot said why), 'skip' (not
--   stamped: nothing done).  warn = 1 for the first deferral for a budget in
--   warn_every_ms.
local K = {
  -- the solve: its record (the admit mark; the attempt counted), its claim
  record = KEYS[1],
  claim = KEYS[2],
  -- the provider's parked submits: one still parked says so in its result key
  parked = KEYS[3],
  -- submits whose in.php request was counted when they were handed out (not again)
  prepaid = KEYS[4],
  -- the provider's request budgets (lib/rates.lua) and the deferrals for each
  rate_in = KEYS[5],
  rate_hourly = KEYS[6],
  budget_waits = KEYS[7],
  -- the tenants' daily budgets (lib/budget.lua)
  budget = KEYS[8],
  -- the caller's result key (opaque here): says 'parked' while the solve is
  result = KEYS[9],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/record.lua
--@include lib/budget.lua
--@include lib/rates.lua
local mark = record.marked('admit')
local did = mark and string.match(mark, '^' .. A.token .. '|(%a[%a_]*)$')
if not did then return {'skip', 0} end
record.unmark('admit')
local id = A.id
if did == 'parked' then
  -- (unless a slot was handed to it since: then the message of that handout says so)
  if A.parked_record and redis.call('ZSCORE', K.parked, id) then
    redis.call('SET', K.result, A.parked_record, 'EX', A.record_ttl_s)
    redis.call('PUBLISH', K.result, A.parked_record)
  end
  return {'parked', 0}
end
if did ~= 'held' and did ~= 'took' then
  -- it left this provider (too many parked here) or its tenant's budget is spent
  redis.call('SREM', K.prepaid, id)
  return {'left', 0}
end
-- A request counted when it was handed out (limiter/hand_out_deferred) is not counted again.
if redis.call('SREM', K.prepaid, id) == 0 then
  local wait, which = rates.submit(A.budgets, A.request_id)
  if wait > 0 then
    -- It waits for the budget, not for a thread: it waits without one, and the thread
    -- goes to the next parked submit (limiter/wait_for_budget).
    redis.call('HINCRBY', K.budget_waits, which, 1)
    local warned = tonumber(redis.call('HGET', K.budget_waits, 'warned') or '0')
    local warn = 0
    if now - warned >= A.warn_every_ms then
      redis.call('HSET', K.budget_waits, 'warned', now)
      warn = 1
    end
    return {'deferred', wait, which, warn, now + wait}
  end
end
if not record.charged(A.attempt) then
  if not budget.charge(A.tenant, A.daily) then return {'over_budget', 0} end
  record.charge(A.attempt)
end
if A.claim_ms > 0 then redis.call('SET', K.claim, A.message_id, 'PX', A.claim_ms) end
return {'go', 0}
