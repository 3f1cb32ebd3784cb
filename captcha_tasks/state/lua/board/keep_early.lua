-- A callback for a captcha not on the board: keep it until the captcha is registered.
-- A.cid = captcha id, A.attempt and A.ticket (lib/early.lua) of the ticket, A.code,
-- A.keep_ms = how long it is kept, A.most = how many are kept at most
-- returns 'registered' (on the board now: judge it again), 'passed' (the ticket's attempt
--   is registered, as another captcha, or its solve is over), or early.keep's 'kept',
--   'again' or 'full'
local K = {
  -- the provider's board (lib/board.lua)
  board = KEYS[1],
  -- the ticket's solve's record (lib/record.lua)
  record = KEYS[2],
  -- callbacks that came before their captcha (lib/early.lua)
  early = KEYS[3],
  early_due = KEYS[4],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/record.lua
--@include lib/early.lua
if redis.call('HEXISTS', K.board, A.cid) == 1 then return 'registered' end
if record.passed(A.attempt) then return 'passed' end
return early.keep(A.ticket, A.cid, A.code, A.keep_ms, A.most)
