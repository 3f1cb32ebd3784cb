-- early: callbacks that came before their captcha was registered (state/channel.py):
-- K.early (hash: ticket -> JSON {cid, code}), K.early_due (zset: ticket -> when it is
-- forgotten, ms).
--@include lib/now.lua
local early = {}

function early.forget(ticket)
  redis.call('HDEL', K.early, ticket)
  redis.call('ZREM', K.early_due, ticket)
end

-- The code of the early callback of ticket when it was for captcha cid (else false); it
-- is forgotten either way.
function early.take(ticket, cid)
  local raw = redis.call('HGET', K.early, ticket)
  if not raw then return false end
  local until_ms = tonumber(redis.call('ZSCORE', K.early_due, ticket) or '0')
  early.forget(ticket)
  local kept = cjson.decode(raw)
  if until_ms < now or kept.cid ~= cid then return false end
  return kept.code
end

-- Keep a callback of ticket for captcha cid until its captcha is registered: 'kept',
-- 'again' (one is kept for the ticket already: the first word stands), or 'full'.
function early.keep(ticket, cid, code, keep_ms, most)
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', K.early_due, '-inf', now, 'LIMIT', 0, 100)) do
    early.forget(old)
  end
  if redis.call('HEXISTS', K.early, ticket) == 1 then return 'again' end
  if redis.call('ZCARD', K.early_due) >= most then return 'full' end
  redis.call('HSET', K.early, ticket, cjson.encode({cid = cid, code = code}))
  redis.call('ZADD', K.early_due, now + keep_ms, ticket)
  -- Unused, both keys go by themselves.
  redis.call('PEXPIRE', K.early, 2 * keep_ms)
  redis.call('PEXPIRE', K.early_due, 2 * keep_ms)
  return 'kept'
end
