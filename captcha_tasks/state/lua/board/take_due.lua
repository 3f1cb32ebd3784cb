-- Start a poll round: take the captchas that are due, or due within A.ahead_ms.
-- A.round_at = this round's due time (absent for an extra round), A.most = most captchas,
-- A.hold_ms = ms the taken captchas stay out of other rounds (longer than a round lasts),
-- A.ahead_ms = ms ahead of now a captcha due is taken too
-- returns {id, job, state, id, job, state, ...}
local K = {
  -- the provider's board (lib/board.lua)
  board = KEYS[1],
  due = KEYS[2],
  poll_state = KEYS[3],
  round = KEYS[4],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
if A.round_at and tonumber(redis.call('GET', K.round) or '') == A.round_at then
  redis.call('DEL', K.round)
end
local out = {}
local due = redis.call('ZRANGEBYSCORE', K.due, '-inf', now + A.ahead_ms, 'LIMIT', 0, A.most)
for _, id in ipairs(due) do
  local job = redis.call('HGET', K.board, id)
  if job then
    redis.call('ZADD', K.due, now + A.hold_ms, id)
    table.insert(out, id)
    table.insert(out, job)
    table.insert(out, redis.call('HGET', K.poll_state, id) or '')
  else
    redis.call('ZREM', K.due, id)
  end
end
return out
