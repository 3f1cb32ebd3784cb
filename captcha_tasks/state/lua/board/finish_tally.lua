-- The one completion of a solve, step 3 of 3 (after finish_claim and finish_free): count
-- how it ended, once (it takes the tally mark finish_claim left), and forget what is left
-- of it: its message (started), its secrets, its deferral.  A process that dies before
-- this leaves a count out, nothing else: the secrets expire, a leftover deferral is
-- dropped by housekeeping, a solve message noted as on its way comes again and finds the
-- solve over.
-- A.lease = lease id (the solve id), A.solve_s = solve time (absent: none), A.source and
-- A.code = what to count (absent: nothing), A.solved = true when it ended with an answer,
-- A.lane and A.tenant (absent: not counted by lane)
-- returns 1 when it counted, 0 when the solve was counted already (or never claimed)
local K = {
  -- the solve's record: the tally mark
  record = KEYS[1],
  -- the counters (lib/stats.lua, lib/times.lua)
  solved = KEYS[2],
  api_errors = KEYS[3],
  lane_outcomes = KEYS[4],
  solve_times = KEYS[5],
  -- what is left of the solve: its secrets (lib/secrets.lua), its message (lib/owed.lua),
  -- its deferral at the provider
  secrets = KEYS[6],
  requested = KEYS[7],
  requested_messages = KEYS[8],
  deferred = KEYS[9],
}
local A = cjson.decode(ARGV[1])
--@include lib/owed.lua
--@include lib/record.lua
--@include lib/secrets.lua
--@include lib/stats.lua
--@include lib/times.lua
local how = record.unmark('tally')
if not how then return 0 end
owed.started(A.lease)
secrets.drop()
redis.call('ZREM', K.deferred, A.lease)
local revoked = how == 'revoked'
if A.solve_s and not revoked then times.add(A.solve_s) end
if revoked then
  stats.error('ERROR_REVOKED')
else
  if A.source then stats.solved(A.source) end
  if A.code then stats.error(A.code) end
end
if A.lane then
  local ending = 'failed'
  if A.solved and not revoked then ending = 'solved' end
  stats.lane(ending, A.lane, A.tenant)
end
return 1
