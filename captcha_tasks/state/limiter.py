"""A provider's thread limiter and request budgets, shared through Redis.

There is one :class:`ThreadLimiter` per provider (its keys scoped by the provider, see
:meth:`~captcha_tasks.state.keys.Keys.scoped`); what follows is about one of them.

A *slot* is one provider thread.  It belongs to a solve (its lease id is the solve's id),
is taken before ``in.php`` and given back when the solve ends.  Every lease has an expiry
on the Redis server's clock that polls renew, so a slot whose worker died comes back by
itself.

A submit that finds no free slot is *parked*: its job waits in Redis and the task ends
(no worker blocks, nothing spins).  Parked submits wait in their *lane*
(:mod:`captcha_tasks.core.lanes`), in one queue per tenant.  Releasing a slot hands it at once
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
handed-out submit is *owed a task message*: its job stays in Redis until that message
starts, and housekeeping hands it out again if the message never shows (the worker that
should have published it died).  What is owed is the deployment's, at every provider
alike (:mod:`.owed`).  Nothing Redis hands out exists only in one process's memory.

Each slot and parked submit has an owner (lane, tenant, when it was asked for), and the
slots held and submits parked are counted per lane and tenant (what metrics and
``captcha-tasks tenants`` show, and what ``max_threads`` is checked against), as is the
wait from request to thread.  Housekeeping checks those counts against the slots and
parked submits (:meth:`ThreadLimiter.tick`), and rebuilds them when they disagree
(submits parked by a version without lanes join the interactive lane, or the background
one for refills).

A submit that must wait for a request budget (the provider's ``in.php`` window, its
NO_SLOT budget, an HTTP 429) or a back-off after an error is *deferred*: its job waits in
Redis until its time, and housekeeping hands it out then (as many as the budget lets go:
their requests are counted at the handout), with no task message in between.  One waiting
for a budget gives its slot back meanwhile (the budget, not the threads, is what it waits
for); one backing off keeps it.  A provider whose circuit is open (see :mod:`.circuits`)
admits nothing.

All of this is Lua (:mod:`.lua`), so many hosts behave as one client.  The slots, the
queues and the handout are Lua functions of this module (``lib/slots.lua``,
``lib/handout.lua``, ``lib/rates.lua``) that the board's scripts call too, with the keys
:meth:`ThreadLimiter.lua_keys` names.  An admission is a chain of three scripts in one
round trip (``limiter/admit_gate``: may the message go on; ``admit_slot``: keep, take or
wait for a slot; ``admit_charge``: claim the right to call ``in.php`` and count the
request), each acting only on the mark the one before left in the solve's record, so a
process that dies between them, or another copy of the message admitted at the same time,
leaves nothing half done.  Jobs are opaque JSON strings here.  With Redis unreachable
every call raises :class:`~captcha_tasks.errors.StoreUnavailable`: the limiter fails
closed and nothing is submitted.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from .. import faults
from ..core.admission import Admission, Handout, Parked
from ..core.lanes import DEFAULT_TENANT, INTERACTIVE, Tenant, check_lane, is_tenant_name
from ..errors import ValidationError
from .budgets import budget_keys
from .db import Db
from .lua import Call, Script, ms, text
from .owed import OwedConfig, OwedMessages, owed_keys, parked_list
from .records import record_keys

__all__ = [
    "Admission",
    "Drift",
    "Handout",
    "LaneUse",
    "LimiterConfig",
    "Parked",
    "ThreadLimiter",
    "Ticked",
    "WaitTimes",
]

T = TypeVar("T")

#: Refills parked by a version without lanes sorted after on-demand submits by this much
#: (the sweep moves them to the background lane).
REFILL_BAND = 10**12
#: Upper bounds (s) of the wait-time buckets: from request to thread.
WAIT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
#: One script per operation (see :mod:`.lua`); ``limiter/admit_*`` and the housekeeping
#: steps are chains, sent in one round trip each.
ADMIT_GATE = Script("limiter/admit_gate")
ADMIT_SLOT = Script("limiter/admit_slot")
ADMIT_CHARGE = Script("limiter/admit_charge")
WAIT_FOR_BUDGET = Script("limiter/wait_for_budget")
RELEASE = Script("limiter/release")
REPAIR = Script("limiter/repair")
HAND_OUT = Script("limiter/hand_out")
HAND_OUT_DEFERRED = Script("limiter/hand_out_deferred")
EVACUATE = Script("limiter/evacuate")
DEFER = Script("limiter/defer")
NO_SLOT = Script("limiter/no_slot")
RES_RATE = Script("limiter/res_rate")
PAUSE = Script("limiter/pause")
EXTERNAL = Script("limiter/external")


@dataclass(frozen=True)
class Drift:
    """What a look at the provider's thread count found: threads another client holds,
    before and now, and the slots we hold."""

    before: int
    now: int
    ours: int


@dataclass(frozen=True)
class Ticked:
    """What housekeeping did at one provider: parked submits given a slot (or expired)
    and deferred submits whose time came, all owed a message."""

    handout: Handout
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
    #: Seconds between two warnings that a budget, not threads, holds submits back.
    warn_every_s: float = 600.0
    #: The tenants sharing the account (weights, caps, budgets); undeclared: weight 1.
    tenants: Mapping[str, Tenant] = field(default_factory=dict)

    @property
    def refill_capacity(self) -> int:
        """Slots the background lane (pool refills) may fill."""
        return max(0, self.capacity - self.reserve)


@dataclass(frozen=True)
class _Ask:
    """One admission, as :meth:`ThreadLimiter.admit` was asked for it."""

    solve_id: str
    job: str
    attempt: int
    deadline_in_s: float
    lane: str
    tenant: str
    asked_at: float | None
    batch_id: str | None

    @property
    def deadline_ms(self) -> int:
        return ms(max(0.0, self.deadline_in_s))


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
    """Slots, lanes, parking, deferrals and request budgets of one provider.

    ``db`` carries the provider's scoped key names; ``provider`` is its name (its
    circuit's key)."""

    def __init__(self, db: Db, config: LimiterConfig, provider: str = "captchaai") -> None:
        self.db = db
        self.keys = db.keys
        self.config = config
        self.provider = provider
        self._gate = db.bind(ADMIT_GATE)
        self._slot = db.bind(ADMIT_SLOT)
        self._charge = db.bind(ADMIT_CHARGE)
        self._wait_for_budget = db.bind(WAIT_FOR_BUDGET)
        self._release = db.bind(RELEASE)
        self._repair = db.bind(REPAIR)
        self._hand_out = db.bind(HAND_OUT)
        self._hand_out_deferred = db.bind(HAND_OUT_DEFERRED)
        self._evacuate = db.bind(EVACUATE)
        self._defer = db.bind(DEFER)
        self._no_slot = db.bind(NO_SLOT)
        self._res_rate = db.bind(RES_RATE)
        self._pause = db.bind(PAUSE)
        self._external = db.bind(EXTERNAL)
        self._owed = OwedMessages(db, OwedConfig(dispatch_grace_s=config.dispatch_grace_s))
        self._tenants_table = {n: self._tenant_entry(t) for n, t in config.tenants.items()}
        self._lua_keys = MappingProxyType(dict(self._key_names()))

    # -- what other modules' scripts pass to this module's Lua functions ---------------
    def lua_keys(self) -> Mapping[str, str]:
        """The keys of ``lib/slots.lua``, ``lib/handout.lua`` and ``lib/rates.lua`` at this
        provider, and of what they call (``lib/owed.lua``, ``lib/budget.lua``), by name."""
        return self._lua_keys

    def _key_names(self) -> Mapping[str, str]:
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
            "rate_in": k.rate("in"),
            "rate_hourly": k.rate("hourly"),
            **budget_keys(k),
            **owed_keys(k),
        }

    def lua_handout(self, extra_lease_s: float = 0.0) -> dict[str, Any]:
        """The handout table ``H`` of ``lib/slots.lua`` (``extra_lease_s`` lengthens
        leases)."""
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
        """The budget table ``R`` of ``lib/rates.lua``."""
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
        """Admit a submit of ``job`` in ``lane`` for ``tenant``: keep or take its solve's
        slot and claim the right to call ``in.php`` for this attempt, or park the job if no
        slot is free or others go first (unless ``park_limit`` submits are parked already:
        then ``"full"``), or defer it if a budget holds it back.

        ``asked_at`` (Unix time) is when its caller asked for the solve: its wait for a
        thread is counted from then (default: now).  ``message_id`` is the task message
        asking: a message ``redelivered`` after its worker died finds the claim it took
        itself and goes on.  ``result``: the caller's result key, what it says while the
        solve is parked, and for how long (s).

        One round trip (the chain ``limiter/admit_gate``, ``admit_slot``,
        ``admit_charge``); a second one when the submit must wait for a budget (its slot
        goes back: ``limiter/wait_for_budget``) or must leave this provider."""
        check_lane(lane)
        if not is_tenant_name(tenant):  # it goes into '|'-joined names in Redis
            raise ValidationError(f"{tenant!r} cannot name a tenant")
        ask = _Ask(solve_id, job, attempt, deadline_in_s, lane, tenant, asked_at, batch_id)
        chain = self.db.chain()
        chain.add(list, *self._admit_calls(ask, message_id, redelivered, result, park_limit))
        (replies,), held = self._guarded(lambda: self.db.run_chain(chain, fenced=True))
        gate, slot, charge = replies
        status = text(gate[0])
        if status != "open":
            return self._not_admitted(ask, status, int(gate[1]))
        at_slot, handout = text(slot[0]), handed_out(slot[1])
        if at_slot == "skip":  # another copy of the message is being admitted right now
            return Admission("busy", self.config.claim_s, handout)
        if at_slot not in ("held", "took"):
            return Admission(at_slot, handout=handout)  # type: ignore[arg-type]
        return self._charged(ask, charge, handout, held)

    def _admit_calls(
        self,
        ask: _Ask,
        message_id: str,
        redelivered: bool,
        result: tuple[str, str, int] | None,
        park_limit: int | None,
    ) -> list[Call]:
        k = self.keys
        keys = {
            **self.lua_keys(),
            **record_keys(k, ask.solve_id),
            "circuit": k.circuit(self.provider),
            "budget_waits": k.budget_waits(),
            "parked_seq": k.parked_seq(),
            "cancelled": k.batch_cancelled(ask.batch_id or "-"),
            "result": result[0] if result else k.submission(ask.solve_id),
        }
        token, message_id = uuid.uuid4().hex, message_id or uuid.uuid4().hex
        gate = {
            "id": ask.solve_id,
            "attempt": ask.attempt,
            "message_id": message_id,
            "redelivered": redelivered,
            "batch": ask.batch_id is not None,
            "token": token,
        }
        slot = self._slot_args(ask, token, park_limit)
        charge = self._charge_args(ask, token, message_id, result)
        return [
            self._gate.call(keys, gate),
            self._slot.call(keys, slot),
            self._charge.call(keys, charge),
        ]

    def _slot_args(self, ask: _Ask, token: str, park_limit: int | None) -> dict[str, Any]:
        """ADMIT's slot script's arguments: who asks, in which lane, until when."""
        slot: dict[str, Any] = {
            "token": token,
            "id": ask.solve_id,
            "lane": ask.lane,
            "tenant": ask.tenant,
            "job": ask.job,
            "deadline_ms": ask.deadline_ms,
            "handout": self.lua_handout(),
        }
        if ask.asked_at is not None:  # else now, on the Redis server's clock
            slot["asked_ms"] = ms(ask.asked_at)
        if park_limit is not None:
            slot["park_limit"] = max(0, park_limit)
        return slot

    def _charge_args(
        self, ask: _Ask, token: str, message_id: str, result: tuple[str, str, int] | None
    ) -> dict[str, Any]:
        """ADMIT's charge script's arguments: the budgets and the tenant's daily cap."""
        charge: dict[str, Any] = {
            "token": token,
            "id": ask.solve_id,
            "attempt": ask.attempt,
            "tenant": ask.tenant,
            "message_id": message_id,
            "claim_ms": ms(self.config.claim_s),
            "budgets": self.lua_budgets(),
            "request_id": uuid.uuid4().hex,
            "warn_every_ms": ms(self.config.warn_every_s),
        }
        daily = self._tenants_table.get(ask.tenant, {}).get("daily")
        if daily is not None:
            charge["daily"] = daily
        if result:
            charge.update(parked_record=result[1], record_ttl_s=result[2])
        return charge

    def _not_admitted(self, ask: _Ask, status: str, wait_ms: int) -> Admission:
        """What the gate said (the solve may not go on here), with what it held here freed
        when it leaves: its provider is out of rotation, or its batch was cancelled."""
        if status == "down":
            self._leave(ask.solve_id, forget=False, hand_on=False)
            return Admission("down")
        if status == "cancelled":
            return Admission("cancelled", handout=self._leave(ask.solve_id, True, True))
        return Admission(status, wait_ms / 1000)  # type: ignore[arg-type]

    def _charged(self, ask: _Ask, reply: list[Any], handout: Handout, held: bool) -> Admission:
        """What the charge said of a submit holding its slot."""
        status = text(reply[0])
        if status == "go" and not held:
            # Behind Sentinel, an admission no replica holds may be lost with its master:
            # calling in.php on it could pay twice.  The submit waits, as for an outage.
            raise self.db.unavailable(
                ConnectionError("no replica acknowledged the admission in time"),
                "nothing is submitted until a replica holds it",
            )
        if status in ("skip", "left"):
            # another copy of the message took over the admission after this one's slot
            # step: it goes on with the slot, this copy looks again later
            return Admission("busy", self.config.claim_s, handout)
        if status != "deferred":
            return Admission(status, handout=handout)  # type: ignore[arg-type]
        wait_ms, budget, warn, at = int(reply[1]), text(reply[2]), int(reply[3]) == 1, reply[4]
        faults.point("budget_wait")
        args = {
            "id": ask.solve_id,
            "job": ask.job,
            "deadline_ms": ask.deadline_ms,
            "at": int(at),
            "handout": self.lua_handout(),
        }
        more = handed_out(self._guarded(lambda: self._wait_for_budget(self.lua_keys(), args)))
        both = Handout(handout.given + more.given, handout.expired + more.expired)
        return Admission("deferred", wait_ms / 1000, both, budget, warn)

    def _leave(self, solve_id: str, forget: bool, hand_on: bool) -> Handout:
        args: dict[str, Any] = {"id": solve_id, "forget": forget}
        if hand_on:
            args["handout"] = self.lua_handout()
        return handed_out(self._guarded(lambda: self._release(self.lua_keys(), args)))

    def tick(self) -> Ticked:
        """Housekeeping at this provider (the process that won the tick's sweep runs it
        for every provider): expired leases reclaimed, the lane counts repaired if they
        drifted, parked and deferred submits handed out.  One round trip."""
        keys = self.lua_keys()
        chain = self.db.chain()
        deferred = {
            "most": self.config.max_handout,
            "grace_ms": ms(self.config.dispatch_grace_s),
            "lease_ms": ms(self.config.lease_s),
            "budgets": self.lua_budgets(),
        }
        chain.add(
            list,
            self._repair.call(keys, {"band": REFILL_BAND}),
            self._hand_out.call(keys, {"handout": self.lua_handout()}),
            self._hand_out_deferred.call(keys, deferred),
        )
        (replies,), _ = self._guarded(lambda: self.db.run_chain(chain))
        repaired, parked, later = replies
        slots, due = handed_out(parked), handed_out(later)
        return Ticked(Handout(slots.given + due.given, slots.expired), bool(int(repaired)))

    def evacuate(self, most: int = 500) -> list[Parked]:
        """Hand out every parked and deferred submit (up to ``most``) without a slot: the
        provider is out of rotation and they must go elsewhere."""
        args = {"most": most, "grace_ms": ms(self.config.dispatch_grace_s)}
        return parked_list(self._guarded(lambda: self._evacuate(self.lua_keys(), args)))

    def release(self, solve_id: str) -> Handout:
        """The solve leaves this provider (for another one): free what it holds here."""
        return self._leave(solve_id, forget=False, hand_on=True)

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
            "lease_ms": ms(self.config.lease_s),
            "unclaim": unclaim,
        }
        self._guarded(lambda: self._defer(keys, args))

    def count_no_slot(self) -> None:
        """The provider answered NO_SLOT: count it against its NO_SLOT budget."""
        if self.config.no_slot_ratio > 0:
            self._guarded(lambda: self._no_slot(self.lua_keys(), {}))

    def owe(
        self, solve_id: str, job: str, *, deadline_in_s: float, countdown_s: float, unclaim: bool
    ) -> None:
        """The submit of ``job`` is published again after ``countdown_s``: owe it (see
        :meth:`.owed.OwedMessages.owe`: what it is owed is the deployment's, not this
        provider's)."""
        self._owed.owe(
            solve_id, job, deadline_in_s=deadline_in_s, countdown_s=countdown_s, unclaim=unclaim
        )

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

    def held_slots(self) -> list[str]:
        """The slots we hold now (not another client's): what :meth:`see_provider` counts
        as ours is what was held both before the provider was asked and after."""
        r = self.db.redis
        members = self._guarded(lambda: r.zrange(self.keys.slots(), 0, -1))
        return [m for m in map(text, members) if not m.startswith("external:")]

    def see_provider(
        self, working_threads: int, hold_s: float, held_before: list[str] | None = None
    ) -> Drift:
        """Take the provider's count of working threads: any beyond the slots we hold are
        another client's, and our usable threads shrink by them for ``hold_s`` (or until
        the next look).  ``held_before``: :meth:`held_slots` from before the provider was
        asked; a slot taken since (its captcha maybe not at the provider when it counted)
        is not counted as ours, so another client's threads are never undercounted."""
        keys = self.lua_keys()
        args: dict[str, Any] = {
            "working": working_threads,
            "hold_ms": ms(hold_s),
            "most": max(0, self.config.capacity - 1),
        }
        if held_before is not None:
            args["held_before"] = held_before
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

    def held_s(self) -> float:
        """Seconds an HTTP 429 still holds every request of the account (0: none), read
        without counting a request (``rates.paused`` in ``lib/rates.lua``)."""
        r = self.db.redis

        def read() -> list[Any]:
            pipe = r.pipeline(transaction=False)
            pipe.hget(self.keys.rate("hourly"), "pause")
            pipe.time()
            return list(pipe.execute())

        until, (seconds, micros) = self._guarded(read)
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        return max(0, int(until or 0) - now_ms) / 1000

    def poll_wait(self, requests: int = 1) -> float:
        """0 when ``requests`` ``res.php`` calls may go now (counted); else seconds to wait."""
        cfg = self.config
        per_captcha = -1 if cfg.res_per_captcha is None else cfg.res_per_captcha
        args = {"per_captcha": per_captcha, "base": cfg.res_base, "n": requests}
        return int(self._guarded(lambda: self._res_rate(self.lua_keys(), args))) / 1000

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "nothing is submitted until it is back")


def handed_out(reply: Any) -> Handout:
    """A ``{given, expired}`` reply (``handout.run`` of ``lib/handout.lua``) as a value."""
    return Handout(parked_list(reply[0]), parked_list(reply[1]))
