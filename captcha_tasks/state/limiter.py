"""A provider's thread limiter and request budgets, shared through Redis.

There is one :class:`ThreadLimiter` per provider (its keys scoped by the provider, see
:meth:`~captcha_tasks.keys.Keys.scoped`); what follows is about one of them.

A *slot* is one provider thread.  It belongs to a solve (its lease id is the solve's id),
is taken before ``in.php`` and given back when the solve ends.  Every lease has an expiry
on the Redis server's clock that polls renew, so a slot whose worker died comes back by
itself.

A submit that finds no free slot is *parked*: its job waits in Redis and the task ends
(no worker blocks, nothing spins).  Parked submits wait in their *lane*
(:mod:`captcha_tasks.lanes`), in one queue per tenant.  Releasing a slot hands it at once
to a parked submit: the ``interactive`` lane first, then ``bulk``, then ``background``
(pool refills), which may not take the last ``reserve`` slots.  Within a lane the tenants
with parked work take turns by weighted fair queueing: each tenant has a virtual finish
tag that grows by ``1 / weight`` per slot it is handed, and the smallest tag goes next.
An idle tenant's share goes to the others: a tenant whose work comes back (or starts
late, as the second of two batches started together) catches up on at most one plan's
worth of slots (``capacity``) before the shares hold again.  A tenant holding
``max_threads`` slots waits for one of its own to free; first in, first out within a
tenant.  A newcomer parks and takes its turn the same way, so nobody jumps a queue.

A parked submit whose deadline passed, or whose tenant spent its daily budget
(:mod:`.budgets`), is handed on without a slot (its submit fails it).  Either way a
handed-out submit is *owed a task message*: it stays in the dispatch set with its job
until that message starts, and :meth:`ThreadLimiter.sweep` hands out its job again if
the message never shows (the worker that should have published it died).  Nothing Redis
hands out exists only in one process's memory.

Each slot and parked submit has an owner (lane, tenant, when it was asked for), and the
slots held and submits parked are counted per lane and tenant (what metrics and
``captcha-tasks tenants`` show, and what ``max_threads`` is checked against), as is the
wait from request to thread.  The sweep checks those counts against the slots and parked
submits, and rebuilds them when they disagree (submits parked by a version without lanes
join the interactive lane, or the background one for refills).

A submit that must wait for a request budget (the provider's ``in.php`` window, its
NO_SLOT budget, an HTTP 429) or a back-off after an error is *deferred*: its job waits in
Redis until its time, and housekeeping hands it out then (as many as the budget lets go:
their requests are counted at the handout), with no task message in between.  One waiting
for a budget gives its slot back meanwhile (the budget, not the threads, is what it waits
for); one backing off keeps it.  A provider whose circuit is open (see :mod:`.circuits`)
admits nothing.

All of this is one Lua script per operation, so many hosts behave as one client.  The
slot release and the handout are Lua functions of this module (:data:`SLOTS`) that the
board's completion script calls too, with the keys :meth:`ThreadLimiter.lua_keys` names.
Jobs are opaque JSON strings here.  With Redis unreachable every call raises
:class:`~captcha_tasks.errors.StoreUnavailable`: the limiter fails closed and nothing is
submitted.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..core.admission import Admission, Handout, Parked
from ..core.lanes import DEFAULT_TENANT, INTERACTIVE, LANES, Tenant, check_lane, is_tenant_name
from ..errors import ValidationError
from .budgets import BUDGET, budget_keys
from .db import Db
from .lua import Lib, Script, ms, text
from .records import RECORD, record_keys

T = TypeVar("T")

#: Refills parked by a version without lanes sorted after on-demand submits by this much
#: (the sweep moves them to the background lane).
REFILL_BAND = 10**12
#: Upper bounds (s) of the wait-time buckets: from request to thread.
WAIT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
_LANES_LUA = ", ".join(f"'{lane}'" for lane in LANES)
_BOUNDS_LUA = ", ".join(str(ms(b)) for b in WAIT_BUCKETS_S)

#: Lua: the entry of a parked or owed submit (``K.waiting``: id -> "<deadline ms>|<job>").
WAITING = Lib(
    name="WAITING",
    keys=("waiting",),
    source="""
local function waiting_put(K, id, deadline, job)
  redis.call('HSET', K.waiting, id, tostring(deadline) .. '|' .. job)
end
-- The deadline (ms) and job of an entry.
local function waiting_split(raw)
  local bar = string.find(raw, '|', 1, true)
  return tonumber(string.sub(raw, 1, bar - 1)), string.sub(raw, bar + 1)
end
""",
)

#: Lua: slots, parked submits and the submits owed a message.
#: K.slots (zset: lease id -> lease expiry ms), K.parked (zset: lease id -> arrival order),
#: K.lanes (zset by member: "<lane>|<tenant>|<arrival>|<id>" of each parked submit),
#: K.owners (hash: lease id -> "<lane>|<tenant>|<asked at ms>" while parked or held),
#: K.counts (hash: "held|<lane>|<tenant>", "parked|<lane>|<tenant>" -> n), K.fair (hash:
#: "<lane>|<tenant>" -> virtual finish tag, "<lane>" -> the lane's virtual time), K.waits
#: (hash: the wait-time histogram, see Keys.wait_times), K.external (string: threads another
#: client holds), K.deferred (zset: lease id -> when it goes, ms), K.prepaid (set: deferred
#: submits handed out with their in.php request counted), K.dispatch (zset: lease id -> when
#: its owed message counts as lost, ms; the deployment's, as K.waiting).
#: H (a handout table, :meth:`ThreadLimiter.lua_handout`): lease_ms, capacity,
#: refill_capacity (the background lane's), most (handed out at once), band, grace_ms,
#: tenants (name -> {w = weight, max = max_threads, daily = daily_captchas}).
SLOTS = Lib(
    name="SLOTS",
    keys=(
        "slots",
        "parked",
        "deferred",
        "prepaid",
        "lanes",
        "owners",
        "counts",
        "fair",
        "waits",
        "external",
        "dispatch",
    ),
    needs=(WAITING, BUDGET),
    source=f"""
local LANES = {{{_LANES_LUA}}}
local WAIT_BOUNDS = {{{_BOUNDS_LUA}}}
local function slot_tenant(H, tenant)
  return H.tenants[tenant] or {{}}
end
-- The lane, tenant and asked-at time (ms) of a parked or held lease (nil: unknown).
local function slot_owner(K, id)
  local raw = redis.call('HGET', K.owners, id)
  if not raw then return nil end
  local lane, tenant, asked = string.match(raw, '^([^|]*)|([^|]*)|(.*)$')
  return lane, tenant, tonumber(asked)
end
local function slot_count(K, kind, lane, tenant, by)
  local name = kind .. '|' .. lane .. '|' .. tenant
  if redis.call('HINCRBY', K.counts, name, by) <= 0 then redis.call('HDEL', K.counts, name) end
end
local function slot_member(lane, tenant, seq, id)
  return lane .. '|' .. tenant .. '|' .. string.format('%016d', seq) .. '|' .. id
end
-- A slot no longer held (given back, expired, or its batch cancelled).
local function slot_drop(K, id)
  if redis.call('ZREM', K.slots, id) == 0 then return end
  local lane, tenant = slot_owner(K, id)
  if lane then
    slot_count(K, 'held', lane, tenant, -1)
    redis.call('HDEL', K.owners, id)
  end
end
-- Reclaim expired leases.
local function slot_reclaim(K)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.slots, '-inf', now)) do
    slot_drop(K, id)
  end
end
-- The least virtual finish tag a tenant may have in a lane: one plan's worth of slots
-- behind the lane's virtual time (what it may catch up on after it had nothing parked).
local function slot_floor(K, H, lane, tenant)
  local vtime = tonumber(redis.call('HGET', K.fair, lane) or '0')
  return vtime - H.capacity / (slot_tenant(H, tenant).w or 1), vtime
end
-- Park a submit at the end of its tenant's queue in its lane.
local function slot_park(K, H, id, lane, tenant, asked, seq)
  asked = asked or now
  redis.call('ZADD', K.parked, seq, id)
  redis.call('ZADD', K.lanes, 0, slot_member(lane, tenant, seq, id))
  redis.call('HSET', K.owners, id, lane .. '|' .. tenant .. '|' .. asked)
  if redis.call('HINCRBY', K.counts, 'parked|' .. lane .. '|' .. tenant, 1) == 1 then
    -- back from idle: the share it did not use went to the others, and is owed back for
    -- one plan's worth of slots at most
    local name = lane .. '|' .. tenant
    local floor = slot_floor(K, H, lane, tenant)
    if tonumber(redis.call('HGET', K.fair, name) or '0') < floor then
      redis.call('HSET', K.fair, name, floor)
    end
  end
end
-- Take a parked submit out of its queue (no-op when it is not parked).
local function slot_unpark(K, id)
  local seq = redis.call('ZSCORE', K.parked, id)
  if not seq then return end
  redis.call('ZREM', K.parked, id)
  local lane, tenant = slot_owner(K, id)
  if lane then
    redis.call('ZREM', K.lanes, slot_member(lane, tenant, tonumber(seq), id))
    slot_count(K, 'parked', lane, tenant, -1)
  end
end
-- Hold a slot for a submit; its wait from request to thread goes into the histogram.
local function slot_take(K, H, id, lane, tenant, asked)
  asked = asked or now
  if redis.call('ZADD', K.slots, now + H.lease_ms, id) == 0 then return end
  redis.call('HSET', K.owners, id, lane .. '|' .. tenant .. '|' .. asked)
  slot_count(K, 'held', lane, tenant, 1)
  local wait = math.max(0, now - asked)
  local bucket = #WAIT_BOUNDS + 1
  for i, bound in ipairs(WAIT_BOUNDS) do
    if wait <= bound then bucket = i break end
  end
  local name = lane .. '|' .. tenant .. '|'
  redis.call('HINCRBY', K.waits, name .. bucket, 1)
  redis.call('HINCRBY', K.waits, name .. 'sum', wait)
  redis.call('HINCRBY', K.waits, name .. 'n', 1)
end
-- A solve no longer holds, waits for or is owed a slot.
local function slot_release(K, id)
  slot_drop(K, id)
  slot_unpark(K, id)
  redis.call('HDEL', K.owners, id)
  redis.call('ZREM', K.deferred, id)
  redis.call('SREM', K.prepaid, id)
  redis.call('HDEL', K.waiting, id)
  redis.call('ZREM', K.dispatch, id)
end
-- Nothing of the solve is left at this provider (it goes to another one): its slot, its
-- place in a queue, its deferral; what it is owed (K.waiting, K.dispatch) stays.
local function slot_leave(K, id)
  slot_drop(K, id)
  slot_unpark(K, id)
  redis.call('HDEL', K.owners, id)
  redis.call('ZREM', K.deferred, id)
  redis.call('SREM', K.prepaid, id)
end
-- A submit waits until at (ms) in Redis, keeping the slot it may hold.
local function slot_defer(K, H, id, deadline, job, at)
  waiting_put(K, id, deadline, job)
  redis.call('ZREM', K.dispatch, id)
  redis.call('ZADD', K.deferred, at, id)
  redis.call('ZADD', K.slots, 'XX', at + H.lease_ms, id)
end
-- Extend a held lease to extra_ms past its usual length (a lease released is never back).
local function slot_renew(K, H, id, extra_ms)
  redis.call('ZADD', K.slots, 'XX', now + H.lease_ms + extra_ms, id)
end
-- A submit is owed a message: it keeps its job until that message starts.
local function slot_owe(K, id, deadline, job, due)
  waiting_put(K, id, deadline, job)
  redis.call('ZADD', K.dispatch, due, id)
end
-- The first parked submit of a tenant in a lane: member, lease id (nil: none).
local function slot_head(K, lane, tenant)
  local prefix = lane .. '|' .. tenant
  local first = redis.call('ZRANGEBYLEX', K.lanes, '[' .. prefix .. '|', '(' .. prefix .. '}}',
    'LIMIT', 0, 1)
  if not first[1] then return nil end
  return first[1], string.match(first[1], '|([^|]*)$')
end
local function slot_held(counts, tenant)
  local n = 0
  for _, lane in ipairs(LANES) do n = n + (counts['held|' .. lane .. '|' .. tenant] or 0) end
  return n
end
-- What to hand out next: {{member, id, lane, tenant, kind}} where kind is 'slot', 'late'
-- (deadline passed or budget spent: handed on without a slot) or 'lost' (no job: dropped);
-- nil when nothing may go now.  Lanes in order; within a lane, the smallest tag.
local function slot_pick(K, H, counts, used)
  for _, lane in ipairs(LANES) do
    local limit = H.capacity
    if lane == 'background' then limit = H.refill_capacity end
    local best, best_tag
    for name, n in pairs(counts) do
      local tenant = string.match(name, '^parked|' .. lane .. '|(.+)$')
      if tenant and n > 0 then
        local member, id = slot_head(K, lane, tenant)
        if member then
          local t = slot_tenant(H, tenant)
          local raw = redis.call('HGET', K.waiting, id)
          if not raw then return {{member, id, lane, tenant, 'lost'}} end
          local deadline = waiting_split(raw)
          if deadline <= now or budget_spent(K, tenant, t.daily) then
            return {{member, id, lane, tenant, 'late'}}
          end
          if used < limit and (not t.max or slot_held(counts, tenant) < t.max) then
            local tag = tonumber(redis.call('HGET', K.fair, lane .. '|' .. tenant) or '0')
            if not best or tag < best_tag or (tag == best_tag and tenant < best[4]) then
              best, best_tag = {{member, id, lane, tenant, 'slot'}}, tag
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
local function slot_served(K, H, lane, tenant)
  local name = lane .. '|' .. tenant
  local tag = tonumber(redis.call('HGET', K.fair, name) or '0')
  local floor, vtime = slot_floor(K, H, lane, tenant)
  if tag < floor then tag = floor end
  if tag > vtime then redis.call('HSET', K.fair, lane, tag) end
  redis.call('HSET', K.fair, name, tag + 1 / (slot_tenant(H, tenant).w or 1))
end
-- Hand free slots to parked submits (expired leases reclaimed first).
-- Returns {{given, expired}}: flat lists of lease id, job; all owed a submit message.
local function slot_handout(K, H)
  slot_reclaim(K)
  local used = redis.call('ZCARD', K.slots)
  local counts = {{}}
  local flat = redis.call('HGETALL', K.counts)
  for i = 1, #flat, 2 do counts[flat[i]] = tonumber(flat[i + 1]) end
  local given, expired = {{}}, {{}}
  local budget = H.most
  while budget > 0 do
    local pick = slot_pick(K, H, counts, used)
    if not pick then break end
    local member, id, lane, tenant, kind = pick[1], pick[2], pick[3], pick[4], pick[5]
    local _, _, asked = slot_owner(K, id)
    redis.call('ZREM', K.lanes, member)
    redis.call('ZREM', K.parked, id)
    slot_count(K, 'parked', lane, tenant, -1)
    local parked = 'parked|' .. lane .. '|' .. tenant
    counts[parked] = (counts[parked] or 1) - 1
    if kind == 'lost' then
      redis.call('HDEL', K.owners, id)
    else
      local _, job = waiting_split(redis.call('HGET', K.waiting, id))
      redis.call('ZADD', K.dispatch, now + H.grace_ms, id)
      if kind == 'late' then
        redis.call('HDEL', K.owners, id)
        table.insert(expired, id)
        table.insert(expired, job)
      else
        slot_take(K, H, id, lane, tenant, asked)
        slot_served(K, H, lane, tenant)
        local held = 'held|' .. lane .. '|' .. tenant
        counts[held] = (counts[held] or 0) + 1
        used = used + 1
        table.insert(given, id)
        table.insert(given, job)
      end
      budget = budget - 1
    end
  end
  return {{given, expired}}
end
-- Make the lane queues and counts agree with the slots and parked submits again; they
-- disagree after an upgrade from a version without lanes (its parked submits join the
-- interactive lane, its refills the background one) or a bug.  Returns 1 when it repaired.
local function slot_repair(K, H)
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
  local known = {{}}
  local function adopt(id, lane)
    local found_lane, tenant = slot_owner(K, id)
    if found_lane then return found_lane, tenant end
    redis.call('HSET', K.owners, id, lane .. '|default|' .. now)
    return lane, 'default'
  end
  local all = redis.call('ZRANGE', K.parked, 0, -1, 'WITHSCORES')
  for i = 1, #all, 2 do
    local id, seq = all[i], tonumber(all[i + 1])
    local lane = 'interactive'
    if seq >= H.band then lane = 'background' end
    local tenant
    lane, tenant = adopt(id, lane)
    redis.call('ZADD', K.lanes, 0, slot_member(lane, tenant, seq, id))
    slot_count(K, 'parked', lane, tenant, 1)
    known[id] = true
  end
  for _, id in ipairs(redis.call('ZRANGE', K.slots, 0, -1)) do
    if string.sub(id, 1, 9) ~= 'external:' then
      local lane, tenant = adopt(id, 'interactive')
      slot_count(K, 'held', lane, tenant, 1)
      known[id] = true
    end
  end
  for _, id in ipairs(redis.call('HKEYS', K.owners)) do
    if not known[id] then redis.call('HDEL', K.owners, id) end
  end
  return 1
end
""",
)

#: Lua: solve messages published but not started yet (K.requested: zset id -> when the
#: message counts as lost, ms; K.requested_messages: hash id -> its keyword arguments).
MESSAGES = Lib(
    name="MESSAGES",
    keys=("requested", "requested_messages"),
    source="""
local function message_started(K, id)
  redis.call('ZREM', K.requested, id)
  redis.call('HDEL', K.requested_messages, id)
end
""",
)

#: Lua: the provider's request budgets (K.rate_in: zset of recent in.php requests;
#: K.rate_hourly: hash of requests per hour ('in:<hour>', 'res:<hour>', 'noslot:<hour>'),
#: and 'pause' = until when an HTTP 429 holds every request, ms).  R (a budget table,
#: :meth:`ThreadLimiter.lua_budgets`): window_ms, per_window (0: no window), no_slot_ratio
#: (0: no NO_SLOT budget).
RATES = Lib(
    name="RATES",
    keys=("rate_in", "rate_hourly"),
    source="""
local function rate_paused(K)
  local until_ms = tonumber(redis.call('HGET', K.rate_hourly, 'pause') or '0')
  if until_ms > now then return until_ms - now end
  return 0
end
-- Count one in.php request, or say how long to wait (ms) and for which budget.
local function rate_in(K, R, request_id)
  local pause = rate_paused(K)
  if pause > 0 then return pause, 'pause' end
  local hour = math.floor(now / 3600000)
  if R.no_slot_ratio > 0 then
    local made = tonumber(redis.call('HGET', K.rate_hourly, 'in:' .. hour) or '0')
    local refused = tonumber(redis.call('HGET', K.rate_hourly, 'noslot:' .. hour) or '0')
    if refused >= R.no_slot_ratio * math.max(made - refused, 10) then
      return (hour + 1) * 3600000 - now, 'no_slot'
    end
  end
  if R.per_window > 0 then
    redis.call('ZREMRANGEBYSCORE', K.rate_in, '-inf', now - R.window_ms)
    if redis.call('ZCARD', K.rate_in) >= R.per_window then
      local oldest = redis.call('ZRANGE', K.rate_in, 0, 0, 'WITHSCORES')
      return math.max(1, tonumber(oldest[2]) + R.window_ms - now), 'submit_rate'
    end
    redis.call('ZADD', K.rate_in, now, request_id)
    redis.call('PEXPIRE', K.rate_in, R.window_ms * 2)
  end
  redis.call('HINCRBY', K.rate_hourly, 'in:' .. hour, 1)
  redis.call('HDEL', K.rate_hourly, 'in:' .. (hour - 2), 'res:' .. (hour - 2),
    'noslot:' .. (hour - 2))
  redis.call('PEXPIRE', K.rate_hourly, 3 * 3600000)
  return 0, ''
end
""",
)

#: Lua: K.circuit (hash: the provider's circuit; 'state' = 'open' while it is out of
#: rotation), K.budget_waits (hash: submits deferred, by budget).
DOWN = Lib(
    name="DOWN",
    keys=("circuit", "budget_waits"),
    source="""
local function provider_down(K)
  return redis.call('HGET', K.circuit, 'state') == 'open'
end
""",
)

ADMIT = Script(
    """
-- Admit one submit message at this provider: keep or take its solve's thread slot (or
-- park the job in its lane), and claim the right to call in.php for this attempt
-- (counted against its tenant's daily budget, once per attempt).
-- K: SLOTS, MESSAGES, RATES, DOWN (the provider's), BUDGET, RECORD (the solve's record,
--   claim and revocation), K.parked_seq (counter), K.cancelled (the batch's cancelled
--   flag), K.result (the caller's result key: opaque here)
-- A.id = lease id (the solve id), A.lane, A.tenant, A.asked_ms = when the solve was asked
--   for (ms), A.job = the job (JSON, parked or deferred if it must wait), A.deadline_ms =
--   ms until the solve's deadline, A.attempt, A.claim_ms (0: take no claim), A.budgets
--   (RATES), A.batch = true when the solve belongs to a batch, A.request_id (of the in.php
--   request), A.message_id (the task message asking), A.redelivered = true when that
--   message came again (its first worker died), A.handout = the handout table (SLOTS),
--   A.park_limit = most parked submits before this one is turned away ('full'; absent:
--   no limit), A.parked_record = what the caller's result key says while the solve is
--   parked (absent: nothing), A.record_ttl_s, A.warn_every_ms (budget warnings)
-- returns {status, ms, {given, expired}, budget, warn}: the submits handed out on the
--   way (owed a message)
-- status: 'go' (slot held, claim taken, request counted), 'deferred' (the job waits ms
--   for the budget named, without a slot), 'parked', 'full' (no slot, and more than
--   park_limit wait already: nothing kept), 'down' (the provider's circuit is open:
--   nothing kept here), 'cancelled' (its slot is freed and handed on), 'done' (this
--   attempt was submitted or the solve is over), 'busy' (another message holds the
--   claim, for ms more: look again then, in case its holder died), 'revoked' (its caller
--   revoked it: nothing is sent; the completion frees what it holds), 'over_budget' (its
--   tenant spent today's budget: nothing is sent; the completion frees what it holds).
--   warn = 1 for the first deferral for a budget in warn_every_ms.
""",
    keys=("parked_seq", "cancelled", "result"),
    libs=(SLOTS, MESSAGES, RATES, DOWN, BUDGET, RECORD),
    body="""
local id, H = A.id, A.handout
local none = {{}, {}}
message_started(K, id)
if record_passed(K, A.attempt) then return {'done', 0, none} end
if record_revoked(K) then return {'revoked', 0, none} end
local holder = redis.call('GET', K.claim)
-- The message that took the claim, redelivered because its worker never acknowledged
-- it (it died), goes on; any other copy waits for the claim.
local mine = holder == A.message_id and A.redelivered
if holder and not mine then return {'busy', redis.call('PTTL', K.claim), none} end
if provider_down(K) then
  slot_leave(K, id)
  return {'down', 0, none}
end
if redis.call('ZSCORE', K.parked, id) then return {'parked', 0, none} end
redis.call('ZREM', K.dispatch, id)
redis.call('HDEL', K.waiting, id)
redis.call('ZREM', K.deferred, id)
if A.batch and redis.call('EXISTS', K.cancelled) == 1 then
  slot_drop(K, id)
  return {'cancelled', 0, slot_handout(K, H)}
end
local daily = slot_tenant(H, A.tenant).daily
local out = none
slot_reclaim(K)
if redis.call('ZSCORE', K.slots, id) then
  redis.call('ZADD', K.slots, now + H.lease_ms, id)
else
  if budget_spent(K, A.tenant, daily) then return {'over_budget', 0, none} end
  local ahead = redis.call('ZCARD', K.parked)
  -- A newcomer takes its turn like any parked submit: it parks, and the handout may pick it.
  slot_park(K, H, id, A.lane, A.tenant, A.asked_ms, redis.call('INCR', K.parked_seq))
  waiting_put(K, id, now + A.deadline_ms, A.job)
  out = slot_handout(K, H)
  local mine_at
  for i = 1, #out[1], 2 do
    if out[1][i] == id then mine_at = i end
  end
  if not mine_at then
    if A.park_limit and ahead >= A.park_limit then
      -- the queue is too long: an overflow provider takes it (nothing is kept here)
      slot_leave(K, id)
      redis.call('HDEL', K.waiting, id)
      return {'full', 0, out}
    end
    if A.parked_record then
      redis.call('SET', K.result, A.parked_record, 'EX', A.record_ttl_s)
      redis.call('PUBLISH', K.result, A.parked_record)
    end
    return {'parked', 0, out}
  end
  -- it took a slot itself: this very message goes on, no other is owed
  table.remove(out[1], mine_at)
  table.remove(out[1], mine_at)
  redis.call('ZREM', K.dispatch, id)
  redis.call('HDEL', K.waiting, id)
end
-- A request counted when it was handed out (see HANDOUT) is not counted again.
if redis.call('SREM', K.prepaid, id) == 0 then
  local wait, budget = rate_in(K, A.budgets, A.request_id)
  if wait > 0 then
    -- It waits for the budget, not for a thread: it waits without one, and the thread
    -- goes to the next parked submit.
    slot_drop(K, id)
    waiting_put(K, id, now + A.deadline_ms, A.job)
    redis.call('ZADD', K.deferred, now + wait, id)
    redis.call('HINCRBY', K.budget_waits, budget, 1)
    local warned = tonumber(redis.call('HGET', K.budget_waits, 'warned') or '0')
    local warn = 0
    if now - warned >= A.warn_every_ms then
      redis.call('HSET', K.budget_waits, 'warned', now)
      warn = 1
    end
    local more = slot_handout(K, H)
    for i = 1, 2 do
      for _, item in ipairs(more[i]) do table.insert(out[i], item) end
    end
    return {'deferred', wait, out, budget, warn}
  end
end
if not record_charged(K, A.attempt) then
  if not budget_charge(K, A.tenant, daily) then return {'over_budget', 0, out} end
  record_charge(K, A.attempt)
end
if A.claim_ms > 0 then redis.call('SET', K.claim, A.message_id, 'PX', A.claim_ms) end
return {'go', 0, out}
""",
)

#: Lua: hand out the provider's parked submits a slot freed for, and its deferred submits
#: whose time came (as many as its in.php budget lets go now: counted, 'prepaid').
#: Returns {given, expired} as slot_handout does.
HANDOUT = Lib(
    name="HANDOUT",
    needs=(SLOTS, RATES),
    source="""
local function provider_handout(K, H, R)
  local out = slot_handout(K, H)
  local due = redis.call('ZRANGEBYSCORE', K.deferred, '-inf', now, 'LIMIT', 0, H.most)
  -- (a deferred submit holds no slot when it waited for a budget: it takes one when its
  -- message comes, waiting its turn in its lane like any other)
  for _, id in ipairs(due) do
    local raw = redis.call('HGET', K.waiting, id)
    if raw then
      if rate_in(K, R, 'pre:' .. id) > 0 then break end
      local _, job = waiting_split(raw)
      redis.call('ZREM', K.deferred, id)
      redis.call('SADD', K.prepaid, id)
      redis.call('ZADD', K.dispatch, now + H.grace_ms, id)
      redis.call('ZADD', K.slots, 'XX', now + H.lease_ms, id)
      table.insert(out[1], id)
      table.insert(out[1], job)
    else
      redis.call('ZREM', K.deferred, id)
    end
  end
  return out
end
""",
)

SWEEP = Script(
    """
-- Housekeeping, once per tick for the whole deployment: hand out again the submits whose
-- message was lost and the solve messages that never started, and, at this provider,
-- reclaim expired leases, repair the lane counts and hand out parked and deferred submits.
-- K: SLOTS, MESSAGES, RATES (the provider's), K.lock (the sweep lock), K.submit_queue
--   (list: the broker's queue of submit messages), K.solve_queues (the solve queues of
--   every lane: lists)
-- A.lock_ms (the tick), A.handout (SLOTS), A.budgets (RATES), A.most = most lost
-- messages handed out again, A.message_grace_ms = ms a solve message may wait before it
-- counts as lost
-- returns {0} when another process swept this tick, else {1, given, expired, lost,
--   unstarted, repaired}: flat lists of lease id, job (unstarted: solve id, solve message);
--   repaired = 1 when the lane counts had to be rebuilt
""",
    keys=("lock", "submit_queue"),
    libs=(HANDOUT, MESSAGES),
    more="solve_queues",
    body="""
if not redis.call('SET', K.lock, '1', 'NX', 'PX', A.lock_ms) then return {0} end
slot_reclaim(K)
local repaired = slot_repair(K, A.handout)
local out = provider_handout(K, A.handout, A.budgets)
-- An owed submit message not started yet: while the submit queue is backed up it may only
-- be waiting its turn; once the queue is empty (or it is ten times overdue) it was lost.
local lost = {}
local due = now
if redis.call('LLEN', K.submit_queue) > 0 then due = now - 9 * A.handout.grace_ms end
local ids = redis.call('ZRANGEBYSCORE', K.dispatch, '-inf', due, 'LIMIT', 0, A.most)
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', K.waiting, id)
  if raw then
    redis.call('ZADD', K.dispatch, now + A.handout.grace_ms, id)
    local _, job = waiting_split(raw)
    table.insert(lost, id)
    table.insert(lost, job)
  else
    redis.call('ZREM', K.dispatch, id)
  end
end
-- A solve message that never started: while the solve queues are backed up it may only
-- be waiting; once they are empty (or it is ten times overdue) it was lost.
local unstarted = {}
local grace = A.message_grace_ms
local horizon = now
local queued = 0
for _, queue in ipairs(K.solve_queues) do queued = queued + redis.call('LLEN', queue) end
if queued > 0 then horizon = now - 9 * grace end
ids = redis.call('ZRANGEBYSCORE', K.requested, '-inf', horizon, 'LIMIT', 0, A.most)
for _, id in ipairs(ids) do
  local message = redis.call('HGET', K.requested_messages, id)
  if message then
    redis.call('ZADD', K.requested, now + grace, id)
    table.insert(unstarted, id)
    table.insert(unstarted, message)
  else
    redis.call('ZREM', K.requested, id)
  end
end
return {1, out[1], out[2], lost, unstarted, repaired}
""",
)

TICK = Script(
    """
-- Housekeeping at one more provider (the process that swept this tick runs it): reclaim
-- expired leases, repair the lane counts, hand out parked and deferred submits.
-- K: SLOTS, RATES (the provider's)
-- A.handout (SLOTS), A.budgets (RATES)
-- returns {given, expired} (flat lists of lease id, job)
""",
    libs=(HANDOUT,),
    body="""
slot_reclaim(K)
slot_repair(K, A.handout)
return provider_handout(K, A.handout, A.budgets)
""",
)

EVACUATE = Script(
    """
-- The provider is out of rotation: hand out its parked and deferred submits (owed a
-- message, holding nothing here) so that they go elsewhere.
-- K: SLOTS
-- A.most = most handed out, A.grace_ms = ms their messages may take to start
-- returns a flat list of lease id, job
""",
    libs=(SLOTS,),
    body="""
local out = {}
for _, set in ipairs({K.parked, K.deferred}) do
  local ids = redis.call('ZRANGE', set, 0, A.most - 1)
  for _, id in ipairs(ids) do
    slot_leave(K, id)
    local raw = redis.call('HGET', K.waiting, id)
    if raw then
      local _, job = waiting_split(raw)
      redis.call('ZADD', K.dispatch, now + A.grace_ms, id)
      table.insert(out, id)
      table.insert(out, job)
    end
  end
end
return out
""",
)

RELEASE = Script(
    """
-- A solve leaves this provider before it ends (it goes to another one): free what it
-- holds here and hand the slot on.
-- K: SLOTS
-- A.id = lease id, A.handout (SLOTS)
-- returns {given, expired} (flat lists of lease id, job)
""",
    libs=(SLOTS,),
    body="""
slot_leave(K, A.id)
return slot_handout(K, A.handout)
""",
)

DEFER = Script(
    """
-- A submit goes again later (a back-off): it waits in Redis, keeping the slot it holds,
-- and housekeeping hands it out when its time comes.
-- K: SLOTS, and the solve's claim (RECORD)
-- A.id = lease id (solve id), A.job (JSON), A.at_ms = ms until it goes, A.deadline_ms =
--   ms until the solve's deadline, A.handout (SLOTS), A.unclaim = true to give up the
--   claim (it is this message's)
-- returns 1
""",
    libs=(SLOTS, RECORD),
    body="""
slot_defer(K, A.handout, A.id, now + A.deadline_ms, A.job, now + A.at_ms)
if A.unclaim then redis.call('DEL', K.claim) end
return 1
""",
)

NO_SLOT = Script(
    """
-- The provider answered in.php with NO_SLOT: count it against its NO_SLOT budget.
-- K: RATES
-- A (nothing)
-- returns 1
""",
    libs=(RATES,),
    body="""
local hour = math.floor(now / 3600000)
redis.call('HINCRBY', K.rate_hourly, 'noslot:' .. hour, 1)
redis.call('PEXPIRE', K.rate_hourly, 3 * 3600000)
return 1
""",
)

EXPECT = Script(
    """
-- A solve message is about to be published: remember it until it starts.
-- K: MESSAGES
-- A.id = solve id, A.message = its keyword arguments (JSON), A.wait_ms = ms it may wait
-- returns 1
""",
    libs=(MESSAGES,),
    body="""
redis.call('HSET', K.requested_messages, A.id, A.message)
redis.call('ZADD', K.requested, now + A.wait_ms, A.id)
return 1
""",
)

OWE = Script(
    """
-- A submit is published again (later): owe it until its message starts.
-- K: SLOTS, and the solve's claim (RECORD)
-- A.id = lease id (solve id), A.job (JSON), A.due_ms = ms until the message counts as
--   lost, A.deadline_ms = ms until the solve's deadline, A.unclaim = true to give up the
--   claim (it is this message's)
-- returns 1
""",
    libs=(SLOTS, RECORD),
    body="""
slot_owe(K, A.id, now + A.deadline_ms, A.job, now + A.due_ms)
if A.unclaim then redis.call('DEL', K.claim) end
return 1
""",
)

RES_RATE = Script(
    """
-- Budget for res.php requests: at most per_captcha * captchas + base per hour.
-- K: RATES
-- A.per_captcha = requests allowed per captcha submitted (-1: no budget, only an HTTP
--   429 holds them), A.base = base allowance, A.n = requests this call makes
-- returns 0 when the requests may go now (they are counted), else ms to wait (an HTTP
--   429's Retry-After holds every request of the account)
""",
    libs=(RATES,),
    body="""
local pause = rate_paused(K)
if pause > 0 then return pause end
if A.per_captcha < 0 then return 0 end
local hour = math.floor(now / 3600000)
local sent = tonumber(redis.call('HGET', K.rate_hourly, 'res:' .. hour) or '0')
local made = tonumber(redis.call('HGET', K.rate_hourly, 'in:' .. hour) or '0')
if sent + A.n <= A.per_captcha * made + A.base then
  redis.call('HINCRBY', K.rate_hourly, 'res:' .. hour, A.n)
  redis.call('PEXPIRE', K.rate_hourly, 3 * 3600000)
  return 0
end
return (hour + 1) * 3600000 - now
""",
)

PAUSE = Script(
    """
-- The API answered HTTP 429: hold every in.php and res.php request of the account.
-- K: RATES (K.rate_hourly field 'pause' = until when, ms)
-- A.ms = ms to hold (a later hold already set is kept)
-- returns ms the account is held from now
""",
    libs=(RATES,),
    body="""
local until_ms = now + A.ms
local current = tonumber(redis.call('HGET', K.rate_hourly, 'pause') or '0')
if until_ms > current then
  redis.call('HSET', K.rate_hourly, 'pause', until_ms)
  redis.call('PEXPIRE', K.rate_hourly, math.max(3 * 3600000, until_ms - now))
  return until_ms - now
end
return current - now
""",
)

EXTERNAL = Script(
    """
-- The provider's view of threads: those it counts working beyond the slots we hold belong
-- to another client of the key.  They take slots of their own ('external:1..N', expiring
-- with the view), so every admission and handout leaves them alone.
-- K: SLOTS (K.external: count of external threads, a string with a TTL)
-- A.working = the provider's working threads, A.hold_ms = ms the view holds,
-- A.most = most threads to give up (the rest stays usable, to find out when they free)
-- returns {external before, external now, slots we hold}
""",
    libs=(SLOTS,),
    body="""
local before = tonumber(redis.call('GET', K.external) or '0')
for i = 1, before do redis.call('ZREM', K.slots, 'external:' .. i) end
slot_reclaim(K)
local ours = redis.call('ZCARD', K.slots)
local other = math.max(0, math.min(A.working - ours, A.most))
for i = 1, other do redis.call('ZADD', K.slots, now + A.hold_ms, 'external:' .. i) end
if other > 0 then
  redis.call('SET', K.external, other, 'PX', A.hold_ms)
else
  redis.call('DEL', K.external)
end
return {before, other, ours}
""",
)


@dataclass(frozen=True)
class Drift:
    """What a look at the provider's thread count found: threads another client holds,
    before and now, and the slots we hold."""

    before: int
    now: int
    ours: int


@dataclass(frozen=True)
class Swept:
    """What one housekeeping sweep handed out: parked submits given a slot (or expired)
    and deferred submits whose time came, submits whose message was lost (``lost``), and
    solve messages that never started (``unstarted``: the solve id and the message's
    keyword arguments, JSON)."""

    handout: Handout
    lost: list[Parked]
    unstarted: list[Parked]
    #: The lane counts disagreed with the slots and parked submits and were rebuilt.
    repaired: bool = False


@dataclass(frozen=True)
class LimiterConfig:
    capacity: int
    #: Slots refills may never take (on-demand solves get them).
    reserve: int
    lease_s: float
    #: ``in.php`` requests per ``in_window_s`` (0: no such budget).
    in_per_window: int = 0
    in_window_s: float = 3.0
    #: NO_SLOT answers allowed per captcha submitted, by the hour (0: no such budget).
    no_slot_ratio: float = 0.0
    #: ``res.php`` requests an hour: ``res_per_captcha`` × captchas + ``res_base`` (None:
    #: no such budget; an HTTP 429 still holds them).
    res_per_captcha: int | None = None
    res_base: int = 1200
    #: How long one copy of a submit may hold the right to call in.php (> HTTP timeouts).
    claim_s: float = 60.0
    #: Most parked submits handed out by one release.
    max_handout: int = 100
    #: Seconds a handed-out submit's message may take to start before it is sent again.
    dispatch_grace_s: float = 5.0
    #: Seconds a solve message may wait to start (the queue empty) before it is sent again
    #: (longer than a dead worker's unacknowledged messages take to come back).
    message_grace_s: float = 70.0
    #: Seconds between two warnings that a budget, not threads, holds submits back.
    warn_every_s: float = 600.0
    #: The tenants sharing the account (weights, caps, budgets); undeclared: weight 1.
    tenants: Mapping[str, Tenant] = field(default_factory=dict)

    @property
    def refill_capacity(self) -> int:
        """Slots the background lane (pool refills) may fill."""
        return max(0, self.capacity - self.reserve)


@dataclass(frozen=True)
class LaneUse:
    """One tenant's slots held and submits parked in one lane."""

    held: int = 0
    parked: int = 0


@dataclass(frozen=True)
class WaitTimes:
    """Waits from request to thread in one lane for one tenant: the count per bucket of
    :data:`WAIT_BUCKETS_S` (the last one: longer), their sum and how many."""

    buckets: tuple[int, ...]
    sum_s: float
    count: int


class ThreadLimiter:
    """Slots, lanes, parking, deferrals, owed messages and request budgets of one
    provider.

    ``db`` carries the provider's scoped key names; ``provider`` is its name (its
    circuit's key)."""

    def __init__(self, db: Db, config: LimiterConfig, provider: str = "captchaai") -> None:
        self.db = db
        self.keys = db.keys
        self.config = config
        self.provider = provider
        self._admit = db.bind(ADMIT)
        self._sweep = db.bind(SWEEP)
        self._tick = db.bind(TICK)
        self._evacuate = db.bind(EVACUATE)
        self._release = db.bind(RELEASE)
        self._defer = db.bind(DEFER)
        self._no_slot = db.bind(NO_SLOT)
        self._expect = db.bind(EXPECT)
        self._owe = db.bind(OWE)
        self._res_rate = db.bind(RES_RATE)
        self._pause = db.bind(PAUSE)
        self._external = db.bind(EXTERNAL)
        self._tenants_table = {n: self._tenant_entry(t) for n, t in config.tenants.items()}

    # -- what other modules' scripts pass to this module's Lua functions ---------------
    def lua_keys(self) -> dict[str, str]:
        """The keys of :data:`SLOTS`, :data:`MESSAGES` and :data:`RATES`, by name."""
        k = self.keys
        return {
            "slots": k.slots(),
            "parked": k.parked(),
            "deferred": k.deferred(),
            "prepaid": k.prepaid(),
            "lanes": k.lanes(),
            "owners": k.owners(),
            "counts": k.lane_counts(),
            "fair": k.fair_tags(),
            "waits": k.wait_times(),
            "external": k.external_threads(),
            **budget_keys(k),
            "waiting": k.waiting(),
            "dispatch": k.dispatch(),
            "requested": k.requested(),
            "requested_messages": k.requested_messages(),
            "rate_in": k.rate("in"),
            "rate_hourly": k.rate("hourly"),
        }

    def lua_handout(self, extra_lease_s: float = 0.0) -> dict[str, Any]:
        """The handout table ``H`` of :data:`SLOTS` (``extra_lease_s`` lengthens leases)."""
        cfg = self.config
        return {
            "lease_ms": ms(cfg.lease_s + extra_lease_s),
            "capacity": cfg.capacity,
            "refill_capacity": cfg.refill_capacity,
            "most": cfg.max_handout,
            "band": REFILL_BAND,
            "grace_ms": ms(cfg.dispatch_grace_s),
            "tenants": self._tenants_table,
        }

    def lua_budgets(self) -> dict[str, float]:
        """The budget table ``R`` of :data:`RATES`."""
        cfg = self.config
        return {
            "window_ms": ms(cfg.in_window_s),
            "per_window": cfg.in_per_window,
            "no_slot_ratio": cfg.no_slot_ratio,
        }

    @staticmethod
    def _tenant_entry(tenant: Tenant) -> dict[str, float | int]:
        entry: dict[str, float | int] = {"w": tenant.weight}
        if tenant.max_threads is not None:
            entry["max"] = tenant.max_threads
        if tenant.daily_captchas is not None:
            entry["daily"] = tenant.daily_captchas
        return entry

    # -- operations ----------------------------------------------------------------------
    def admit(
        self,
        solve_id: str,
        job: str,
        *,
        attempt: int,
        deadline_in_s: float,
        lane: str = INTERACTIVE,
        tenant: str = DEFAULT_TENANT,
        asked_at: float | None = None,
        batch_id: str | None = None,
        message_id: str = "",
        redelivered: bool = False,
        result: tuple[str, str, int] | None = None,
        park_limit: int | None = None,
    ) -> Admission:
        """Admit a submit of ``job`` (see ``ADMIT``) in ``lane`` for ``tenant``; parks the
        job if no slot is free or others go first (unless ``park_limit`` submits are
        parked already: then ``"full"``), defers it if a budget holds it back.

        ``asked_at`` (Unix time) is when its caller asked for the solve: its wait for a
        thread is counted from then (default: now).  ``message_id`` is the task message
        asking: a message ``redelivered`` after its worker died finds the claim it took
        itself and goes on.  ``result``: the caller's result key, what it says while the
        solve is parked, and for how long (s)."""
        check_lane(lane)
        if not is_tenant_name(tenant):  # it goes into '|'-joined names in Redis
            raise ValidationError(f"{tenant!r} cannot name a tenant")
        cfg, k = self.config, self.keys
        keys = {
            **self.lua_keys(),
            **record_keys(k, solve_id),
            "circuit": k.circuit(self.provider),
            "budget_waits": k.budget_waits(),
            "parked_seq": k.parked_seq(),
            "cancelled": k.batch_cancelled(batch_id or "-"),
            "result": result[0] if result else k.submission(solve_id),
        }
        args: dict[str, Any] = {
            "id": solve_id,
            "lane": lane,
            "tenant": tenant,
            "job": job,
            "deadline_ms": ms(max(0.0, deadline_in_s)),
            "attempt": attempt,
            "claim_ms": ms(cfg.claim_s),
            "budgets": self.lua_budgets(),
            "batch": batch_id is not None,
            "request_id": uuid.uuid4().hex,
            "message_id": message_id or uuid.uuid4().hex,
            "redelivered": redelivered,
            "handout": self.lua_handout(),
            "warn_every_ms": ms(cfg.warn_every_s),
        }
        if asked_at is not None:  # else now, on the Redis server's clock
            args["asked_ms"] = ms(asked_at)
        if park_limit is not None:
            args["park_limit"] = max(0, park_limit)
        if result:
            args.update(parked_record=result[1], record_ttl_s=result[2])
        reply, held = self._guarded(lambda: self.db.fenced(lambda c: self._admit(keys, args, c)))
        status = text(reply[0])
        if status == "go" and not held:
            # Behind Sentinel, an admission no replica holds may be lost with its master:
            # calling in.php on it could pay twice.  The submit waits, as for an outage.
            raise self.db.unavailable(
                ConnectionError("no replica acknowledged the admission in time"),
                "nothing is submitted until a replica holds it",
            )
        budget = text(reply[3]) if len(reply) > 3 else ""
        warn = len(reply) > 4 and int(reply[4]) == 1
        return Admission(status, int(reply[1]) / 1000, handed_out(reply[2]), budget, warn)  # type: ignore[arg-type]

    def sweep(
        self,
        tick_s: float,
        solve_queues: Sequence[str],
        submit_queue: str = "",
        most: int = 500,
    ) -> Swept | None:
        """Reclaim expired leases, repair the lane counts if they drifted, hand out this
        provider's parked and deferred submits, and hand out again the submits and solves
        whose message was lost; None when another process swept within ``tick_s``.
        ``solve_queues`` (the solve queues of every lane) and ``submit_queue`` are the
        broker's lists of those messages: while one is backed up, its messages are only
        waiting ("": none known)."""
        keys = {**self.lua_keys(), "lock": self.keys.housekeeping_lock()}
        keys["submit_queue"] = submit_queue
        args = {
            "lock_ms": max(1, ms(tick_s)),
            "handout": self.lua_handout(),
            "budgets": self.lua_budgets(),
            "most": most,
            "message_grace_ms": ms(self.config.message_grace_s),
        }
        reply = self._guarded(lambda: self._sweep(keys, args, more=list(solve_queues)))
        if int(reply[0]) == 0:
            return None
        return Swept(
            handed_out(reply[1:3]), _parked(reply[3]), _parked(reply[4]), bool(int(reply[5]))
        )

    def tick(self) -> Handout:
        """This provider's share of a sweep (the process that swept runs it for every
        other provider): parked and deferred submits handed out."""
        args = {"handout": self.lua_handout(), "budgets": self.lua_budgets()}
        return handed_out(self._guarded(lambda: self._tick(self.lua_keys(), args)))

    def evacuate(self, most: int = 500) -> list[Parked]:
        """Hand out every parked and deferred submit (up to ``most``) without a slot: the
        provider is out of rotation and they must go elsewhere."""
        args = {"most": most, "grace_ms": ms(self.config.dispatch_grace_s)}
        return _parked(self._guarded(lambda: self._evacuate(self.lua_keys(), args)))

    def release(self, solve_id: str) -> Handout:
        """The solve leaves this provider (for another one): free what it holds here."""
        args = {"id": solve_id, "handout": self.lua_handout()}
        return handed_out(self._guarded(lambda: self._release(self.lua_keys(), args)))

    def defer(
        self, solve_id: str, job: str, *, at_in_s: float, deadline_in_s: float, unclaim: bool
    ) -> None:
        """The submit of ``job`` goes again in ``at_in_s``: it waits in Redis (keeping its
        slot) and housekeeping hands it out then; no task message waits meanwhile."""
        keys = {**self.lua_keys(), **record_keys(self.keys, solve_id)}
        args = {
            "id": solve_id,
            "job": job,
            "at_ms": ms(max(0.0, at_in_s)),
            "deadline_ms": ms(max(0.0, deadline_in_s)),
            "handout": self.lua_handout(),
            "unclaim": unclaim,
        }
        self._guarded(lambda: self._defer(keys, args))

    def count_no_slot(self) -> None:
        """The provider answered NO_SLOT: count it against its NO_SLOT budget."""
        if self.config.no_slot_ratio > 0:
            self._guarded(lambda: self._no_slot(self.lua_keys(), {}))

    def expect(self, solve_id: str, message: str) -> None:
        """A solve message (its keyword arguments, JSON) is about to be published: wait for
        it to start (``ADMIT``), and publish it again from :meth:`sweep` if it is lost on
        its way to a worker."""
        args = {"id": solve_id, "message": message, "wait_ms": ms(self.config.message_grace_s)}
        self._guarded(lambda: self._expect(self.lua_keys(), args))

    def owe(
        self, solve_id: str, job: str, *, deadline_in_s: float, countdown_s: float, unclaim: bool
    ) -> None:
        """The submit of ``job`` is published again after ``countdown_s``: owe it, so that
        :meth:`sweep` hands it out again if that message is lost (and give up the submit
        claim unless another message holds it)."""
        keys = {**self.lua_keys(), **record_keys(self.keys, solve_id)}
        args = {
            "id": solve_id,
            "job": job,
            "due_ms": ms(countdown_s + self.config.dispatch_grace_s),
            "deadline_ms": ms(max(0.0, deadline_in_s)),
            "unclaim": unclaim,
        }
        self._guarded(lambda: self._owe(keys, args))

    def in_use(self) -> int:
        """Slots our solves hold right now (expired leases and another client's threads
        not counted)."""
        held, external = self._guarded(self._count_live)
        return max(0, held - external)

    def external(self) -> int:
        """Provider threads another client of the key holds, as last seen."""
        r = self.db.redis
        return int(self._guarded(lambda: r.get(self.keys.external_threads())) or 0)

    def check_due(self, every_s: float) -> bool:
        """True once per ``every_s`` for the whole deployment: time to look at the
        provider's thread count."""
        key, r = self.keys.threads_check_lock(), self.db.redis
        return bool(self._guarded(lambda: r.set(key, "1", nx=True, px=ms(every_s))))

    def see_provider(self, working_threads: int, hold_s: float) -> Drift:
        """Take the provider's count of working threads: any beyond the slots we hold are
        another client's, and our usable threads shrink by them for ``hold_s`` (or until
        the next look)."""
        keys = self.lua_keys()
        args = {
            "working": working_threads,
            "hold_ms": ms(hold_s),
            "most": max(0, self.config.capacity - 1),
        }
        before, now, ours = self._guarded(lambda: self._external(keys, args))
        return Drift(int(before), int(now), int(ours))

    def _count_live(self) -> tuple[int, int]:
        r = self.db.redis
        seconds, micros = r.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        pipe = r.pipeline(transaction=False)
        pipe.zcount(self.keys.slots(), now_ms + 1, "+inf")
        pipe.get(self.keys.external_threads())
        held, external = pipe.execute()
        return int(held), min(int(held), int(external or 0))

    def free_for_refills(self) -> int:
        held, _ = self._guarded(self._count_live)
        return max(0, self.config.refill_capacity - held - self.parked_count())

    def parked_count(self) -> int:
        r = self.db.redis
        return int(self._guarded(lambda: r.zcard(self.keys.parked())))

    def lanes(self) -> dict[tuple[str, str], LaneUse]:
        """Slots held and submits parked, by (lane, tenant), as counted right now (expired
        leases count until the next handout or sweep reclaims them)."""
        r = self.db.redis
        raw = self._guarded(lambda: r.hgetall(self.keys.lane_counts()))
        found: dict[tuple[str, str], dict[str, int]] = {}
        for name, value in raw.items():
            kind, lane, tenant = text(name).split("|", 2)
            found.setdefault((lane, tenant), {})[kind] = int(value)
        return {where: LaneUse(**counts) for where, counts in sorted(found.items())}

    def wait_times(self) -> dict[tuple[str, str], WaitTimes]:
        """The waits from request to thread so far, by (lane, tenant)."""
        r = self.db.redis
        raw = self._guarded(lambda: r.hgetall(self.keys.wait_times()))
        found: dict[tuple[str, str], dict[str, int]] = {}
        for name, value in raw.items():
            lane, tenant, field_ = text(name).split("|", 2)
            found.setdefault((lane, tenant), {})[field_] = int(value)
        out = {}
        for where, fields in sorted(found.items()):
            buckets = tuple(fields.get(str(i), 0) for i in range(1, len(WAIT_BUCKETS_S) + 2))
            out[where] = WaitTimes(buckets, fields.get("sum", 0) / 1000, fields.get("n", 0))
        return out

    def deferred_count(self) -> int:
        r = self.db.redis
        return int(self._guarded(lambda: r.zcard(self.keys.deferred())))

    def budget_waits(self) -> dict[str, int]:
        """Submits deferred so far for each budget (``submit_rate``, ``no_slot``,
        ``pause``)."""
        r = self.db.redis
        raw = self._guarded(lambda: r.hgetall(self.keys.budget_waits()))
        return {text(k): int(v) for k, v in raw.items() if text(k) != "warned"}

    def pause(self, seconds: float) -> float:
        """Hold every ``in.php`` and ``res.php`` request to the provider for ``seconds``
        (an HTTP 429's ``Retry-After``); returns the seconds it is held from now."""
        held = self._guarded(lambda: self._pause(self.lua_keys(), {"ms": ms(seconds)}))
        return int(held) / 1000

    def poll_wait(self, requests: int = 1) -> float:
        """0 when ``requests`` ``res.php`` calls may go now (counted); else seconds to wait."""
        cfg = self.config
        per_captcha = -1 if cfg.res_per_captcha is None else cfg.res_per_captcha
        args = {"per_captcha": per_captcha, "base": cfg.res_base, "n": requests}
        return int(self._guarded(lambda: self._res_rate(self.lua_keys(), args))) / 1000

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "nothing is submitted until it is back")


def _parked(flat: list[Any]) -> list[Parked]:
    items = [text(x) for x in flat]
    return [Parked(items[i], items[i + 1]) for i in range(0, len(items), 2)]


def handed_out(reply: Any) -> Handout:
    """A ``{given, expired}`` reply of :func:`slot_handout` as a value."""
    return Handout(_parked(reply[0]), _parked(reply[1]))
