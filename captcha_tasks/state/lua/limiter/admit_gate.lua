-- Admit one submit message at this provider, step 1 of 3 (a chain: admit_gate,
-- admit_slot, admit_charge, sent in one round trip): may this message go on here?  Its
-- solve message has started; a solve that is over, revoked, claimed by another message,
-- at a provider out of rotation or in a cancelled batch stops here.  One that may go on
-- gets a mark in its record (the admit mark: this call's token and its arrival number)
-- that the next steps of this chain, and only they, act on.
-- A.id = the solve id (its lease id), A.attempt, A.message_id (the task message asking),
-- A.redelivered = true when that message came again (its first worker died), A.batch =
-- true when the solve belongs to a batch, A.token = this admission's (unique per call)
-- returns {status, ms}: 'open' (marked: the next steps go on), 'done' (this attempt was
--   submitted or the solve is over), 'revoked' (its caller revoked it: nothing is sent;
--   the completion frees what it holds), 'busy' (another message holds the claim, for ms
--   more: look again then, in case its holder died), 'down' (the provider's circuit is
--   open: the caller frees what the solve holds here), 'cancelled' (its batch was
--   abandoned: the caller frees what the solve holds here)
local K = {
  -- the solve message that asked for this submit: it has started (lib/owed.lua)
  requested = KEYS[1],
  requested_messages = KEYS[2],
  -- the solve: its record (where the mark goes), claim and revocation (lib/record.lua)
  record = KEYS[3],
  claim = KEYS[4],
  revoked = KEYS[5],
  -- the provider's circuit (hash: 'state' = 'open' while it is out of rotation)
  circuit = KEYS[6],
  -- the solve's batch: abandoned by its caller (string; a placeholder for no batch)
  cancelled = KEYS[7],
  -- the arrival order of parked submits (counter, the deployment's)
  parked_seq = KEYS[8],
}
local A = cjson.decode(ARGV[1])
--@include lib/owed.lua
--@include lib/record.lua
owed.started(A.id)
if record.passed(A.attempt) then return {'done', 0} end
if record.revoked() then return {'revoked', 0} end
local holder = redis.call('GET', K.claim)
-- The message that took the claim, redelivered because its worker never acknowledged it
-- (it died), goes on; any other copy waits for the claim.
local mine = holder == A.message_id and A.redelivered
if holder and not mine then return {'busy', redis.call('PTTL', K.claim)} end
if redis.call('HGET', K.circuit, 'state') == 'open' then return {'down', 0} end
if A.batch and redis.call('EXISTS', K.cancelled) == 1 then return {'cancelled', 0} end
record.mark('admit', A.token .. '|' .. redis.call('INCR', K.parked_seq))
return {'open', 0}
