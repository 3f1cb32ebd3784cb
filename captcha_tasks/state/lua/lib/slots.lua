-- slots: a provider's thread slots and parked submits (state/limiter.py).
-- K.slots (zset: lease id -> lease expiry ms), K.parked (zset: lease id -> arrival order),
-- K.lanes (zset by member: "<lane>|<tenant>|<arrival>|<id>" of each parked submit),
-- K.owners (hash: lease id -> "<lane>|<tenant>|<asked at ms>" while parked or held),
-- K.counts (hash: "held|<lane>|<tenant>", "parked|<lane>|<tenant>" -> n), K.fair (hash:
-- "<lane>|<tenant>" -> virtual finish tag, "<lane>" -> the lane's virtual time), K.waits
-- (hash: the wait-time histogram, see Keys.wait_times), K.deferred (zset: lease id -> when
-- it goes, ms), K.prepaid (set: deferred submits handed out with their in.php request
-- counted).  The jobs of parked and deferred submits wait in lib/owed.lua's K.waiting.
-- H (a handout table, ThreadLimiter.lua_handout): lease_ms, capacity, refill_capacity
-- (the background lane's), most (handed out at once), band, grace_ms, tenants (name ->
-- {w = weight, max = max_threads, daily = daily_captchas}).
--@include lib/now.lua
--@include lib/owed.lua
local slots = {}

-- The lanes, in the order freed slots go to them (lanes.LANES).
slots.LANES = {'interactive', 'bulk', 'background'}
-- Upper bounds (ms) of the wait-time buckets (limiter.WAIT_BUCKETS_S).
slots.WAIT_BOUNDS = {
  50, 100, 250, 500, 1000, 2000, 3000, 5000, 10000, 20000, 30000, 60000, 120000, 300000,
}

function slots.tenant(H, tenant)
  return H.tenants[tenant] or {}
end

-- The lane, tenant and asked-at time (ms) of a parked or held lease (nil: unknown).
function slots.owner(id)
  local raw = redis.call('HGET', K.owners, id)
  if not raw then return nil end
  local lane, tenant, asked = string.match(raw, '^([^|]*)|([^|]*)|(.*)$')
  return lane, tenant, tonumber(asked)
end

function slots.count(kind, lane, tenant, by)
  local name = kind .. '|' .. lane .. '|' .. tenant
  if redis.call('HINCRBY', K.counts, name, by) <= 0 then redis.call('HDEL', K.counts, name) end
end

function slots.member(lane, tenant, seq, id)
  return lane .. '|' .. tenant .. '|' .. string.format('%016d', seq) .. '|' .. id
end

-- A slot no longer held (given back, expired, or its batch cancelled).
function slots.drop(id)
  if redis.call('ZREM', K.slots, id) == 0 then return end
  local lane, tenant = slots.owner(id)
  if lane then
    slots.count('held', lane, tenant, -1)
    redis.call('HDEL', K.owners, id)
  end
end

-- Reclaim expired leases.
function slots.reclaim()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.slots, '-inf', now)) do
    slots.drop(id)
  end
end

-- The least virtual finish tag a tenant may have in a lane: one plan's worth of slots
-- behind the lane's virtual time (what it may catch up on after it had nothing parked).
function slots.floor(H, lane, tenant)
  local vtime = tonumber(redis.call('HGET', K.fair, lane) or '0')
  return vtime - H.capacity / (slots.tenant(H, tenant).w or 1), vtime
end

-- Park a submit at the end of its tenant's queue in its lane.
function slots.park(H, id, lane, tenant, asked, seq)
  asked = asked or now
  redis.call('ZADD', K.parked, seq, id)
  redis.call('ZADD', K.lanes, 0, slots.member(lane, tenant, seq, id))
  redis.call('HSET', K.owners, id, lane .. '|' .. tenant .. '|' .. asked)
  if redis.call('HINCRBY', K.counts, 'parked|' .. lane .. '|' .. tenant, 1) == 1 then
    -- back from idle: the share it did not use went to the others, and is owed back for
    -- one plan's worth of slots at most
    local name = lane .. '|' .. tenant
    local floor = slots.floor(H, lane, tenant)
    if tonumber(redis.call('HGET', K.fair, name) or '0') < floor then
      redis.call('HSET', K.fair, name, floor)
    end
  end
end

-- Take a parked submit out of its queue (no-op when it is not parked).
function slots.unpark(id)
  local seq = redis.call('ZSCORE', K.parked, id)
  if not seq then return end
  redis.call('ZREM', K.parked, id)
  local lane, tenant = slots.owner(id)
  if lane then
    redis.call('ZREM', K.lanes, slots.member(lane, tenant, tonumber(seq), id))
    slots.count('parked', lane, tenant, -1)
  end
end

-- Hold a slot for a submit; its wait from request to thread goes into the histogram.
function slots.take(H, id, lane, tenant, asked)
  asked = asked or now
  if redis.call('ZADD', K.slots, now + H.lease_ms, id) == 0 then return end
  redis.call('HSET', K.owners, id, lane .. '|' .. tenant .. '|' .. asked)
  slots.count('held', lane, tenant, 1)
  local wait = math.max(0, now - asked)
  local bucket = #slots.WAIT_BOUNDS + 1
  for i, bound in ipairs(slots.WAIT_BOUNDS) do
    if wait <= bound then bucket = i break end
  end
  local name = lane .. '|' .. tenant .. '|'
  redis.call('HINCRBY', K.waits, name .. bucket, 1)
  redis.call('HINCRBY', K.waits, name .. 'sum', wait)
  redis.call('HINCRBY', K.waits, name .. 'n', 1)
end

-- The lease leaves the provider's queues and slots (it does not wait here any more).
function slots.vacate(id)
  slots.drop(id)
  slots.unpark(id)
  redis.call('HDEL', K.owners, id)
end

-- Nothing of the solve is left at this provider (it goes to another one): its slot, its
-- place in a queue, its deferral; what it is owed (lib/owed.lua) stays.
function slots.leave(id)
  slots.vacate(id)
  redis.call('ZREM', K.deferred, id)
  redis.call('SREM', K.prepaid, id)
end

-- A solve no longer holds, waits for or is owed a slot.
function slots.release(id)
  slots.leave(id)
  owed.forget(id)
end

-- A submit waits until at (ms) in Redis, keeping the slot it may hold.
function slots.defer(H, id, deadline, job, at)
  owed.wait(id, deadline, job)
  redis.call('ZADD', K.deferred, at, id)
  redis.call('ZADD', K.slots, 'XX', at + H.lease_ms, id)
end

-- Extend a held lease to extra_ms past its usual length (a lease released is never back).
function slots.renew(H, id, extra_ms)
  redis.call('ZADD', K.slots, 'XX', now + H.lease_ms + extra_ms, id)
end
