-- Put one solved token in a pool, scored by its own expiry.
-- A.name, A.record (JSON; unique because it holds the token and captcha id),
-- A.life_s = seconds of life the token has left (capped at the pool's ttl)
-- returns 1 added, 0 already in the pool, -1 undeclared pool
local K = {
  registry = KEYS[1],  -- hash: pool name -> its definition (JSON)
  tokens = KEYS[2],  -- zset: token record (JSON) -> its expiry (ms, Redis clock)
  stats = KEYS[3],  -- hash: started, added, taken, expired, misses, take_seq
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local def = redis.call('HGET', K.registry, A.name)
if not def then return -1 end
local life = math.min(A.life_s, tonumber(cjson.decode(def).ttl))
-- No key TTL is set or refreshed: a later push must never keep an older token alive.
local added = redis.call('ZADD', K.tokens, 'NX', now + math.floor(life * 1000), A.record)
if added == 1 then redis.call('HINCRBY', K.stats, 'added', 1) end
return added
