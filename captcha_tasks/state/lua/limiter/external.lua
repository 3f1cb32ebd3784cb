-- The provider's view of threads: those it counts working beyond the slots we hold belong
-- to another client of the key.  They take slots of their own ('external:1..N', expiring
-- with the view), so every admission and handout leaves them alone.
-- A.working = the provider's working threads, A.hold_ms = ms the view holds, A.most =
--   most threads to give up (the rest stays usable, to find out when they free),
--   A.held_before = the slots we held before the provider was asked (absent: count every
--   slot of ours; present, only those held both then and now count as ours: a slot taken
--   meanwhile may not have reached the provider when it counted)
-- returns {external before, external now, slots we hold}
local K = {
  -- threads another client holds (string with a TTL)
  external = KEYS[1],
  -- the provider's slots (lib/slots.lua: expired leases are reclaimed first)
  slots = KEYS[2],
  owners = KEYS[3],
  counts = KEYS[4],
}
local A = cjson.decode(ARGV[1])
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/slots.lua
local before = tonumber(redis.call('GET', K.external) or '0')
for i = 1, before do redis.call('ZREM', K.slots, 'external:' .. i) end
slots.reclaim()
local ours = redis.call('ZCARD', K.slots)
if A.held_before then
  local before_set = {}
  for _, member in ipairs(A.held_before) do before_set[member] = true end
  ours = 0
  for _, member in ipairs(redis.call('ZRANGE', K.slots, 0, -1)) do
    if before_set[member] then ours = ours + 1 end
  end
end
local other = math.max(0, math.min(A.working - ours, A.most))
for i = 1, other do redis.call('ZADD', K.slots, now + A.hold_ms, 'external:' .. i) end
if other > 0 then
  redis.call('SET', K.external, other, 'PX', A.hold_ms)
else
  redis.call('DEL', K.external)
end
return {before, other, ours}
