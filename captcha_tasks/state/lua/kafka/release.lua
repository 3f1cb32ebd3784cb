-- Drop a claim whose dispatch failed, so a redelivery dispatches at once.
-- A.celery_id
-- returns 1 when dropped, 0 when the claim is no longer this Celery id's undispatched one
local K = {
  -- hash with a TTL: one task's claim (state, celery_id, claimed_at ms, result,
  -- dead_letter)
  claim = KEYS[1],
}
local A = cjson.decode(ARGV[1])
if redis.call('HGET', K.claim, 'celery_id') ~= A.celery_id then return 0 end
if redis.call('HGET', K.claim, 'state') ~= 'claimed' then return 0 end
return redis.call('DEL', K.claim)
