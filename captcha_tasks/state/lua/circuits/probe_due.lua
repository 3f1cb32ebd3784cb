-- Housekeeping: take the probe of one provider's open circuit when it is due (the next one
-- is scheduled at once, so one process sends each).  Called once per provider, in one
-- round trip.
-- A.first_ms, A.max_ms = the probe back-off
-- returns 1 when the provider is to be probed now, else 0
local K = {
  circuit = KEYS[1],  -- hash: the provider's circuit (circuits/fail)
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
if redis.call('HGET', K.circuit, 'state') ~= 'open' then return 0 end
local at = tonumber(redis.call('HGET', K.circuit, 'probe_ms') or '0')
if at > now then return 0 end
local probes = tonumber(redis.call('HGET', K.circuit, 'probes') or '0')
local wait = math.min(A.max_ms, A.first_ms * math.pow(2, probes + 1))
redis.call('HSET', K.circuit, 'probe_ms', now + wait, 'probes', probes + 1)
return 1
