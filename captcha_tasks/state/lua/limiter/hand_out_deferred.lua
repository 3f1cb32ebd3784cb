-- Hand out the provider's deferred submits whose time came, as many as its in.php budget
-- lets go now (each request counted here: 'prepaid', not counted again at its admission);
-- housekeeping's step 3 of 3 at a provider (after hand_out).  A deferred submit holds no
-- slot when it waited for a budget: it takes one when its message comes, waiting its turn
-- in its lane like any other.
-- A.most = most handed out, A.grace_ms = ms their messages may take to start, A.lease_ms =
--   a lease's length, A.budgets = the budget table R (lib/rates.lua)
-- returns {given, {}}: the submits handed out (owed a message)
local K = {
  -- the provider's deferred submits, those handed out with their request counted, and
  -- the slot a backing-off one keeps
  deferred = KEYS[1],
  prepaid = KEYS[2],
  slots = KEYS[3],
  -- the provider's request budgets (lib/rates.lua)
  rate_in = KEYS[4],
  rate_hourly = KEYS[5],
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[6],
  dispatch = KEYS[7],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/rates.lua
local given = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.deferred, '-inf', now, 'LIMIT', 0, A.most)) do
  local _, job = owed.job(id)
  if job then
    if rates.submit(A.budgets, 'pre:' .. id) > 0 then break end
    redis.call('ZREM', K.deferred, id)
    redis.call('SADD', K.prepaid, id)
    owed.due(id, now + A.grace_ms)
    redis.call('ZADD', K.slots, 'XX', now + A.lease_ms, id)
    table.insert(given, id)
    table.insert(given, job)
  else
    redis.call('ZREM', K.deferred, id)
  end
end
return {given, {}}
