-- A request to the provider failed.  Counts a consecutive transport failure, or opens the
-- circuit at once for a hard one (an empty balance, a refused key).
-- A.code = the error's code, A.why = 'soft' | 'balance' | 'key', A.threshold = consecutive
--   soft failures that open it, A.probe_ms = ms until the first probe
-- returns 1 when this call opened the circuit, 2 when it was open already, else 0
local K = {
  -- hash: the provider's circuit: state, why, code, failures, opened_ms, probe_ms, probes,
  -- error, error_ms, balance, balance_ms, closed_ms
  circuit = KEYS[1],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
redis.call('HSET', K.circuit, 'error', A.code, 'error_ms', now)
if redis.call('HGET', K.circuit, 'state') == 'open' then return 2 end
local failures = redis.call('HINCRBY', K.circuit, 'failures', 1)
if A.why == 'soft' and failures < A.threshold then return 0 end
redis.call('HSET', K.circuit, 'state', 'open', 'why', A.why, 'code', A.code,
  'opened_ms', now, 'probe_ms', now + A.probe_ms, 'probes', 0)
return 1
