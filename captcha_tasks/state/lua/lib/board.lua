-- board: the captchas at a provider and their polls (state/board.py): K.board (hash:
-- captcha id -> job JSON), K.due (zset: captcha id -> when it is polled next, ms),
-- K.poll_state (hash: captcha id -> "<polled ms>|<errors>|<polls>"), K.round (string:
-- when the pending round message is due, ms).
--@include lib/now.lua
local board = {}

-- Make sure a round message is due by at (ms); returns {countdown ms, at} of a round
-- message to publish, or {-1} when one is pending in time.
function board.schedule(at, gap_ms, grace_ms)
  if at < now then at = now end
  local pending = tonumber(redis.call('GET', K.round) or '')
  if pending and pending <= at + gap_ms then return {-1} end
  redis.call('SET', K.round, at, 'PX', at - now + grace_ms)
  return {at - now, at}
end

-- Schedule the round the first due captcha needs (no captcha: none).
function board.schedule_first(gap_ms, grace_ms, least)
  local first = redis.call('ZRANGE', K.due, 0, 0, 'WITHSCORES')
  if not first[1] then return {-1} end
  return board.schedule(math.max(tonumber(first[2]), least or 0), gap_ms, grace_ms)
end

-- Take a captcha off the board: false when it was not on it.
function board.take(cid)
  if redis.call('HDEL', K.board, cid) == 0 then return false end
  redis.call('ZREM', K.due, cid)
  redis.call('HDEL', K.poll_state, cid)
  return true
end
