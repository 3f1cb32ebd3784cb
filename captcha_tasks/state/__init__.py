"""Shared state in Redis: everything many workers on many hosts must agree on.

Redis only: nothing here imports Celery or the tasks.  Each module owns one kind of state
behind a small class, with one Lua script per atomic operation (:mod:`.lua`), and talks
to Redis through a :class:`~.db.Db` (a client and the key names).

:class:`State` is all of it as one value, built from the settings in one place
(:meth:`State.build`) and handed to whatever needs it: the worker's runner, the receiver,
the CLI, the exporter, the asyncio API and the Kafka bridge.  Tests build their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import Redis

from ..connections import redis_client
from ..keys import Keys
from ..settings import Settings
from .batches import BatchStreams
from .board import Board, BoardConfig
from .budgets import TenantBudgets
from .db import Db
from .followups import Followups
from .limiter import LimiterConfig, ThreadLimiter
from .pools import PoolStore
from .proxies import ProxyLeases
from .records import Records
from .secrets import RequestSecrets
from .stats import Stats
from .timing import SolveTimes, TimingConfig

__all__ = ["Db", "State"]

#: Seconds past the solve timeout a finished solve's record is kept (duplicate messages
#: arrive at most a visibility timeout or two later).
RECORD_MARGIN_S = 600


@dataclass(frozen=True)
class State:
    """The Redis state of one deployment, built from its settings."""

    db: Db
    limiter: ThreadLimiter
    board: Board
    pools: PoolStore
    proxies: ProxyLeases
    secrets: RequestSecrets
    batches: BatchStreams
    solve_times: SolveTimes
    stats: Stats
    records: Records
    followups: Followups
    budgets: TenantBudgets

    @property
    def keys(self) -> Keys:
        return self.db.keys

    @property
    def redis(self) -> Redis:
        return self.db.redis

    @classmethod
    def build(cls, settings: Settings, client: Redis | None = None) -> State:
        """Every state object for ``settings``, on ``client`` (default: a new client from
        ``REDIS_URL``).  No I/O: nothing talks to Redis until it is used."""
        db = Db(client if client is not None else redis_client(settings), Keys(settings.key_prefix))
        limiter = ThreadLimiter(db, limiter_config(settings))
        board = board_config(settings)
        return cls(
            db=db,
            limiter=limiter,
            board=Board(db, limiter, board),
            pools=PoolStore(db, declared=settings.pools),
            proxies=ProxyLeases(db, quarantine_s=settings.proxy_cooloff),
            secrets=RequestSecrets(db),
            batches=BatchStreams(db),
            solve_times=SolveTimes(db, timing_config(settings)),
            stats=Stats(db),
            records=Records(db),
            followups=Followups(db, board.followup_grace_s),
            budgets=TenantBudgets(db),
        )


def limiter_config(settings: Settings) -> LimiterConfig:
    return LimiterConfig(
        capacity=settings.capacity,
        reserve=settings.refill_reserve,
        lease_s=settings.slot_lease,
        in_per_window=settings.submit_rate,
        claim_s=settings.connect_timeout + settings.read_timeout + 10,
        message_grace_s=settings.visibility_timeout + 10,
        tenants=settings.tenants,
    )


def board_config(settings: Settings) -> BoardConfig:
    return BoardConfig(
        round_gap_s=settings.bulk_window_s,
        round_hold_s=settings.connect_timeout + settings.read_timeout + 5,
        record_ttl_s=int(settings.solve_timeout + 2 * settings.visibility_timeout)
        + RECORD_MARGIN_S,
        # longer than running a follow-up takes, shorter than a caller's patience
        followup_grace_s=settings.visibility_timeout / 2,
    )


def timing_config(settings: Settings) -> TimingConfig:
    return TimingConfig(
        poll_interval=settings.poll_interval,
        min_samples=settings.adaptive_min_samples,
        percentile=settings.adaptive_percentile,
        initial_wait=settings.initial_wait,
    )
