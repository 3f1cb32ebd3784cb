-- Read everything a pool's status and refill plan need, at one instant.
-- A.name, A.min_life_s = seconds of life a token needs to count in "covered",
-- A.window_s = take-rate window, A.min_window_s = shortest window a young pool's rate is
--   measured over
-- returns {-1} for an undeclared pool, else {1, live, covered, in flight,
--   takes in window, window ms, added, taken, expired, misses}
local K = {
  -- the pools' registry and this pool's tokens, refills, counters and takes
  registry = KEYS[1],  -- hash: pool name -> its definition (JSON)
  tokens = KEYS[2],  -- zset: token record (JSON) -> its expiry (ms, Redis clock)
  inflight = KEYS[3],  -- zset: refill id -> when it stops counting (ms)
  stats = KEYS[4],  -- hash: started, added, taken, expired, misses, take_seq
  takes = KEYS[5],  -- zset: take id -> when (ms): the take rate
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
if redis.call('HEXISTS', K.registry, A.name) == 0 then return {-1} end
-- Expired tokens are left for take / sweep to count; they are simply not live.
local live = redis.call('ZCOUNT', K.tokens, '(' .. now, '+inf')
local floor = now + math.max(1, math.floor(A.min_life_s * 1000))
local covered = redis.call('ZCOUNT', K.tokens, floor, '+inf')
-- A refill whose worker died stops counting once its timeout passes.
redis.call('ZREMRANGEBYSCORE', K.inflight, '-inf', now)
local inflight = redis.call('ZCARD', K.inflight)
local window = math.floor(A.window_s * 1000)
local started = tonumber(redis.call('HGET', K.stats, 'started'))
if started then
  window = math.min(window, math.max(now - started, math.floor(A.min_window_s * 1000)))
end
local takes = redis.call('ZCOUNT', K.takes, '(' .. (now - window), '+inf')
local c = redis.call('HMGET', K.stats, 'added', 'taken', 'expired', 'misses')
return {1, live, covered, inflight, takes, window,
  tonumber(c[1]) or 0, tonumber(c[2]) or 0, tonumber(c[3]) or 0, tonumber(c[4]) or 0}
