-- Hand out the soonest-expiring usable token, exactly once.
-- A.name, A.min_s = seconds of life the token must have left (absent: the pool's
--   min_remaining), A.history_s = seconds of take history to keep
-- returns {1, record, ms of life left}, {0} when no usable token (a miss), {-1} undeclared
local K = {
  registry = KEYS[1],  -- hash: pool name -> its definition (JSON)
  tokens = KEYS[2],  -- zset: token record (JSON) -> its expiry (ms, Redis clock)
  stats = KEYS[3],  -- hash: started, added, taken, expired, misses, take_seq
  takes = KEYS[4],  -- zset: take id -> when (ms): the take rate
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local def = redis.call('HGET', K.registry, A.name)
if not def then return {-1} end
local min_s = A.min_s or tonumber(cjson.decode(def).min_remaining)
local expired = redis.call('ZREMRANGEBYSCORE', K.tokens, '-inf', now)
if expired > 0 then redis.call('HINCRBY', K.stats, 'expired', expired) end
-- Misses are demand too: counting only hits would make a dry pool look idle.
local seq = redis.call('HINCRBY', K.stats, 'take_seq', 1)
redis.call('ZADD', K.takes, now, now .. '-' .. seq)
redis.call('ZREMRANGEBYSCORE', K.takes, '-inf', now - math.floor(A.history_s * 1000))
-- Soonest-expiring first, so the longer-lived tokens are still there for later takes.
local floor = now + math.max(1, math.floor(min_s * 1000))
local hit = redis.call('ZRANGEBYSCORE', K.tokens, floor, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if not hit[1] then
  redis.call('HINCRBY', K.stats, 'misses', 1)
  return {0}
end
redis.call('ZREM', K.tokens, hit[1])
redis.call('HINCRBY', K.stats, 'taken', 1)
return {1, hit[1], tonumber(hit[2]) - now}
