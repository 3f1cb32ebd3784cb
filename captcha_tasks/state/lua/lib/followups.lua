-- followups: what runs when a solve ends (state/followups.py): K.followup (string with a
-- TTL: the solve's follow-up), K.followups_owed (hash: solve id -> follow-up),
-- K.followups_due (zset: solve id -> when it counts as lost, ms).
--@include lib/now.lua
local followups = {}

-- Take the ending solve's follow-up (false when it has none); it is owed until done.
function followups.take(id, grace_ms)
  local followup = redis.call('GET', K.followup)
  if not followup then return false end
  redis.call('DEL', K.followup)
  redis.call('HSET', K.followups_owed, id, followup)
  redis.call('ZADD', K.followups_due, now + grace_ms, id)
  return followup
end
