-- Forget a pool's counters and take history; its age starts again now.
-- A (nothing)
-- returns 1
local K = {
  stats = KEYS[1],  -- hash: started, added, taken, expired, misses, take_seq
  takes = KEYS[2],  -- zset: take id -> when (ms): the take rate
}
--@include lib/now.lua
redis.call('DEL', K.stats, K.takes)
redis.call('HSET', K.stats, 'started', now)
return 1
