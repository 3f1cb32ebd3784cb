-- owed: messages Redis is owed, deployment-wide, whatever the provider (state/owed.py).
-- A submit waiting in Redis (parked, deferred, or handed out and owed its submit message)
-- keeps its job in K.waiting (hash: lease id -> "<deadline ms>|<job JSON>"); one owed a
-- message is in K.dispatch too (zset: lease id -> when that message counts as lost, ms).
-- A solve message on its way is in K.requested (zset: solve id -> when it counts as lost,
-- ms) with its keyword arguments in K.requested_messages (hash: solve id -> JSON).
local owed = {}

-- Keep the job of a submit that waits in Redis.
function owed.keep(id, deadline, job)
  redis.call('HSET', K.waiting, id, tostring(deadline) .. '|' .. job)
end

-- The deadline (ms) and job of a waiting entry.
function owed.split(raw)
  local bar = string.find(raw, '|', 1, true)
  return tonumber(string.sub(raw, 1, bar - 1)), string.sub(raw, bar + 1)
end

-- The deadline (ms) and job of a waiting submit (nil: none kept).
function owed.job(id)
  local raw = redis.call('HGET', K.waiting, id)
  if not raw then return nil end
  return owed.split(raw)
end

-- Keep the job of a submit that waits in Redis for its time, owed no message meanwhile.
function owed.wait(id, deadline, job)
  owed.keep(id, deadline, job)
  redis.call('ZREM', K.dispatch, id)
end

-- A waiting submit is owed its message: lost unless it starts by due (ms).
function owed.due(id, due)
  redis.call('ZADD', K.dispatch, due, id)
end

-- A submit is owed a message: it keeps its job until that message starts.
function owed.owe(id, deadline, job, due)
  owed.keep(id, deadline, job)
  owed.due(id, due)
end

-- The submit's message started (or its solve ended): nothing of it waits any more.
function owed.forget(id)
  redis.call('ZREM', K.dispatch, id)
  redis.call('HDEL', K.waiting, id)
end

-- The solve's message started (or the solve ended): it is owed no more.
function owed.started(id)
  redis.call('ZREM', K.requested, id)
  redis.call('HDEL', K.requested_messages, id)
end
