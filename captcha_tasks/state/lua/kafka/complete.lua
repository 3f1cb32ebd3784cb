-- Store the answer published for a task; the first answer stored is the one kept.
-- A.result = result JSON, A.dead_letter = dead letter JSON or '', A.ttl_ms
-- returns {1, result, dead letter} when stored, {0, the kept result, its dead letter}
-- when another answer was stored first
local K = {
  -- hash with a TTL: one task's claim (state, celery_id, claimed_at ms, result,
  -- dead_letter)
  claim = KEYS[1],
}
local A = cjson.decode(ARGV[1])
if redis.call('HGET', K.claim, 'state') == 'done' then
  local kept = redis.call('HMGET', K.claim, 'result', 'dead_letter')
  return {0, kept[1], kept[2] or ''}
end
redis.call('HSET', K.claim, 'state', 'done', 'result', A.result, 'dead_letter', A.dead_letter)
redis.call('PEXPIRE', K.claim, A.ttl_ms)
return {1, A.result, A.dead_letter}
