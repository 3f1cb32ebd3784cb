-- record: a solve's record (state/records.py).  K.record (hash: attempt, captcha_id,
-- provider, done, charged = the last attempt counted against its tenant's budget, and the
-- marks one step of a chain leaves for the next: admit, tally), its submit claim (K.claim:
-- string with a TTL, the id of the message holding it) and its revocation (K.revoked:
-- string with a TTL).
local record = {}

-- Seconds a record lives before anything was submitted for it.
record.UNSUBMITTED_TTL_S = 86400

-- True when the solve is over, or this attempt (or a later one) was submitted already.
function record.passed(attempt)
  local found = redis.call('HMGET', K.record, 'done', 'attempt')
  if found[1] then return true end
  return found[2] ~= false and tonumber(found[2]) >= attempt
end

-- The attempt's captcha is at the provider: remember it, and give the claim back.
function record.submitted(attempt, captcha_id, provider, ttl_s)
  redis.call('HSET', K.record, 'attempt', attempt, 'captcha_id', captcha_id, 'provider', provider)
  redis.call('EXPIRE', K.record, ttl_s)
  redis.call('DEL', K.claim)
end

-- A record nothing submitted yet lives a day at most.
function record.keep()
  if redis.call('TTL', K.record) < 0 then
    redis.call('EXPIRE', K.record, record.UNSUBMITTED_TTL_S)
  end
end

-- True when this attempt (or a later one) was counted against its tenant's budget.
function record.charged(attempt)
  local charged = redis.call('HGET', K.record, 'charged')
  return charged ~= false and tonumber(charged) >= attempt
end

-- The attempt's captcha is about to be paid for: it is counted.
function record.charge(attempt)
  redis.call('HSET', K.record, 'charged', attempt)
  record.keep()
end

function record.revoked()
  return redis.call('EXISTS', K.revoked) == 1
end

-- End the solve, once: false when it had ended already.
function record.close(ttl_s)
  if redis.call('HSETNX', K.record, 'done', '1') == 0 then return false end
  redis.call('EXPIRE', K.record, ttl_s)
  redis.call('DEL', K.claim)
  return true
end

-- Leave the mark of one step of a chain for the next (field: which chain).
function record.mark(field, value)
  redis.call('HSET', K.record, field, value)
  record.keep()
end

-- The mark a step left (nil: none).
function record.marked(field)
  return redis.call('HGET', K.record, field) or nil
end

-- Take the mark a step left: its value, once (nil: none).
function record.unmark(field)
  local value = redis.call('HGET', K.record, field)
  if not value then return nil end
  redis.call('HDEL', K.record, field)
  return value
end
