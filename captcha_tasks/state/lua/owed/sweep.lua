-- Housekeeping, once per tick for the whole deployment: hand out again the submits whose
-- message was lost and the solve messages that never started, at every provider alike
-- (what they are owed is the deployment's).  The process that wins the tick's lock also
-- runs each provider's housekeeping (limiter/repair, hand_out, hand_out_deferred).
-- A.lock_ms (the tick), A.most = most lost messages of each kind handed out again,
--   A.grace_ms = ms an owed submit message may take to start, A.message_grace_ms = ms a
--   solve message may wait before it counts as lost
-- returns {0} when another process swept this tick, else {1, lost, unstarted}: flat lists
--   of lease id, job (unstarted: solve id, solve message)
local K = {
  -- one sweep per tick (string with a PX)
  lock = KEYS[1],
  -- what the deployment is owed (lib/owed.lua)
  waiting = KEYS[2],
  dispatch = KEYS[3],
  requested = KEYS[4],
  requested_messages = KEYS[5],
  -- the broker's queues of those messages (lists; "" for one not known): while one is
  -- backed up, its messages may only be waiting their turn
  submit_queue = KEYS[6],
  solve_queues = {KEYS[7], KEYS[8], KEYS[9]},
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
if not redis.call('SET', K.lock, '1', 'NX', 'PX', A.lock_ms) then return {0} end
-- An owed submit message not started yet: while the submit queue is backed up it may only
-- be waiting its turn; once the queue is empty (or it is ten times overdue) it was lost.
local lost = {}
local due = now
if redis.call('LLEN', K.submit_queue) > 0 then due = now - 9 * A.grace_ms end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.dispatch, '-inf', due, 'LIMIT', 0, A.most)) do
  local _, job = owed.job(id)
  if job then
    owed.due(id, now + A.grace_ms)
    table.insert(lost, id)
    table.insert(lost, job)
  else
    redis.call('ZREM', K.dispatch, id)
  end
end
-- A solve message that never started: while the solve queues are backed up it may only
-- be waiting; once they are empty (or it is ten times overdue) it was lost.
local unstarted = {}
local grace = A.message_grace_ms
local horizon = now
local queued = 0
for _, queue in ipairs(K.solve_queues) do queued = queued + redis.call('LLEN', queue) end
if queued > 0 then horizon = now - 9 * grace end
local ids = redis.call('ZRANGEBYSCORE', K.requested, '-inf', horizon, 'LIMIT', 0, A.most)
for _, id in ipairs(ids) do
  local message = redis.call('HGET', K.requested_messages, id)
  if message then
    redis.call('ZADD', K.requested, now + grace, id)
    table.insert(unstarted, id)
    table.insert(unstarted, message)
  else
    redis.call('ZREM', K.requested, id)
  end
end
return {1, lost, unstarted}
