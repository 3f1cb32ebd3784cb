-- Claim a task for a solve, or say who has it.
-- A.celery_id = Celery task id to claim it with, A.ttl_ms = TTL of a claim that is not
--   done, A.give_up_on = Celery id the caller gave up waiting for (absent if none): taken
--   over only if it is still the claim's and its grace has passed, A.grace_ms = grace of
--   an undispatched claim, A.solving_grace_ms = grace of a dispatched one
-- returns {'new' | 'takeover', A.celery_id, 0}, {'done', result, dead letter or ''},
--         or {'claimed' | 'solving', the claim's Celery id, ms until it may be taken over}
local K = {
  -- hash with a TTL: one task's claim (state, celery_id, claimed_at ms, result,
  -- dead_letter)
  claim = KEYS[1],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local claim = redis.call('HMGET', K.claim, 'state', 'celery_id', 'claimed_at', 'result',
                         'dead_letter')
local state = claim[1]
if state == 'done' then return {'done', claim[4], claim[5] or ''} end
local status = 'new'
if state then
  local grace = A.grace_ms
  if state == 'solving' then grace = A.solving_grace_ms end
  local left = tonumber(claim[3]) + grace - now
  if claim[2] ~= A.give_up_on or left > 0 then
    return {state, claim[2], math.max(0, left)}
  end
  status = 'takeover'
end
redis.call('DEL', K.claim)
redis.call('HSET', K.claim, 'state', 'claimed', 'celery_id', A.celery_id, 'claimed_at', now)
redis.call('PEXPIRE', K.claim, A.ttl_ms)
return {status, A.celery_id, 0}
