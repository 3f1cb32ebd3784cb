-- Count a refill solve as in flight until it finishes or its timeout passes.
-- A.name, A.refill = refill id, A.timeout_s = seconds until it stops counting (a worker
--   that died must not block refills)
-- returns 1 recorded, -1 undeclared pool
local K = {
  registry = KEYS[1],  -- hash: pool name -> its definition (JSON)
  inflight = KEYS[2],  -- zset: refill id -> when it stops counting (ms)
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
if redis.call('HEXISTS', K.registry, A.name) == 0 then return -1 end
redis.call('ZADD', K.inflight, now + math.floor(A.timeout_s * 1000), A.refill)
return 1
