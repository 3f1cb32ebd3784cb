-- Housekeeping at one provider, step 1 of 3 (a chain: repair, hand_out,
-- hand_out_deferred): reclaim expired leases, and make the lane queues and counts agree
-- with the slots and parked submits again.  They disagree after an upgrade from a version
-- without lanes (its parked submits join the interactive lane, its refills the background
-- one) or a bug.
-- A.band = arrival numbers at or above it are refills parked by a version without lanes
-- returns 1 when it repaired, else 0
local K = {
  -- the provider's slots and queues (lib/slots.lua)
  slots = KEYS[1],
  parked = KEYS[2],
  lanes = KEYS[3],
  owners = KEYS[4],
  counts = KEYS[5],
  -- threads another client of the key holds (string with a TTL: slots external:1..N)
  external = KEYS[6],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/slots.lua
slots.reclaim()
local flat = redis.call('HGETALL', K.counts)
local held, parked = 0, 0
for i = 1, #flat, 2 do
  if string.sub(flat[i], 1, 5) == 'held|' then
    held = held + tonumber(flat[i + 1])
  else
    parked = parked + tonumber(flat[i + 1])
  end
end
local external = tonumber(redis.call('GET', K.external) or '0')
local parked_n, slots_n = redis.call('ZCARD', K.parked), redis.call('ZCARD', K.slots)
local queued_ok = parked == parked_n and parked == redis.call('ZCARD', K.lanes)
local held_ok = held == slots_n - external
local owners_ok = redis.call('HLEN', K.owners) <= parked_n + slots_n
if queued_ok and held_ok and owners_ok then return 0 end
for i = 1, #flat, 2 do redis.call('HDEL', K.counts, flat[i]) end
redis.call('DEL', K.lanes)
local known = {}
local function adopt(id, lane)
  local found_lane, tenant = slots.owner(id)
  if found_lane then return found_lane, tenant end
  redis.call('HSET', K.owners, id, lane .. '|default|' .. now)
  return lane, 'default'
end
local all = redis.call('ZRANGE', K.parked, 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local id, seq = all[i], tonumber(all[i + 1])
  local lane = 'interactive'
  if seq >= A.band then lane = 'background' end
  local tenant
  lane, tenant = adopt(id, lane)
  redis.call('ZADD', K.lanes, 0, slots.member(lane, tenant, seq, id))
  slots.count('parked', lane, tenant, 1)
  known[id] = true
end
for _, id in ipairs(redis.call('ZRANGE', K.slots, 0, -1)) do
  if string.sub(id, 1, 9) ~= 'external:' then
    local lane, tenant = adopt(id, 'interactive')
    slots.count('held', lane, tenant, 1)
    known[id] = true
  end
end
for _, id in ipairs(redis.call('HKEYS', K.owners)) do
  if not known[id] then redis.call('HDEL', K.owners, id) end
end
return 1
