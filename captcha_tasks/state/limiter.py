"""The account-wide thread limiter and request-rate budget, shared through Redis.

A *slot* is one provider thread.  It belongs to a captcha (its lease id is the solve's
id), is taken before ``in.php`` and given back when the answer (or a failure) is seen.
Every lease has an expiry on the Redis server's clock that each poll renews, so a slot
whose worker died comes back by itself.

A submit that finds no free slot is *parked*: its task message is stored in Redis and the
task ends (no worker blocks, no countdown spins).  Releasing a slot hands it at once to the
oldest parked submit — on-demand solves before pool refills — and returns the parked
messages for the caller to publish.  Refills may not take the last ``reserve`` slots.

All of this is one Lua script per operation, so many hosts behave as one client.
With Redis unreachable every call raises :class:`~captcha_tasks.errors.StoreUnavailable`:
the limiter fails closed and nothing is submitted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from ..keys import Keys
from .lua import NOW_MS, guard, script, text

T = TypeVar("T")
Arg = str | int | float

ON_DEMAND = 0
REFILL = 1
#: Parked refills sort after every parked on-demand submit.
_REFILL_BAND = 10**12

_NOW_MS = NOW_MS

ACQUIRE_LUA = (
    """
-- Take a slot for a captcha, or park its submit in arrival order.
-- KEYS[1] = slots (zset: lease id -> lease expiry, ms, server clock)
-- KEYS[2] = parked (zset: lease id -> arrival order; refills banded after on-demand)
-- KEYS[3] = parked payloads (hash: lease id -> "<deadline ms>|<payload>")
-- KEYS[4] = parked sequence (counter)
-- ARGV[1] = lease id
-- ARGV[2] = lease length, ms
-- ARGV[3] = capacity for this request's class (refills: capacity minus the reserve)
-- ARGV[4] = class: 0 on demand, 1 refill
-- ARGV[5] = payload stored if parked
-- ARGV[6] = ms until the caller's deadline
-- ARGV[7] = refill band offset
-- returns {status, slots in use}: 1 acquired, 2 already held (renewed), 0 parked
"""
    + _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  return {2, redis.call('ZCARD', KEYS[1])}
end
local used = redis.call('ZCARD', KEYS[1])
local refill = tonumber(ARGV[4]) == 1
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local ahead = false
if first[1] then
  ahead = refill or tonumber(first[2]) < tonumber(ARGV[7])
end
if (not ahead) and used < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  return {1, used + 1}
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local seq = redis.call('INCR', KEYS[4])
  local band = 0
  if refill then band = tonumber(ARGV[7]) end
  redis.call('ZADD', KEYS[2], seq + band, ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], tostring(now + tonumber(ARGV[6])) .. '|' .. ARGV[5])
end
return {0, used}
"""
)

RELEASE_LUA = (
    """
-- Give a slot back and hand free slots to the oldest parked submits.
-- KEYS[1] = slots, KEYS[2] = parked, KEYS[3] = parked payloads (as in ACQUIRE)
-- ARGV[1] = lease id to release ('' to only hand out free slots)
-- ARGV[2] = lease length for the parked submits that get a slot, ms
-- ARGV[3] = capacity, ARGV[4] = capacity for refills
-- ARGV[5] = most parked submits to hand out
-- ARGV[6] = refill band offset
-- returns {dispatched, dropped}: flat lists of id, payload, id, payload, ...
--   dispatched now hold a slot; dropped had passed their deadline (no slot taken)
"""
    + _NOW_MS
    + """
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[1]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local used = redis.call('ZCARD', KEYS[1])
local dispatched, dropped = {}, {}
local budget = tonumber(ARGV[5])
while budget > 0 do
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if not first[1] then break end
  local id = first[1]
  local cap = tonumber(ARGV[3])
  if tonumber(first[2]) >= tonumber(ARGV[6]) then cap = tonumber(ARGV[4]) end
  local raw = redis.call('HGET', KEYS[3], id)
  local deadline, payload = 0, ''
  if raw then
    local sep = string.find(raw, '|', 1, true)
    deadline = tonumber(string.sub(raw, 1, sep - 1))
    payload = string.sub(raw, sep + 1)
  end
  if raw and deadline > now and used >= cap then break end
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  if raw and deadline > now then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    used = used + 1
    table.insert(dispatched, id)
    table.insert(dispatched, payload)
    budget = budget - 1
  elseif raw then
    table.insert(dropped, id)
    table.insert(dropped, payload)
  end
end
return {dispatched, dropped}
"""
)

RENEW_LUA = (
    """
-- Extend a captcha's lease.  A released lease is never brought back: a late poll of a
-- captcha whose slot a bulk poll already gave back must not take a thread again.
-- KEYS[1] = slots
-- ARGV[1] = lease id, ARGV[2] = lease length, ms
-- returns 1 if the lease was held and is extended, 0 if there was none
"""
    + _NOW_MS
    + """
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
"""
)

IN_RATE_LUA = (
    """
-- Sliding-window budget for in.php requests, account wide.
-- KEYS[1] = window (zset: request id -> time, ms)
-- KEYS[2] = hourly counts (hash: "in:<hour>" / "res:<hour>" -> count)
-- ARGV[1] = window, ms; ARGV[2] = requests allowed per window; ARGV[3] = request id
-- returns 0 when the request may go now (it is counted), else ms to wait
"""
    + _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
  local hour = math.floor(now / 3600000)
  redis.call('HINCRBY', KEYS[2], 'in:' .. hour, 1)
  redis.call('HDEL', KEYS[2], 'in:' .. (hour - 2), 'res:' .. (hour - 2))
  redis.call('PEXPIRE', KEYS[2], 3 * 3600000)
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(1, tonumber(oldest[2]) + tonumber(ARGV[1]) - now)
"""
)

RES_RATE_LUA = (
    """
-- Budget for res.php requests: at most per_captcha * captchas + base per hour.
-- KEYS[1] = hourly counts (hash, as in IN_RATE)
-- ARGV[1] = requests allowed per captcha submitted; ARGV[2] = base allowance
-- ARGV[3] = requests this call makes
-- returns 0 when the requests may go now (they are counted), else ms to wait
"""
    + _NOW_MS
    + """
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
"""
)


@dataclass(frozen=True)
class Parked:
    """A parked submit handed a slot (``dispatched``) or dropped at its deadline."""

    lease_id: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Handout:
    dispatched: list[Parked]
    dropped: list[Parked]


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

    @property
    def refill_capacity(self) -> int:
        return max(0, self.capacity - self.reserve)


class ThreadLimiter:
    """Slots, parking and request budgets of one account, for one Redis client."""

    def __init__(self, r: redis.Redis, keys: Keys, config: LimiterConfig) -> None:
        self.r = r
        self.keys = keys
        self.config = config
        self._acquire = script(r, ACQUIRE_LUA)
        self._release = script(r, RELEASE_LUA)
        self._renew = script(r, RENEW_LUA)
        self._in_rate = script(r, IN_RATE_LUA)
        self._res_rate = script(r, RES_RATE_LUA)

    def _slot_keys(self) -> list[str]:
        k = self.keys
        return [k.slots(), k.parked(), k.parked_payloads(), k.parked_seq()]

    def acquire(
        self, lease_id: str, *, payload: dict[str, Any], deadline_in_s: float, refill: bool = False
    ) -> bool:
        """Take a slot for ``lease_id`` (True), or park ``payload`` until one frees (False)."""
        cfg = self.config
        cap = cfg.refill_capacity if refill else cfg.capacity
        args: list[Arg] = [
            lease_id,
            _ms(cfg.lease_s),
            cap,
            REFILL if refill else ON_DEMAND,
            json.dumps(payload, separators=(",", ":")),
            _ms(max(0.0, deadline_in_s)),
            _REFILL_BAND,
        ]
        status, _ = _guarded(lambda: self._acquire(keys=self._slot_keys(), args=args))
        return int(status) != 0

    def release(self, lease_id: str | None, max_handout: int = 100) -> Handout:
        """Free ``lease_id``'s slot (None: only hand out free slots) and hand slots to
        the oldest parked submits; the caller publishes ``dispatched`` payloads."""
        cfg = self.config
        args: list[Arg] = [
            lease_id or "",
            _ms(cfg.lease_s),
            cfg.capacity,
            cfg.refill_capacity,
            max_handout,
            _REFILL_BAND,
        ]
        dispatched, dropped = _guarded(lambda: self._release(keys=self._slot_keys()[:3], args=args))
        return Handout(_pairs(dispatched), _pairs(dropped))

    def renew(self, lease_id: str) -> bool:
        """Extend a captcha's lease; False if it holds none (released or long expired)."""
        args: list[Arg] = [lease_id, _ms(self.config.lease_s)]
        return bool(_guarded(lambda: self._renew(keys=[self.keys.slots()], args=args)))

    def in_use(self) -> int:
        """Slots held right now (expired leases not counted)."""
        return int(_guarded(lambda: self._count_live()))

    def _count_live(self) -> int:
        t = self.r.time()
        now_ms = int(t[0]) * 1000 + int(t[1]) // 1000
        return int(self.r.zcount(self.keys.slots(), now_ms + 1, "+inf"))

    def free_for_refills(self) -> int:
        return max(0, self.config.refill_capacity - self.in_use() - self.parked_count())

    def parked_count(self) -> int:
        return int(_guarded(lambda: self.r.zcard(self.keys.parked())))

    def submit_wait(self) -> float:
        """0 when an ``in.php`` request may go now (it is counted); else seconds to wait."""
        cfg = self.config
        keys = [self.keys.rate("in"), self.keys.rate("hourly")]
        args: list[Arg] = [_ms(cfg.in_window_s), cfg.in_per_window, uuid.uuid4().hex]
        return int(_guarded(lambda: self._in_rate(keys=keys, args=args))) / 1000

    def poll_wait(self, requests: int = 1) -> float:
        """0 when ``requests`` ``res.php`` calls may go now (counted); else seconds to wait."""
        cfg = self.config
        args: list[Arg] = [cfg.res_per_captcha, cfg.res_base, requests]
        keys = [self.keys.rate("hourly")]
        return int(_guarded(lambda: self._res_rate(keys=keys, args=args))) / 1000


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _pairs(flat: list[Any]) -> list[Parked]:
    items = [text(x) for x in flat]
    return [Parked(items[i], json.loads(items[i + 1])) for i in range(0, len(items), 2)]


def _guarded(call: Callable[[], T]) -> T:
    return guard(call, "nothing is submitted until it is back")
