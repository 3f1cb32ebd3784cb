-- The one completion of a solve, step 1 of 3 (a chain: finish_claim, finish_free,
-- finish_tally, sent in one round trip): claim the solve once, store its outcome for the
-- caller, append it to its batch stream, and take its follow-ups (owed until they have
-- run).  A solve its caller revoked ends revoked, whatever the answer was.  What the caller
-- must never miss is here, in one atomic step; the thread it frees (finish_free) and what
-- it counts (finish_tally) follow, and a process that dies before them loses nothing: the
-- lease runs out and housekeeping hands the slot on.  The claim leaves the tally mark in
-- the record for finish_tally.
-- A.cid = captcha id (absent when no captcha of the solve is at the provider),
-- A.lease = lease id, A.record_ttl_s, A.result = result value (absent: none stored),
-- A.revoked_result = the value stored instead for a revoked solve, A.result_ttl_s,
-- A.entry and A.revoked_entry = batch entries (absent: none), A.followup_grace_ms
-- returns {0} when the solve was completed already (nothing stored or emitted), else
--   {1, follow-up or false, revoked (1 / 0)}
local K = {
  -- the provider's board: the captcha leaves it (lib/board.lua)
  board = KEYS[1],
  due = KEYS[2],
  poll_state = KEYS[3],
  -- the solve's record (claimed once, the tally mark), claim and revocation
  record = KEYS[4],
  claim = KEYS[5],
  revoked = KEYS[6],
  -- the caller's result key (opaque here)
  result = KEYS[7],
  -- the solve's batch stream (lib/batch.lua)
  batch_stream = KEYS[8],
  batch_cancelled = KEYS[9],
  -- the solve's follow-up, owed from now until it has run (lib/followups.lua)
  followup = KEYS[10],
  followups_owed = KEYS[11],
  followups_due = KEYS[12],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/board.lua
--@include lib/record.lua
--@include lib/batch.lua
--@include lib/followups.lua
if A.cid and not board.take(A.cid) then return {0} end
if not record.close(A.record_ttl_s) then return {0} end
local revoked = record.revoked()
local result, entry = A.result, A.entry
if revoked then result, entry = A.revoked_result, A.revoked_entry end
if result then
  redis.call('SET', K.result, result, 'EX', A.result_ttl_s)
  redis.call('PUBLISH', K.result, result)
end
if entry then batch.append(entry) end
local followup = followups.take(A.lease, A.followup_grace_ms)
local flag = 0
if revoked then flag = 1 end
record.mark('tally', flag == 1 and 'revoked' or 'ended')
return {1, followup, flag}
