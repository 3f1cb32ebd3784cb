-- A request to the provider was answered: the consecutive failures start again from 0.
-- A (nothing)
-- returns 1
local K = {
  circuit = KEYS[1],  -- hash: the provider's circuit (circuits/fail)
}
if redis.call('HGET', K.circuit, 'state') ~= 'open' then
  redis.call('HSET', K.circuit, 'failures', 0)
end
return 1
