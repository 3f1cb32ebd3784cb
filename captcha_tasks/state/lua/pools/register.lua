-- Declare (or redefine) a pool.
-- A.name, A.definition (JSON), A.drop = true to drop tokens and refills solved for an
--   older, different definition
-- returns 1 for a new pool, 0 when an existing definition was replaced
local K = {
  registry = KEYS[1],  -- hash: pool name -> its definition (JSON)
  stats = KEYS[2],  -- hash: started, added, taken, expired, misses, take_seq
  tokens = KEYS[3],  -- zset: token record (JSON) -> its expiry (ms, Redis clock)
  inflight = KEYS[4],  -- zset: refill id -> when it stops counting (ms)
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local new = redis.call('HSET', K.registry, A.name, A.definition)
-- A young pool's take rate is measured over its age, so remember when it started.
redis.call('HSETNX', K.stats, 'started', now)
if A.drop then redis.call('DEL', K.tokens, K.inflight) end
return new
