-- The provider is out of rotation: hand out its parked and deferred submits (owed a
-- message, holding nothing here) so that they go elsewhere.
-- A.most = most handed out, A.grace_ms = ms their messages may take to start
-- returns a flat list of lease id, job
local K = {
  -- the provider's slots and queues (lib/slots.lua): what a submit leaves here
  slots = KEYS[1],
  parked = KEYS[2],
  lanes = KEYS[3],
  owners = KEYS[4],
  counts = KEYS[5],
  deferred = KEYS[6],
  prepaid = KEYS[7],
  -- the deployment's waiting jobs and owed messages (lib/owed.lua)
  waiting = KEYS[8],
  dispatch = KEYS[9],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/slots.lua
local out = {}
for _, set in ipairs({K.parked, K.deferred}) do
  for _, id in ipairs(redis.call('ZRANGE', set, 0, A.most - 1)) do
    slots.leave(id)
    local _, job = owed.job(id)
    if job then
      owed.due(id, now + A.grace_ms)
      table.insert(out, id)
      table.insert(out, job)
    end
  end
end
return out
