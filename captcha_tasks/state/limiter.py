"""The account-wide thread limiter and request-rate budget, shared through Redis.

A *slot* is one provider thread.  It belongs to a solve (its lease id is the solve's id),
is taken before ``in.php`` and given back when the solve ends.  Every lease has an expiry
on the Redis server's clock that polls renew, so a slot whose worker died comes back by
itself.

A submit that finds no free slot is *parked*: its job waits in Redis and the task ends
(no worker blocks, nothing spins).  Releasing a slot hands it at once to the oldest parked
submit, on-demand solves before pool refills; refills may not take the last ``reserve``
slots.  A parked submit whose deadline passed is handed on without a slot (its submit
fails it).  Either way a handed-out submit is *owed a task message*: it stays in the
dispatch set with its job until that message starts, and :meth:`ThreadLimiter.sweep`
hands out its job again if the message never shows (the worker that should have
published it died).  Nothing Redis hands out exists only in one process's memory.

All of this is one Lua script per operation, so many hosts behave as one client.  With
Redis unreachable every call raises :class:`~captcha_tasks.errors.StoreUnavailable`: the
limiter fails closed and nothing is submitted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis

from ..keys import Keys
from .lua import guard, lua, ms, script, text

T = TypeVar("T")
Arg = str | int | float

ON_DEMAND = 0
REFILL = 1
#: Parked refills sort after every parked on-demand submit.
REFILL_BAND = 10**12

#: Lua: hand free slots to the oldest parked submits (``now`` and expired leases done).
HANDOUT_FN = """
local function handout(slots, parked, waiting, dispatch, lease_ms, cap, refill_cap, budget,
                       band, grace_ms)
  local used = redis.call('ZCARD', slots)
  local given, expired = {}, {}
  while budget > 0 do
    local first = redis.call('ZRANGE', parked, 0, 0, 'WITHSCORES')
    if not first[1] then break end
    local id = first[1]
    local limit = cap
    if tonumber(first[2]) >= band then limit = refill_cap end
    local raw = redis.call('HGET', waiting, id)
    local deadline = 0
    if raw then deadline = tonumber(string.sub(raw, 1, string.find(raw, '|', 1, true) - 1)) end
    local late = deadline <= now
    if raw and (not late) and used >= limit then break end
    redis.call('ZREM', parked, id)
    if raw then
      local job = string.sub(raw, string.find(raw, '|', 1, true) + 1)
      redis.call('ZADD', dispatch, now + grace_ms, id)
      if late then
        table.insert(expired, id)
        table.insert(expired, job)
      else
        redis.call('ZADD', slots, now + lease_ms, id)
        used = used + 1
        table.insert(given, id)
        table.insert(given, job)
      end
      budget = budget - 1
    end
  end
  return {given, expired}
end
"""

#: Lua: count one in.php request in the sliding window, or say how long to wait.
IN_RATE_FN = """
local function paused(hourly)
  local until_ms = tonumber(redis.call('HGET', hourly, 'pause') or '0')
  if until_ms > now then return until_ms - now end
  return 0
end
local function in_rate(window, hourly, window_ms, per_window, request_id)
  local pause = paused(hourly)
  if pause > 0 then return pause end
  redis.call('ZREMRANGEBYSCORE', window, '-inf', now - window_ms)
  if redis.call('ZCARD', window) >= per_window then
    local oldest = redis.call('ZRANGE', window, 0, 0, 'WITHSCORES')
    return math.max(1, tonumber(oldest[2]) + window_ms - now)
  end
  redis.call('ZADD', window, now, request_id)
  redis.call('PEXPIRE', window, window_ms * 2)
  local hour = math.floor(now / 3600000)
  redis.call('HINCRBY', hourly, 'in:' .. hour, 1)
  redis.call('HDEL', hourly, 'in:' .. (hour - 2), 'res:' .. (hour - 2))
  redis.call('PEXPIRE', hourly, 3 * 3600000)
  return 0
end
"""

ADMIT_LUA = lua(
    """
-- Admit one submit message: keep or take its solve's thread slot (or park the job), and
-- claim the right to call in.php for this attempt.
-- KEYS[1] = slots (zset: lease id -> lease expiry, ms)
-- KEYS[2] = parked (zset: lease id -> arrival order; refills banded after on-demand)
-- KEYS[3] = waiting (hash: lease id -> "<deadline ms>|<job JSON>")
-- KEYS[4] = parked sequence (counter)
-- KEYS[5] = dispatch (zset: lease id -> when its owed message counts as lost, ms)
-- KEYS[6] = the solve's record (hash: attempt, captcha_id, done)
-- KEYS[7] = the solve's submit claim (string with a TTL)
-- KEYS[8] = the batch's cancelled flag (looked at when ARGV[12] is '1')
-- KEYS[9] = in.php window (zset), KEYS[10] = hourly request counts (hash)
-- KEYS[11] = requested (zset), KEYS[12] = requested messages (hash): the solve's message
--   has run now, so it is no longer waited for
-- ARGV[1] = lease id (the solve id), ARGV[2] = lease ms, ARGV[3] = capacity of its class
-- ARGV[4] = class: 0 on demand, 1 refill, ARGV[5] = the job (JSON), parked if no slot
-- ARGV[6] = ms until the solve's deadline, ARGV[7] = refill band, ARGV[8] = attempt
-- ARGV[9] = claim ms (0: take no claim), ARGV[10] = in.php window ms
-- ARGV[11] = in.php requests per window (0: count no request)
-- ARGV[12] = '1' when the solve belongs to a batch, ARGV[13] = in.php request id
-- ARGV[14] = the id of the task message asking (the claim records its holder)
-- ARGV[15] = '1' when that message is a redelivery (its first worker died)
-- ARGV[16..19] = capacity, refill capacity, most handed out, grace ms: the handout of the
--   slot a cancelled solve gives back
-- returns {status, ms} or, for 'cancelled', {status, 0, {given, expired}} (as RELEASE)
-- status: 'go' (slot held, claim taken, request counted), 'wait' (slot
--   held; the in.php budget frees in ms), 'parked', 'cancelled' (its slot is freed),
--   'done' (this attempt was submitted or the solve is over), 'busy' (another message
--   holds the claim, for ms more: look again then, in case its holder died)
""",
    IN_RATE_FN,
    HANDOUT_FN,
    """
local id = ARGV[1]
redis.call('ZREM', KEYS[11], id)
redis.call('HDEL', KEYS[12], id)
local record = redis.call('HMGET', KEYS[6], 'done', 'attempt')
if record[1] then return {'done', 0} end
if record[2] and tonumber(record[2]) >= tonumber(ARGV[8]) then return {'done', 0} end
local holder = redis.call('GET', KEYS[7])
-- The message that took the claim, redelivered because its worker never acknowledged
-- it (it died), goes on; any other copy waits for the claim.
local mine = holder == ARGV[14] and ARGV[15] == '1'
if holder and not mine then return {'busy', redis.call('PTTL', KEYS[7])} end
if redis.call('ZSCORE', KEYS[2], id) then return {'parked', 0} end
redis.call('ZREM', KEYS[5], id)
redis.call('HDEL', KEYS[3], id)
if ARGV[12] == '1' and redis.call('EXISTS', KEYS[8]) == 1 then
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  return {'cancelled', 0, handout(KEYS[1], KEYS[2], KEYS[3], KEYS[5], tonumber(ARGV[2]),
    tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18]), tonumber(ARGV[7]),
    tonumber(ARGV[19]))}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lease_ms = tonumber(ARGV[2])
if redis.call('ZSCORE', KEYS[1], id) then
  redis.call('ZADD', KEYS[1], now + lease_ms, id)
else
  local used = redis.call('ZCARD', KEYS[1])
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local refill = tonumber(ARGV[4]) == 1
  local ahead = first[1] and (refill or tonumber(first[2]) < tonumber(ARGV[7]))
  if ahead or used >= tonumber(ARGV[3]) then
    local band = 0
    if refill then band = tonumber(ARGV[7]) end
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]) + band, id)
    redis.call('HSET', KEYS[3], id, tostring(now + tonumber(ARGV[6])) .. '|' .. ARGV[5])
    return {'parked', 0}
  end
  redis.call('ZADD', KEYS[1], now + lease_ms, id)
end
if tonumber(ARGV[11]) > 0 then
  local wait = in_rate(KEYS[9], KEYS[10], tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[13])
  if wait > 0 then return {'wait', wait} end
end
if tonumber(ARGV[9]) > 0 then redis.call('SET', KEYS[7], ARGV[14], 'PX', tonumber(ARGV[9])) end
return {'go', 0}
""",
)

RELEASE_LUA = lua(
    """
-- A solve is over: give its slot back (or forget it parked or owed a message), and hand
-- free slots to the oldest parked submits.
-- KEYS[1] = slots, KEYS[2] = parked, KEYS[3] = waiting, KEYS[4] = dispatch (as in ADMIT)
-- ARGV[1] = lease id to release ('' to only hand out free slots)
-- ARGV[2] = lease ms for the submits given a slot, ARGV[3] = capacity
-- ARGV[4] = capacity for refills, ARGV[5] = most parked submits to hand out
-- ARGV[6] = refill band, ARGV[7] = ms before an owed message counts as lost
-- returns {given, expired}: flat lists of lease id, job; both are owed a submit message
""",
    HANDOUT_FN,
    """
local id = ARGV[1]
if id ~= '' then
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return handout(KEYS[1], KEYS[2], KEYS[3], KEYS[4], tonumber(ARGV[2]), tonumber(ARGV[3]),
               tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
""",
)

SWEEP_LUA = lua(
    """
-- Housekeeping, once per tick for the whole deployment: reclaim expired leases, hand
-- free slots to parked submits, and hand out again the submits whose message was lost.
-- KEYS[1] = slots, KEYS[2] = parked, KEYS[3] = waiting, KEYS[4] = dispatch (as in ADMIT)
-- KEYS[5] = the sweep lock (string)
-- KEYS[6] = requested (zset: solve id -> when its message counts as lost, ms)
-- KEYS[7] = requested messages (hash), KEYS[8] = the solve queue (list)
-- ARGV[1] = lock ms (the tick), ARGV[2..7] = as ARGV[2..7] of RELEASE
-- ARGV[8] = most lost messages to hand out again
-- ARGV[9] = ms a solve message may wait before it counts as lost
-- returns {0} when another process swept this tick, else {1, given, expired, lost,
--   unstarted}: flat lists of lease id, job (unstarted: solve id, solve message)
""",
    HANDOUT_FN,
    """
if not redis.call('SET', KEYS[5], '1', 'NX', 'PX', tonumber(ARGV[1])) then return {0} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = handout(KEYS[1], KEYS[2], KEYS[3], KEYS[4], tonumber(ARGV[2]), tonumber(ARGV[3]),
                    tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
local lost = {}
local ids = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[8]))
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', KEYS[3], id)
  if raw then
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[7]), id)
    table.insert(lost, id)
    table.insert(lost, string.sub(raw, string.find(raw, '|', 1, true) + 1))
  else
    redis.call('ZREM', KEYS[4], id)
  end
end
-- A solve message that never started: while the solve queue is backed up it may only be
-- waiting; once the queue is empty (or it is ten times overdue) it was lost.
local unstarted = {}
local grace = tonumber(ARGV[9])
local queued = redis.call('LLEN', KEYS[8])
local horizon = now
if queued > 0 then horizon = now - 9 * grace end
ids = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', horizon, 'LIMIT', 0, tonumber(ARGV[8]))
for _, id in ipairs(ids) do
  local message = redis.call('HGET', KEYS[7], id)
  if message then
    redis.call('ZADD', KEYS[6], now + grace, id)
    table.insert(unstarted, id)
    table.insert(unstarted, message)
  else
    redis.call('ZREM', KEYS[6], id)
  end
end
return {1, out[1], out[2], lost, unstarted}
""",
)

EXPECT_LUA = lua(
    """
-- A solve message is about to be published: remember it until it starts.
-- KEYS[1] = requested (zset: solve id -> when its message counts as lost, ms)
-- KEYS[2] = requested messages (hash: solve id -> the message's keyword arguments)
-- ARGV[1] = solve id, ARGV[2] = keyword arguments (JSON), ARGV[3] = ms it may wait
-- returns 1
""",
    """
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
""",
)

OWE_LUA = lua(
    """
-- A submit is published again (later): owe it until its message starts.
-- KEYS[1] = dispatch (zset), KEYS[2] = waiting (hash), KEYS[3] = the solve's submit claim
-- ARGV[1] = lease id (solve id), ARGV[2] = job (JSON), ARGV[3] = ms until the message
--   counts as lost, ARGV[4] = ms until the solve's deadline, ARGV[5] = '1' to give up the
--   claim (it is this message's)
-- returns 1
""",
    """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], tostring(now + tonumber(ARGV[4])) .. '|' .. ARGV[2])
if ARGV[5] == '1' then redis.call('DEL', KEYS[3]) end
return 1
""",
)

RENEW_LUA = lua(
    """
-- Extend a solve's lease.  A released lease is never brought back: a late poll of a
-- solve that already gave its slot back must not take a thread again.
-- KEYS[1] = slots
-- ARGV[1] = lease id, ARGV[2] = lease ms
-- returns 1 if the lease was held and is extended, 0 if there was none
""",
    """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
""",
)

IN_RATE_LUA = lua(
    """
-- Sliding-window budget for in.php requests, account wide.
-- KEYS[1] = window (zset: request id -> time, ms), KEYS[2] = hourly counts (hash)
-- ARGV[1] = window ms, ARGV[2] = requests allowed per window, ARGV[3] = request id
-- returns 0 when the request may go now (it is counted), else ms to wait
""",
    IN_RATE_FN,
    """
return in_rate(KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])
""",
)

RES_RATE_LUA = lua(
    """
-- Budget for res.php requests: at most per_captcha * captchas + base per hour.
-- KEYS[1] = hourly counts (hash, as in IN_RATE)
-- ARGV[1] = requests allowed per captcha submitted, ARGV[2] = base allowance
-- ARGV[3] = requests this call makes
-- returns 0 when the requests may go now (they are counted), else ms to wait (an HTTP
--   429's Retry-After holds every request of the account)
""",
    IN_RATE_FN,
    """
local pause = paused(KEYS[1])
if pause > 0 then return pause end
local hour = math.floor(now / 3600000)
local sent = tonumber(redis.call('HGET', KEYS[1], 'res:' .. hour) or '0')
local made = tonumber(redis.call('HGET', KEYS[1], 'in:' .. hour) or '0')
local n = tonumber(ARGV[3])
if sent + n <= tonumber(ARGV[1]) * made + tonumber(ARGV[2]) then
  redis.call('HINCRBY', KEYS[1], 'res:' .. hour, n)
  redis.call('PEXPIRE', KEYS[1], 3 * 3600000)
  return 0
end
return (hour + 1) * 3600000 - now
""",
)


PAUSE_LUA = lua(
    """
-- The API answered HTTP 429: hold every in.php and res.php request of the account.
-- KEYS[1] = hourly request counts (hash; field 'pause' = until when, ms)
-- ARGV[1] = ms to hold (a later hold already set is kept)
-- returns ms the account is held from now
""",
    """
local until_ms = now + tonumber(ARGV[1])
local current = tonumber(redis.call('HGET', KEYS[1], 'pause') or '0')
if until_ms > current then
  redis.call('HSET', KEYS[1], 'pause', until_ms)
  redis.call('PEXPIRE', KEYS[1], math.max(3 * 3600000, until_ms - now))
  return until_ms - now
end
return current - now
""",
)


EXTERNAL_LUA = lua(
    """
-- The provider's view of threads: those it counts working beyond the slots we hold belong
-- to another client of the key.  They take slots of their own ('external:1..N', expiring
-- with the view), so every admission and handout leaves them alone.
-- KEYS[1] = slots, KEYS[2] = external count (string with a TTL)
-- ARGV[1] = the provider's working threads, ARGV[2] = ms the view holds
-- ARGV[3] = most threads to give up (the rest stays usable, to find out when they free)
-- returns {external before, external now, slots we hold}
""",
    """
local before = tonumber(redis.call('GET', KEYS[2]) or '0')
for i = 1, before do redis.call('ZREM', KEYS[1], 'external:' .. i) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local ours = redis.call('ZCARD', KEYS[1])
local other = math.max(0, math.min(tonumber(ARGV[1]) - ours, tonumber(ARGV[3])))
for i = 1, other do redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), 'external:' .. i) end
if other > 0 then
  redis.call('SET', KEYS[2], other, 'PX', tonumber(ARGV[2]))
else
  redis.call('DEL', KEYS[2])
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
class Parked:
    """A submit handed out by the limiter: its lease id and job."""

    lease_id: str
    job: dict[str, Any]


@dataclass(frozen=True)
class Handout:
    """Submits owed a task message: ``given`` hold a slot now; ``expired`` passed their
    deadline while parked (their submit fails them)."""

    given: list[Parked]
    expired: list[Parked]

    def all(self) -> list[Parked]:
        return [*self.given, *self.expired]


AdmitStatus = Literal["go", "wait", "parked", "cancelled", "done", "busy"]


@dataclass(frozen=True)
class Swept:
    """What one housekeeping sweep handed out: parked submits given a slot (or expired),
    submits whose message was lost (``lost``), and solve messages that never started
    (``unstarted``: the solve id and the message's keyword arguments)."""

    handout: Handout
    lost: list[Parked]
    unstarted: list[Parked]


@dataclass(frozen=True)
class Admission:
    """What :meth:`ThreadLimiter.admit` decided; ``wait_s`` with ``"wait"`` and ``"busy"``;
    with ``"cancelled"``, the parked submits handed the slot it gave back."""

    status: AdmitStatus
    wait_s: float = 0.0
    handout: Handout | None = None


@dataclass(frozen=True)
class LimiterConfig:
    capacity: int
    #: Slots refills may never take (on-demand solves get them).
    reserve: int
    lease_s: float
    in_per_window: int = 60
    in_window_s: float = 3.0
    res_per_captcha: int = 20
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

    @property
    def refill_capacity(self) -> int:
        return max(0, self.capacity - self.reserve)


class ThreadLimiter:
    """Slots, parking, owed messages and request budgets of one account."""

    def __init__(self, r: redis.Redis, keys: Keys, config: LimiterConfig) -> None:
        self.r = r
        self.keys = keys
        self.config = config
        self._admit = script(r, ADMIT_LUA)
        self._release = script(r, RELEASE_LUA)
        self._sweep = script(r, SWEEP_LUA)
        self._renew = script(r, RENEW_LUA)
        self._expect = script(r, EXPECT_LUA)
        self._owe = script(r, OWE_LUA)
        self._in_rate = script(r, IN_RATE_LUA)
        self._res_rate = script(r, RES_RATE_LUA)
        self._pause = script(r, PAUSE_LUA)
        self._external = script(r, EXTERNAL_LUA)

    def slot_keys(self) -> list[str]:
        """slots, parked, waiting, dispatch: the keys of every handout."""
        k = self.keys
        return [k.slots(), k.parked(), k.waiting(), k.dispatch()]

    def handout_args(self) -> list[Arg]:
        """lease ms, capacity, refill capacity, most handed out, band, grace ms."""
        cfg = self.config
        return [
            ms(cfg.lease_s),
            cfg.capacity,
            cfg.refill_capacity,
            cfg.max_handout,
            REFILL_BAND,
            ms(cfg.dispatch_grace_s),
        ]

    def admit(
        self,
        job: Mapping[str, Any],
        *,
        deadline_in_s: float,
        refill: bool = False,
        batch_id: str | None = None,
        submitting: bool = True,
        message_id: str = "",
        redelivered: bool = False,
    ) -> Admission:
        """Admit a submit of ``job`` (see ``ADMIT_LUA``); parks the job if no slot is free.

        ``message_id`` is the task message asking: a message ``redelivered`` after its
        worker died finds the claim it took itself and goes on.  With ``submitting`` False only
        the slot is taken (no in.php budget, no claim)."""
        cfg, k = self.config, self.keys
        solve_id = str(job["solve_id"])
        keys = [
            *self.slot_keys()[:3],
            k.parked_seq(),
            k.dispatch(),
            k.submission(solve_id),
            k.submit_claim(solve_id),
            k.batch_cancelled(batch_id or "-"),
            k.rate("in"),
            k.rate("hourly"),
            k.requested(),
            k.requested_messages(),
        ]
        args: list[Arg] = [
            solve_id,
            ms(cfg.lease_s),
            cfg.refill_capacity if refill else cfg.capacity,
            REFILL if refill else ON_DEMAND,
            _dumps(job),
            ms(max(0.0, deadline_in_s)),
            REFILL_BAND,
            int(job.get("attempt", 0)),
            ms(cfg.claim_s) if submitting else 0,
            ms(cfg.in_window_s),
            cfg.in_per_window if submitting else 0,
            "1" if batch_id else "0",
            uuid.uuid4().hex,
            message_id or uuid.uuid4().hex,
            "1" if redelivered else "0",
            cfg.capacity,
            cfg.refill_capacity,
            cfg.max_handout,
            ms(cfg.dispatch_grace_s),
        ]
        reply = _guarded(lambda: self._admit(keys=keys, args=args))
        handout = Handout(handed(reply[2][0]), handed(reply[2][1])) if len(reply) > 2 else None
        return Admission(text(reply[0]), int(reply[1]) / 1000, handout)  # type: ignore[arg-type]

    def acquire(
        self, lease_id: str, *, job: Mapping[str, Any], deadline_in_s: float, refill: bool = False
    ) -> bool:
        """Take a slot for ``lease_id`` (True), or park ``job`` until one frees (False)."""
        admitted = self.admit(
            {**job, "solve_id": lease_id},
            deadline_in_s=deadline_in_s,
            refill=refill,
            submitting=False,
        )
        return admitted.status == "go"

    def unclaim(self, solve_id: str) -> None:
        """Give up the submit claim (the in.php call failed and will be retried)."""
        _guarded(lambda: self.r.delete(self.keys.submit_claim(solve_id)))

    def release(self, lease_id: str | None) -> Handout:
        """Free ``lease_id``'s slot (None: only hand out free slots) and hand slots to the
        oldest parked submits; the caller publishes a submit for each handed-out job."""
        args: list[Arg] = [lease_id or "", *self.handout_args()]
        given, expired = _guarded(lambda: self._release(keys=self.slot_keys(), args=args))
        return Handout(handed(given), handed(expired))

    def sweep(self, tick_s: float, solve_queue: str, most: int = 500) -> Swept | None:
        """Reclaim expired leases, hand out parked submits, and hand out again the submits
        and solves whose message was lost; None when another process swept within
        ``tick_s``."""
        k = self.keys
        keys = [*self.slot_keys(), k.housekeeping_lock()]
        keys += [k.requested(), k.requested_messages(), solve_queue]
        args: list[Arg] = [max(1, ms(tick_s)), *self.handout_args(), most]
        args.append(ms(self.config.message_grace_s))
        reply = _guarded(lambda: self._sweep(keys=keys, args=args))
        if int(reply[0]) == 0:
            return None
        unstarted = handed(reply[4])
        return Swept(Handout(handed(reply[1]), handed(reply[2])), handed(reply[3]), unstarted)

    def expect(self, solve_id: str, message: Mapping[str, Any]) -> None:
        """A solve message is about to be published: wait for it to start (``ADMIT``), and
        publish it again from :meth:`sweep` if it is lost on its way to a worker."""
        k = self.keys
        keys = [k.requested(), k.requested_messages()]
        args: list[Arg] = [solve_id, _dumps(message), ms(self.config.message_grace_s)]
        _guarded(lambda: self._expect(keys=keys, args=args))

    def owe(self, job: Mapping[str, Any], countdown_s: float, *, unclaim: bool) -> None:
        """The submit of ``job`` is published again after ``countdown_s``: owe it, so that
        :meth:`sweep` hands it out again if that message is lost (and give up the submit
        claim unless another message holds it)."""
        solve_id = str(job["solve_id"])
        k = self.keys
        keys = [k.dispatch(), k.waiting(), k.submit_claim(solve_id)]
        due = ms(countdown_s + self.config.dispatch_grace_s)
        deadline = ms(max(0.0, float(job["deadline"]) - time.time()))
        args: list[Arg] = [solve_id, _dumps(job), due, deadline, "1" if unclaim else "0"]
        _guarded(lambda: self._owe(keys=keys, args=args))

    def renew(self, lease_id: str) -> bool:
        """Extend a solve's lease; False if it holds none (released or long expired)."""
        args: list[Arg] = [lease_id, ms(self.config.lease_s)]
        return bool(_guarded(lambda: self._renew(keys=[self.keys.slots()], args=args)))

    def in_use(self) -> int:
        """Slots our solves hold right now (expired leases and another client's threads
        not counted)."""
        held, external = _guarded(self._count_live)
        return max(0, held - external)

    def external(self) -> int:
        """Provider threads another client of the key holds, as last seen."""
        return int(_guarded(lambda: self.r.get(self.keys.external_threads())) or 0)

    def check_due(self, every_s: float) -> bool:
        """True once per ``every_s`` for the whole deployment: time to look at the
        provider's thread count."""
        key = self.keys.threads_check_lock()
        return bool(_guarded(lambda: self.r.set(key, "1", nx=True, px=ms(every_s))))

    def see_provider(self, working_threads: int, hold_s: float) -> Drift:
        """Take the provider's count of working threads: any beyond the slots we hold are
        another client's, and our usable threads shrink by them for ``hold_s`` (or until
        the next look)."""
        keys = [self.keys.slots(), self.keys.external_threads()]
        args: list[Arg] = [working_threads, ms(hold_s), max(0, self.config.capacity - 1)]
        before, now, ours = _guarded(lambda: self._external(keys=keys, args=args))
        return Drift(int(before), int(now), int(ours))

    def _count_live(self) -> tuple[int, int]:
        seconds, micros = self.r.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        pipe = self.r.pipeline(transaction=False)
        pipe.zcount(self.keys.slots(), now_ms + 1, "+inf")
        pipe.get(self.keys.external_threads())
        held, external = pipe.execute()
        return int(held), min(int(held), int(external or 0))

    def free_for_refills(self) -> int:
        held, _ = _guarded(self._count_live)
        return max(0, self.config.refill_capacity - held - self.parked_count())

    def parked_count(self) -> int:
        return int(_guarded(lambda: self.r.zcard(self.keys.parked())))

    def owed_count(self) -> int:
        """Submits handed out whose message has not started yet."""
        return int(_guarded(lambda: self.r.zcard(self.keys.dispatch())))

    def submit_wait(self) -> float:
        """0 when an ``in.php`` request may go now (it is counted); else seconds to wait."""
        cfg = self.config
        keys = [self.keys.rate("in"), self.keys.rate("hourly")]
        args: list[Arg] = [ms(cfg.in_window_s), cfg.in_per_window, uuid.uuid4().hex]
        return int(_guarded(lambda: self._in_rate(keys=keys, args=args))) / 1000

    def pause(self, seconds: float) -> float:
        """Hold every ``in.php`` and ``res.php`` request of the account for ``seconds``
        (an HTTP 429's ``Retry-After``); returns the seconds it is held from now."""
        keys = [self.keys.rate("hourly")]
        return int(_guarded(lambda: self._pause(keys=keys, args=[ms(seconds)]))) / 1000

    def poll_wait(self, requests: int = 1) -> float:
        """0 when ``requests`` ``res.php`` calls may go now (counted); else seconds to wait."""
        cfg = self.config
        args: list[Arg] = [cfg.res_per_captcha, cfg.res_base, requests]
        keys = [self.keys.rate("hourly")]
        return int(_guarded(lambda: self._res_rate(keys=keys, args=args))) / 1000


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"))


def handed(flat: list[Any]) -> list[Parked]:
    """A script's flat ``id, job, id, job, ...`` list as values."""
    items = [text(x) for x in flat]
    return [Parked(items[i], json.loads(items[i + 1])) for i in range(0, len(items), 2)]


def _guarded(call: Callable[[], T]) -> T:
    return guard(call, "nothing is submitted until it is back")
