-- A probe (or a balance check) answered: a good answer closes the circuit.
-- A.ok = true for a good answer, A.balance = the balance it read (absent: none),
-- A.code = the error of a bad answer (absent: none)
-- returns 1 when this call closed the circuit, else 0
local K = {
  circuit = KEYS[1],  -- hash: the provider's circuit (circuits/fail)
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
if A.balance then redis.call('HSET', K.circuit, 'balance', A.balance, 'balance_ms', now) end
if not A.ok then
  if A.code then redis.call('HSET', K.circuit, 'error', A.code, 'error_ms', now) end
  return 0
end
local was = redis.call('HGET', K.circuit, 'state')
redis.call('HSET', K.circuit, 'state', 'closed', 'failures', 0)
if was == 'open' then
  redis.call('HSET', K.circuit, 'closed_ms', now)
  return 1
end
return 0
