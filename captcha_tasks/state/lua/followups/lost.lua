-- Follow-ups owed past their grace (the process that should have run them died): each is
-- handed out again, owed for another grace.
-- A.most, A.grace_ms
-- returns {id, follow-up, id, follow-up, ...}
local K = {
  -- follow-ups owed until they have run (lib/followups.lua)
  followups_owed = KEYS[1],
  followups_due = KEYS[2],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
local out = {}
local ids = redis.call('ZRANGEBYSCORE', K.followups_due, '-inf', now, 'LIMIT', 0, A.most)
for _, id in ipairs(ids) do
  local followup = redis.call('HGET', K.followups_owed, id)
  if followup then
    redis.call('ZADD', K.followups_due, now + A.grace_ms, id)
    table.insert(out, id)
    table.insert(out, followup)
  else
    redis.call('ZREM', K.followups_due, id)
  end
end
return out
