"""Shared state in Redis: everything many workers on many hosts must agree on.

Redis only: nothing here imports Celery or the tasks.  Each module owns one kind of state
behind a small class, with one Lua script per atomic operation (:mod:`.lua`), and talks
to Redis through a :class:`~.db.Db` (a client and the key names).

:class:`State` is all of it as one value, built from the settings in one place
(:meth:`State.build`) and handed to whatever needs it: the worker's runner, the receiver,
the CLI, the exporter, the asyncio API and the Kafka bridge.  Tests build their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from redis import Redis

from ..core import rounds
from ..core.providers import ProviderSpec
from ..core.timing import TimingConfig
from ..settings import Settings
from .acceptance import AcceptanceStore
from .batches import BatchStreams
from .board import Board, BoardConfig
from .budgets import TenantBudgets
from .channel import CallbackChannel
from .circuits import Circuits
from .connections import redis_client, replica_fence
from .db import Db
from .followups import Followups
from .gateway import GatewayStats, GatewayTickets
from .keys import Keys
from .limiter import LaneUse, LimiterConfig, ThreadLimiter, WaitTimes
from .master_changes import MasterChanges
from .owed import OwedConfig, OwedMessages
from .pools import PoolStore
from .proxies import ProxyLeases
from .records import Records
from .secrets import RequestSecrets
from .stats import Stats
from .timing import SolveTimes

__all__ = ["Db", "ProviderState", "State"]

#: Seconds past the solve timeout a finished solve's record is kept (duplicate messages
#: arrive at most a visibility timeout or two later).
RECORD_MARGIN_S = 600


@dataclass(frozen=True)
class ProviderState:
    """One provider's own state: its thread limiter, its board of captchas (and every
    solve's completion there), its solve times and counters, under keys scoped by it."""

    spec: ProviderSpec
    db: Db
    limiter: ThreadLimiter
    board: Board
    solve_times: SolveTimes
    stats: Stats
    #: How the provider's callbacks are doing, and callbacks that came too early.
    channel: CallbackChannel

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class State:
    """The Redis state of one deployment, built from its settings."""

    db: Db
    #: Every provider's state, the primary first (in the order captchas go to them).
    providers: Mapping[str, ProviderState]
    circuits: Circuits
    #: The messages the deployment is owed, at every provider alike.
    owed: OwedMessages
    pools: PoolStore
    proxies: ProxyLeases
    secrets: RequestSecrets
    batches: BatchStreams
    records: Records
    followups: Followups
    master_changes: MasterChanges
    budgets: TenantBudgets
    #: The gateway's ids and counters (``captcha-tasks gateway``).
    gateway: GatewayTickets
    gateway_stats: GatewayStats
    #: How often each site accepts each provider's tokens (``report``), for the router.
    acceptance: AcceptanceStore

    @property
    def keys(self) -> Keys:
        return self.db.keys

    @property
    def redis(self) -> Redis:
        return self.db.redis

    @property
    def primary(self) -> ProviderState:
        return next(iter(self.providers.values()))

    def provider(self, name: str | None) -> ProviderState:
        """The state of provider ``name`` (None, or a provider no longer configured: the
        primary's)."""
        if name is None:
            return self.primary
        return self.providers.get(name) or self.primary

    # The primary's, as a deployment with one provider knows them.
    @property
    def limiter(self) -> ThreadLimiter:
        return self.primary.limiter

    @property
    def board(self) -> Board:
        return self.primary.board

    @property
    def solve_times(self) -> SolveTimes:
        return self.primary.solve_times

    @property
    def stats(self) -> Stats:
        return self.primary.stats

    @property
    def channel(self) -> CallbackChannel:
        return self.primary.channel

    def lanes(self) -> dict[tuple[str, str], LaneUse]:
        """Slots held and submits parked by (lane, tenant), at every provider together."""
        total: dict[tuple[str, str], LaneUse] = {}
        for at in self.providers.values():
            for where, use in at.limiter.lanes().items():
                was = total.get(where, LaneUse())
                total[where] = LaneUse(was.held + use.held, was.parked + use.parked)
        return dict(sorted(total.items()))

    def wait_times(self) -> dict[tuple[str, str], WaitTimes]:
        """Waits from request to thread by (lane, tenant), at every provider together."""
        total: dict[tuple[str, str], WaitTimes] = {}
        for at in self.providers.values():
            for where, times in at.limiter.wait_times().items():
                was = total.get(where)
                if was is not None:
                    buckets = tuple(a + b for a, b in zip(was.buckets, times.buckets, strict=True))
                    times = WaitTimes(buckets, was.sum_s + times.sum_s, was.count + times.count)
                total[where] = times
        return dict(sorted(total.items()))

    @classmethod
    def build(cls, settings: Settings, client: Redis | None = None) -> State:
        """Every state object for ``settings``, on ``client`` (default: a new client from
        ``REDIS_URL``).  No I/O: nothing talks to Redis until it is used."""
        db = Db(
            client if client is not None else redis_client(settings),
            Keys(settings.redis.key_prefix),
            replica_fence(settings),
        )
        board = board_config(settings)
        providers = {
            spec.name: provider_state(settings, spec, db, board) for spec in settings.providers.all
        }
        names = list(providers)
        return cls(
            db=db,
            providers=providers,
            circuits=Circuits(db, names, settings.providers.circuit_failures),
            owed=OwedMessages(db, owed_config(settings)),
            pools=PoolStore(db, declared=settings.pools.declared),
            proxies=ProxyLeases(db, quarantine_s=settings.proxies.cooloff),
            secrets=RequestSecrets(db),
            batches=BatchStreams(db),
            records=Records(db),
            followups=Followups(db, board.followup_grace_s),
            master_changes=MasterChanges(db),
            budgets=TenantBudgets(db),
            gateway=GatewayTickets(db),
            gateway_stats=GatewayStats(db),
            acceptance=AcceptanceStore(
                db, settings.acceptance.sites, settings.acceptance.half_life
            ),
        )


def provider_state(
    settings: Settings, spec: ProviderSpec, db: Db, board: BoardConfig
) -> ProviderState:
    """One provider's state, under keys scoped by it (the primary's are unscoped)."""
    scoped = replace(db, keys=db.keys.scoped(None if spec.primary else spec.name))
    limiter = ThreadLimiter(scoped, limiter_config(settings, spec), spec.name)
    return ProviderState(
        spec=spec,
        db=scoped,
        limiter=limiter,
        board=Board(scoped, limiter, board),
        solve_times=SolveTimes(scoped, timing_config(settings)),
        stats=Stats(scoped),
        channel=CallbackChannel(scoped),
    )


def limiter_config(settings: Settings, spec: ProviderSpec | None = None) -> LimiterConfig:
    spec = spec or settings.providers.primary
    budgets = spec.budgets
    capacity = spec.capacity
    reserve = (
        settings.pools.refill_reserve(settings.providers.capacity)
        if spec.primary
        else max(1, capacity // 5)
    )
    return LimiterConfig(
        capacity=capacity,
        reserve=min(reserve, capacity),
        lease_s=settings.solving.slot_lease,
        in_per_window=budgets.submit_rate or 0,
        in_window_s=budgets.submit_window_s,
        no_slot_ratio=budgets.no_slot_ratio or 0.0,
        res_per_captcha=budgets.res_per_captcha,
        res_base=budgets.res_base,
        claim_s=settings.providers.connect_timeout + settings.providers.read_timeout + 10,
        tenants=settings.tenants.declared,
    )


def owed_config(settings: Settings) -> OwedConfig:
    # a solve message waits longer than a dead worker's unacknowledged ones take to come back
    return OwedConfig(message_grace_s=settings.celery.visibility_timeout + 10)


def board_config(settings: Settings) -> BoardConfig:
    return BoardConfig(
        round_gap_s=settings.solving.bulk_window_s,
        round_ahead_s=settings.solving.bulk_window_s * rounds.AHEAD_WINDOWS,
        round_hold_s=settings.providers.connect_timeout + settings.providers.read_timeout + 5,
        record_ttl_s=int(settings.solving.solve_timeout + 2 * settings.celery.visibility_timeout)
        + RECORD_MARGIN_S,
        # longer than running a follow-up takes, shorter than a caller's patience
        followup_grace_s=settings.celery.visibility_timeout / 2,
    )


def timing_config(settings: Settings) -> TimingConfig:
    return TimingConfig(
        poll_interval=settings.solving.poll_interval,
        min_samples=settings.solving.adaptive_min_samples,
        percentile=settings.solving.adaptive_percentile,
        initial_wait=settings.solving.initial_wait,
    )
