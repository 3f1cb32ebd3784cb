-- Make sure a round message is pending while captchas are on the board.
-- A.gap_ms = least ms between rounds, A.grace_ms = ms a round may be late
-- returns {countdown ms, due ms} of a round message the caller must publish, or {-1}
local K = {
  -- the provider's board (lib/board.lua)
  due = KEYS[1],
  round = KEYS[2],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/board.lua
return board.schedule_first(A.gap_ms, A.grace_ms)
