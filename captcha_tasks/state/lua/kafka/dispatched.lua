-- The claim's solve was published: waiters now wait for its result.
-- A.celery_id, A.ttl_ms
-- returns 1, or 0 when the claim is no longer this Celery id's
local K = {
  -- hash with a TTL: one task's claim (state, celery_id, claimed_at ms, result,
  -- dead_letter)
  claim = KEYS[1],
}
local A = cjson.decode(ARGV[1])
if redis.call('HGET', K.claim, 'celery_id') ~= A.celery_id then return 0 end
if redis.call('HGET', K.claim, 'state') ~= 'claimed' then return 0 end
redis.call('HSET', K.claim, 'state', 'solving')
redis.call('PEXPIRE', K.claim, A.ttl_ms)
return 1
