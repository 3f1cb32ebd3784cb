-- The provider is out of rotation and its captchas will not be answered: make every one
-- due now (the round that takes them submits each elsewhere) and schedule a round.
-- A.most = most captchas moved, A.gap_ms, A.grace_ms (rounds)
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
local K = {
  -- the provider's board (lib/board.lua)
  due = KEYS[1],
  round = KEYS[2],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/board.lua
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.due, '(' .. now, '+inf', 'LIMIT', 0, A.most)) do
  redis.call('ZADD', K.due, now, id)
end
return board.schedule_first(A.gap_ms, A.grace_ms)
