"""Token pools: pre-solved tokens kept ready so a caller gets one instantly.

A pool holds tokens for one (method, sitekey, pageurl, action / version).  Tokens are
single-use and short-lived (~120 s reCAPTCHA, ~300 s Turnstile), so each one sits in a
sorted set scored by its *own* expiry on the Redis server's clock; a take atomically
drops expired tokens (counted as waste), hands out the soonest-expiring usable one and
removes it, so every token goes to exactly one caller even across hosts.

Pools are declared in ``CAPTCHAAI_POOLS`` (see :mod:`captcha_tasks.core.poolspec`) and
registered in Redis; :meth:`PoolStore.plan` tells the refiller how many solves to start now.  Wiring
into the Celery tasks and beat lives elsewhere.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ..core.poolspec import ENV_VAR, POOLABLE_METHODS, PoolSpec, parse_pools
from ..errors import PoolNotFound, ValidationError
from ..methods import METHODS, SolveRequest
from .db import Db
from .lua import Script

__all__ = [
    "ENV_VAR",
    "POOLABLE_METHODS",
    "PoolNotFound",
    "PoolSpec",
    "PoolStore",
    "parse_pools",
]

T = TypeVar("T")

#: Seconds of take history kept for the take rate.
TAKE_HISTORY_S = 600.0
DEFAULT_RATE_WINDOW_S = 60.0
#: A pool younger than this still has its rate measured over this long, so the first
#: take after a reset does not read as an enormous rate.
MIN_RATE_WINDOW_S = 1.0
#: Safety margin of the refill target used by :meth:`PoolStore.status` by default.
DEFAULT_MARGIN_S = 5.0
#: Parsed pool definitions kept per store.
PARSED_CACHE = 256
#: Seconds :meth:`PoolStore.find` reuses the definitions it read.
LIST_FRESH_S = 1.0


# -- Lua: one script per atomic operation (see :mod:`.lua`) ------------------------------
REGISTER = Script("pools/register")
ADD = Script("pools/add")
TAKE = Script("pools/take")
REFILL_STARTED = Script("pools/refill_started")
SWEEP = Script("pools/sweep")
SNAPSHOT = Script("pools/snapshot")
RESET_STATS = Script("pools/reset_stats")


# -- the store --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    live: int
    covered: int
    inflight: int
    window_takes: int
    window_ms: int
    added: int
    taken: int
    expired: int
    misses: int

    @property
    def take_rate(self) -> float:
        return self.window_takes * 1000 / self.window_ms if self.window_ms > 0 else 0.0

    @property
    def cold(self) -> bool:
        return self.taken + self.misses == 0


class PoolStore:
    """Pool definitions, tokens, refills in flight and counters in Redis.

    ``r`` must be created with ``decode_responses=True``.  Redis being unreachable raises
    :class:`~captcha_tasks.errors.StoreUnavailable`.
    """

    def __init__(
        self,
        db: Db,
        clock: Callable[[], float] = time.monotonic,
        declared: Sequence[PoolSpec] = (),
    ) -> None:
        """``declared``: the pools this process's settings declare (``CAPTCHAAI_POOLS``),
        registered the first time the store is used: the variable counts in every process
        that reads it (a worker, beat, a ``captcha-tasks`` command, an app calling
        ``solve``)."""
        self._declared = tuple(declared)
        self.db = db
        self.r = db.redis
        self.keys = db.keys
        self._clock = clock
        self._listed: tuple[float, list[PoolSpec]] = (-math.inf, [])
        self._register = db.bind(REGISTER)
        self._add = db.bind(ADD)
        self._take = db.bind(TAKE)
        self._refill_started = db.bind(REFILL_STARTED)
        self._sweep = db.bind(SWEEP)
        self._snapshot = db.bind(SNAPSHOT)
        self._reset_stats = db.bind(RESET_STATS)
        self._parsed: dict[str, PoolSpec] = {}

    def _keys(self, name: str) -> dict[str, str]:
        k = self.keys
        return {
            "registry": k.pool_registry(),
            "tokens": k.pool_tokens(name),
            "stats": k.pool_stats(name),
            "inflight": k.pool_inflight(name),
            "takes": k.pool_takes(name),
        }

    # -- definitions -------------------------------------------------------------------

    def register(self, spec: PoolSpec) -> bool:
        """Declare ``spec`` (True if the pool is new).

        Redefining a pool to solve something else (another sitekey, pageurl or extras)
        drops its tokens: they would not pass for the new definition.
        """
        old = self._identity(spec.name)
        drop = old is not None and old != json.dumps(spec.solve_kwargs(), sort_keys=True)
        keys = self._keys(spec.name)
        args = {"name": spec.name, "definition": _dumps(spec.to_dict()), "drop": drop}
        self._listed = (-math.inf, [])
        return int(self._guard(lambda: self._register(keys, args))) == 1

    def _identity(self, name: str) -> str | None:
        """The stored pool's solve kwargs as canonical JSON (None: not registered)."""
        raw = self._raw(name)
        if raw is None:
            return None
        try:
            return json.dumps(_load(raw).solve_kwargs(), sort_keys=True)
        except (ValueError, TypeError):
            return ""  # unreadable: treat as different so its tokens are dropped

    def unregister(self, name: str) -> bool:
        """Forget a pool with its tokens, refills and counters (True if it existed)."""
        self._listed = (-math.inf, [])
        k = self.keys
        pipe = self.r.pipeline(transaction=True)
        pipe.hdel(k.pool_registry(), name)
        pipe.delete(k.pool_tokens(name), k.pool_inflight(name))
        pipe.delete(k.pool_stats(name), k.pool_takes(name))
        removed, *_ = self._guard(pipe.execute)
        return int(removed) == 1

    def get(self, name: str) -> PoolSpec:
        """The pool's definition; :class:`PoolNotFound` if it is not declared."""
        raw = self._raw(name)
        if raw is None:
            raise _not_found(name)
        return _load(raw)

    def _raw(self, name: str) -> str | None:
        return cast("str | None", self._guard(lambda: self.r.hget(self.keys.pool_registry(), name)))

    def all(self) -> list[PoolSpec]:
        """Every declared pool, by name."""
        raw = cast("dict[str, str]", self._guard(lambda: self.r.hgetall(self.keys.pool_registry())))
        return [self._parse(raw[name]) for name in sorted(raw)]

    def _parse(self, raw: str) -> PoolSpec:
        # Validating a definition builds a solve request: parse each stored one once.
        spec = self._parsed.get(raw)
        if spec is None:
            if len(self._parsed) >= PARSED_CACHE:
                self._parsed.clear()
            spec = self._parsed[raw] = _load(raw)
        return spec

    def find(self, request: SolveRequest) -> PoolSpec | None:
        """The first pool (by name) whose tokens answer ``request``, if any.

        Every solve asks, so the definitions are read at most once per
        :data:`LIST_FRESH_S` per store: a pool declared elsewhere serves this process's
        solves within that time."""
        if request.per_request:
            return None
        listed_at, specs = self._listed
        now = self._clock()
        if now - listed_at >= LIST_FRESH_S:
            specs = self.all()
            self._listed = (now, specs)
        return next((spec for spec in specs if spec.matches(request)), None)

    # -- tokens ------------------------------------------------------------------------

    def add(self, name: str, token: Mapping[str, Any], life_s: float) -> bool:
        """Pool a solved token (the solve outcome dict) with ``life_s`` seconds to live.

        The life is capped at the pool's ``ttl``.  False (nothing stored) when the token
        is already dead or already pooled.
        """
        if not life_s > 0:
            return False
        args = {"name": name, "record": _dumps(dict(token)), "life_s": float(life_s)}
        status = int(self._guard(lambda: self._add(self._keys(name), args)))
        if status < 0:
            raise _not_found(name)
        return status == 1

    def take(self, name: str, min_remaining_s: float | None = None) -> dict[str, Any] | None:
        """Take the soonest-expiring token with at least ``min_remaining_s`` seconds left
        (default: the pool's ``min_remaining``), or None (a miss).

        The token dict gains ``remaining_s``: its seconds of life left, server clock.
        """
        if min_remaining_s is not None and not min_remaining_s >= 0:
            raise ValidationError(f"min_remaining_s must be >= 0, got {min_remaining_s!r}")
        args: dict[str, Any] = {"name": name, "history_s": TAKE_HISTORY_S}
        if min_remaining_s is not None:
            args["min_s"] = float(min_remaining_s)
        keys = self._keys(name)
        raw, held = self._guard(lambda: self.db.fenced(lambda c: self._take(keys, args, c)))
        reply = list(raw)
        status = int(reply[0])
        if status < 0:
            raise _not_found(name)
        if status == 0:
            return None
        if not held:
            # Behind Sentinel, a take no replica holds may be lost with its master, and
            # the token handed out again from the new one: never deliver it (a miss).
            return None
        record: dict[str, Any] = json.loads(reply[1])
        record["remaining_s"] = int(reply[2]) / 1000
        return record

    def live(self, name: str, min_remaining_s: float = 0) -> int:
        """Tokens with at least ``min_remaining_s`` seconds of life left."""
        return self._snap(name, min_life_s=min_remaining_s).covered

    def sweep(self, name: str) -> int:
        """Drop expired tokens, counting them as waste; returns how many."""
        swept = int(self._guard(lambda: self._sweep(self._keys(name), {"name": name})))
        if swept < 0:
            raise _not_found(name)
        return swept

    # -- refills in flight -------------------------------------------------------------

    def refill_started(self, name: str, refill_id: str, timeout_s: float) -> None:
        """Count a refill solve as in flight for at most ``timeout_s`` seconds."""
        if not timeout_s > 0:
            raise ValidationError(f"timeout_s must be > 0, got {timeout_s!r}")
        args = {"name": name, "refill": refill_id, "timeout_s": float(timeout_s)}
        if int(self._guard(lambda: self._refill_started(self._keys(name), args))) < 0:
            raise _not_found(name)

    def refill_finished(self, name: str, refill_id: str) -> bool:
        """The refill landed or failed: stop counting it (False if it was not counted)."""
        removed = self._guard(lambda: self.r.zrem(self.keys.pool_inflight(name), refill_id))
        return int(removed) == 1

    def inflight(self, name: str) -> int:
        """Refill solves in flight whose timeout has not passed (stale ones are dropped)."""
        return self._snap(name).inflight

    # -- demand, status and planning ---------------------------------------------------

    def take_rate(self, name: str, window_s: float = DEFAULT_RATE_WINDOW_S) -> float:
        """Takes (hits and misses) per second over the last ``window_s`` seconds, or over
        the pool's age when it is younger (at least ``MIN_RATE_WINDOW_S``)."""
        if not window_s > 0:
            raise ValidationError(f"window_s must be > 0, got {window_s!r}")
        return self._snap(name, window_s=min(window_s, TAKE_HISTORY_S)).take_rate

    def status(
        self,
        name: str,
        *,
        solve_time_s: float | None = None,
        margin_s: float = DEFAULT_MARGIN_S,
    ) -> dict[str, Any]:
        """Counters and sizes of one pool.  ``live`` excludes expired tokens; ``expired``
        counts those dropped so far by :meth:`take` and :meth:`sweep`.

        ``target`` is :meth:`plan`'s target for ``solve_time_s`` (default: the method's
        usual first-poll wait) and ``margin_s``.
        """
        spec = self.get(name)
        solve = METHODS[spec.method].initial_wait if solve_time_s is None else solve_time_s
        snap = self._snap(name, min_life_s=spec.min_remaining + solve)
        attempts = snap.taken + snap.misses
        return {
            "name": spec.name,
            "target": _target(spec, snap, solve, margin_s),
            "size": spec.size,
            "live": snap.live,
            "inflight": snap.inflight,
            "added": snap.added,
            "taken": snap.taken,
            "expired": snap.expired,
            "misses": snap.misses,
            "hit_rate": snap.taken / attempts if attempts else None,
            "waste": snap.expired / snap.added if snap.added else None,
            "take_rate": snap.take_rate,
        }

    def plan(self, name: str, *, solve_time_s: float, margin_s: float, free_slots: int) -> int:
        """How many refill solves to dispatch now (0 .. ``free_slots``).

        Target: ``size`` while the pool has no take history, else enough tokens for the
        measured take rate over one solve plus the margin (1 .. ``size``).  Covered: live
        tokens that will still be usable when a refill started now lands, plus refills
        already in flight.
        """
        if not (solve_time_s >= 0 and margin_s >= 0):
            raise ValidationError("solve_time_s and margin_s must be >= 0")
        spec = self.get(name)
        snap = self._snap(name, min_life_s=spec.min_remaining + solve_time_s)
        target = _target(spec, snap, solve_time_s, margin_s)
        return max(0, min(target - snap.covered - snap.inflight, free_slots))

    def lock_top_up(self, name: str, hold_s: float = 5.0) -> bool:
        """Take the right to top ``name`` up now (one top-up of a pool at a time, for at
        most ``hold_s``); False when another process holds it."""
        key = self.keys.pool_prewarm_lock(name)
        return bool(self._guard(lambda: self.r.set(key, "1", nx=True, px=int(hold_s * 1000))))

    def unlock_top_up(self, name: str) -> None:
        key = self.keys.pool_prewarm_lock(name)
        self._guard(lambda: self.r.delete(key))

    def reset_stats(self, name: str) -> None:
        """Zero the counters and take history (tests, benchmarks); tokens stay."""
        self._guard(lambda: self._reset_stats(self._keys(name)))

    def _snap(
        self, name: str, *, min_life_s: float = 0.0, window_s: float = DEFAULT_RATE_WINDOW_S
    ) -> _Snapshot:
        args = {
            "name": name,
            "min_life_s": max(0.0, float(min_life_s)),
            "window_s": float(window_s),
            "min_window_s": MIN_RATE_WINDOW_S,
        }
        reply = [int(x) for x in self._guard(lambda: self._snapshot(self._keys(name), args))]
        if reply[0] < 0:
            raise _not_found(name)
        return _Snapshot(*reply[1:])

    def ensure_declared(self) -> None:
        """Register the pools the settings declare, once (see ``declared``)."""
        declared, self._declared = self._declared, ()
        try:
            for spec in declared:
                self.register(spec)
        except BaseException:
            self._declared = declared  # not registered: the next use tries again
            raise

    def _guard(self, call: Callable[[], T]) -> T:
        if self._declared:
            self.ensure_declared()
        return self.db.guard(call, "pools unavailable")


def _target(spec: PoolSpec, snap: _Snapshot, solve_time_s: float, margin_s: float) -> int:
    if snap.cold:
        # No demand measured yet: fill the pool so the first callers hit.
        return spec.size
    # The epsilon keeps float noise (3 * 0.1 = 0.30000000000000004) from adding a token.
    want = math.ceil(snap.take_rate * (solve_time_s + margin_s) - 1e-9)
    return max(1, min(spec.size, want))


def _load(raw: str) -> PoolSpec:
    return PoolSpec.from_dict(json.loads(raw), source="pool registry")


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _not_found(name: str) -> PoolNotFound:
    return PoolNotFound(f"pool {name!r} is not declared")
