-- A captcha failed but its solve goes on with a new one: take it off the board; the solve
-- keeps its slot and is owed a submit message for its next attempt.
-- A.cid = captcha id, A.lease = lease id, A.job = the next attempt's job (JSON),
-- A.deadline_ms = ms until the solve's deadline, A.lease_ms = a lease's length,
-- A.grace_ms = ms its message may take to start, A.code = the error, A.reason = why a new
-- captcha is submitted
-- returns 1 when retired, 0 when the captcha was no longer on the board
local K = {
  -- the provider's board (lib/board.lua)
  board = KEYS[1],
  due = KEYS[2],
  poll_state = KEYS[3],
  -- the lease, renewed (lib/slots.lua)
  slots = KEYS[4],
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[5],
  dispatch = KEYS[6],
  -- the provider's API errors by code (lib/stats.lua), and new captchas by reason (hash)
  api_errors = KEYS[7],
  resubmits = KEYS[8],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/board.lua
--@include lib/slots.lua
--@include lib/stats.lua
if not board.take(A.cid) then return 0 end
slots.renew({lease_ms = A.lease_ms}, A.lease, 0)
owed.owe(A.lease, now + A.deadline_ms, A.job, now + A.grace_ms)
stats.error(A.code)
redis.call('HINCRBY', K.resubmits, A.reason, 1)
return 1
