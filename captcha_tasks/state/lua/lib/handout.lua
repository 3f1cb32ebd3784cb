-- handout: who gets a freed slot next (state/limiter.py).  Lanes in order; within a lane,
-- the tenants take turns by weighted fair queueing (the smallest virtual finish tag in
-- K.fair goes next); first in, first out within a tenant (K.lanes).  H: see lib/slots.lua.
--@include lib/now.lua
--@include lib/owed.lua
--@include lib/budget.lua
--@include lib/slots.lua
local handout = {}

-- The first parked submit of a tenant in a lane: member, lease id (nil: none).
function handout.head(lane, tenant)
  local prefix = lane .. '|' .. tenant
  local first = redis.call('ZRANGEBYLEX', K.lanes, '[' .. prefix .. '|', '(' .. prefix .. '}',
    'LIMIT', 0, 1)
  if not first[1] then return nil end
  return first[1], string.match(first[1], '|([^|]*)$')
end

-- Slots a tenant holds in every lane, by the counts read.
function handout.held(counts, tenant)
  local n = 0
  for _, lane in ipairs(slots.LANES) do n = n + (counts['held|' .. lane .. '|' .. tenant] or 0) end
  return n
end

-- What to hand out next: {member, id, lane, tenant, kind} where kind is 'slot', 'late'
-- (deadline passed or budget spent: handed on without a slot) or 'lost' (no job:
-- dropped); nil when nothing may go now.  Lanes in order; within a lane, the smallest tag.
function handout.pick(H, counts, used)
  for _, lane in ipairs(slots.LANES) do
    local limit = H.capacity
    if lane == 'background' then limit = H.refill_capacity end
    local best, best_tag
    for name, n in pairs(counts) do
      local tenant = string.match(name, '^parked|' .. lane .. '|(.+)$')
      if tenant and n > 0 then
        local member, id = handout.head(lane, tenant)
        if member then
          local t = slots.tenant(H, tenant)
          local deadline = owed.job(id)
          if not deadline then return {member, id, lane, tenant, 'lost'} end
          if deadline <= now or budget.spent(tenant, t.daily) then
            return {member, id, lane, tenant, 'late'}
          end
          if used < limit and (not t.max or handout.held(counts, tenant) < t.max) then
            local tag = tonumber(redis.call('HGET', K.fair, lane .. '|' .. tenant) or '0')
            if not best or tag < best_tag or (tag == best_tag and tenant < best[4]) then
              best, best_tag = {member, id, lane, tenant, 'slot'}, tag
            end
          end
        end
      end
    end
    if best then return best end
  end
  return nil
end

-- The tenant was handed a slot in the lane: its tag moves on by 1 / weight, and the
-- lane's virtual time to the tag served (it never goes back).
function handout.served(H, lane, tenant)
  local name = lane .. '|' .. tenant
  local tag = tonumber(redis.call('HGET', K.fair, name) or '0')
  local floor, vtime = slots.floor(H, lane, tenant)
  if tag < floor then tag = floor end
  if tag > vtime then redis.call('HSET', K.fair, lane, tag) end
  redis.call('HSET', K.fair, name, tag + 1 / (slots.tenant(H, tenant).w or 1))
end

-- Hand free slots to parked submits (expired leases reclaimed first).
-- Returns {given, expired}: flat lists of lease id, job; all owed a submit message.
function handout.run(H)
  slots.reclaim()
  local used = redis.call('ZCARD', K.slots)
  local counts = {}
  local flat = redis.call('HGETALL', K.counts)
  for i = 1, #flat, 2 do counts[flat[i]] = tonumber(flat[i + 1]) end
  local given, expired = {}, {}
  local budget_left = H.most
  while budget_left > 0 do
    local pick = handout.pick(H, counts, used)
    if not pick then break end
    local member, id, lane, tenant, kind = pick[1], pick[2], pick[3], pick[4], pick[5]
    local _, _, asked = slots.owner(id)
    redis.call('ZREM', K.lanes, member)
    redis.call('ZREM', K.parked, id)
    slots.count('parked', lane, tenant, -1)
    local parked = 'parked|' .. lane .. '|' .. tenant
    counts[parked] = (counts[parked] or 1) - 1
    if kind == 'lost' then
      redis.call('HDEL', K.owners, id)
    else
      local _, job = owed.job(id)
      owed.due(id, now + H.grace_ms)
      if kind == 'late' then
        redis.call('HDEL', K.owners, id)
        table.insert(expired, id)
        table.insert(expired, job)
      else
        slots.take(H, id, lane, tenant, asked)
        handout.served(H, lane, tenant)
        local held = 'held|' .. lane .. '|' .. tenant
        counts[held] = (counts[held] or 0) + 1
        used = used + 1
        table.insert(given, id)
        table.insert(given, job)
      end
      budget_left = budget_left - 1
    end
  end
  return {given, expired}
end
