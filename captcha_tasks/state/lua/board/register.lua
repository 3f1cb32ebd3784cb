-- A captcha is at the provider: put it on the board and schedule its first poll; take the
-- callback that came for it before this (an early one).
-- A.cid = captcha id, A.job (JSON), A.lease = lease id, A.lease_ms = a lease's length,
-- A.first_ms = ms until the first poll (the lease outlives it), A.attempt, A.provider,
-- A.ticket (its early callback's, lib/early.lua), A.early_ms = ms until the first poll of
--   a captcha whose early callback is handed to the caller (should it die before applying
--   it, a poll reads the answer the provider has), A.record_ttl_s, A.gap_ms = least ms
--   between rounds, A.grace_ms = ms a round may be late,
-- A.submitted_record = what the caller's result key says while the captcha is at the
--   provider (absent: nothing), A.result_ttl_s
-- returns {{countdown ms, due ms} of a round message the caller must publish, or {-1};
--   the early callback's code, or false}; {{-1}, false} when this attempt's captcha is
--   registered already (a registration made again because no replica had acknowledged it
--   may find the first one landed: the board, its lease and its record stay as they are)
local K = {
  -- the provider's board (lib/board.lua)
  board = KEYS[1],
  due = KEYS[2],
  round = KEYS[3],
  -- the lease, renewed past the first poll (lib/slots.lua)
  slots = KEYS[4],
  -- the solve's record and claim (lib/record.lua)
  record = KEYS[5],
  claim = KEYS[6],
  -- callbacks that came before their captcha (lib/early.lua)
  early = KEYS[7],
  early_due = KEYS[8],
  -- the caller's result key (opaque here)
  result = KEYS[9],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/board.lua
--@include lib/slots.lua
--@include lib/record.lua
--@include lib/early.lua
local had = redis.call('HMGET', K.record, 'attempt', 'captcha_id')
if had[2] == A.cid and tonumber(had[1]) == A.attempt then return {{-1}, false} end
local found = early.take(A.ticket, A.cid)
local first_ms = A.first_ms
if found then first_ms = math.min(first_ms, A.early_ms) end
local due = now + first_ms
redis.call('HSET', K.board, A.cid, A.job)
redis.call('ZADD', K.due, due, A.cid)
slots.renew({lease_ms = A.lease_ms}, A.lease, first_ms)
local ended = redis.call('HEXISTS', K.record, 'done') == 1
record.submitted(A.attempt, A.cid, A.provider, A.record_ttl_s)
if A.submitted_record and not ended then
  redis.call('SET', K.result, A.submitted_record, 'EX', A.result_ttl_s)
  redis.call('PUBLISH', K.result, A.submitted_record)
end
return {board.schedule(due, A.gap_ms, A.grace_ms), found}
