-- End a poll round: put the unfinished captchas back (renewing their leases), and
-- schedule the next round.
-- A.lease_ms = a lease's length, A.gap_ms = least ms until the next round, A.grace_ms
-- (rounds), A.polled_ms = when they were polled (ms, the polling host's clock),
-- A.again = [[captcha id, lease id, ms until its next poll, transport errors, polls so
-- far, its last poll (ms; -1: A.polled_ms, -2: never)], ...]
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
local K = {
  -- the provider's board (lib/board.lua)
  board = KEYS[1],
  due = KEYS[2],
  poll_state = KEYS[3],
  round = KEYS[4],
  -- the leases, renewed (lib/slots.lua)
  slots = KEYS[5],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/board.lua
--@include lib/slots.lua
local H = {lease_ms = A.lease_ms}
for _, item in ipairs(A.again) do
  local id = item[1]
  if redis.call('HEXISTS', K.board, id) == 1 then
    redis.call('ZADD', K.due, now + item[3], id)
    local polled = item[6]
    if polled == -1 then polled = A.polled_ms elseif polled == -2 then polled = '' end
    redis.call('HSET', K.poll_state, id, polled .. '|' .. item[4] .. '|' .. item[5])
    slots.renew(H, item[2], 0)
  end
end
return board.schedule_first(A.gap_ms, A.grace_ms, now + A.gap_ms)
