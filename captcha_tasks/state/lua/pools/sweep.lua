-- Drop a pool's expired tokens, counting them as waste.
-- A.name
-- returns how many were dropped, -1 for an undeclared pool
local K = {
  registry = KEYS[1],  -- hash: pool name -> its definition (JSON)
  tokens = KEYS[2],  -- zset: token record (JSON) -> its expiry (ms, Redis clock)
  stats = KEYS[3],  -- hash: started, added, taken, expired, misses, take_seq
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
if redis.call('HEXISTS', K.registry, A.name) == 0 then return -1 end
local swept = redis.call('ZREMRANGEBYSCORE', K.tokens, '-inf', now)
if swept > 0 then redis.call('HINCRBY', K.stats, 'expired', swept) end
return swept
