"""Per-process handles on the shared parts: the Redis client, the key names, the API
client and the state objects built on them.

Each is created lazily, once per process; :func:`reset` drops them (a forked worker child
must not share its parent's sockets, and tests change settings).
"""

from __future__ import annotations

from functools import lru_cache

import redis

from .. import connections
from ..client import CaptchaAIClient, Timeout
from ..errors import ConfigurationError
from ..keys import Keys
from ..settings import Settings, get_settings
from .batches import BatchStreams
from .board import Board, BoardConfig
from .limiter import LimiterConfig, ThreadLimiter
from .lua import guard
from .pools import PoolStore
from .proxies import ProxyPool
from .secrets import RequestSecrets
from .timing import SolveTimes, TimingConfig

#: Seconds past the solve timeout a finished solve's record is kept (duplicate messages
#: arrive at most a visibility timeout or two later).
RECORD_MARGIN_S = 600


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """The process's Redis client for captcha-tasks' own state (not Celery's)."""
    return connect(get_settings())


def connect(settings: Settings) -> redis.Redis:
    return connections.redis_client(settings)


def ping() -> None:
    """Raise :class:`~captcha_tasks.errors.StoreUnavailable` (naming REDIS_URL) unless
    Redis answers: a command checks before it creates files or starts anything."""
    guard(redis_client().ping, "nothing was sent")


@lru_cache(maxsize=1)
def keys() -> Keys:
    return Keys(get_settings().key_prefix)


@lru_cache(maxsize=1)
def api_client() -> CaptchaAIClient:
    """The worker process's API client: one pooled HTTP session, key from settings."""
    settings = get_settings()
    if not settings.api_key:
        raise ConfigurationError(
            "CAPTCHAAI_API_KEY is not set: the API calls of workers and of "
            "`captcha-tasks account` need the account key"
        )
    return CaptchaAIClient(
        settings.base_url,
        settings.api_key,
        timeout=Timeout(settings.connect_timeout, settings.read_timeout),
    )


@lru_cache(maxsize=1)
def limiter() -> ThreadLimiter:
    """The account's thread limiter (its Lua scripts registered once per process)."""
    settings = get_settings()
    config = LimiterConfig(
        capacity=settings.capacity,
        reserve=settings.refill_reserve,
        lease_s=settings.slot_lease,
        in_per_window=settings.submit_rate,
        claim_s=settings.connect_timeout + settings.read_timeout + 10,
        message_grace_s=settings.visibility_timeout + 10,
    )
    return ThreadLimiter(redis_client(), keys(), config)


@lru_cache(maxsize=1)
def board() -> Board:
    """The captchas at the provider, their polls and every solve's completion."""
    settings = get_settings()
    config = BoardConfig(
        round_gap_s=settings.bulk_window_s,
        round_hold_s=settings.connect_timeout + settings.read_timeout + 5,
        record_ttl_s=int(settings.solve_timeout + 2 * settings.visibility_timeout)
        + RECORD_MARGIN_S,
    )
    return Board(redis_client(), keys(), limiter(), config)


@lru_cache(maxsize=1)
def solve_times() -> SolveTimes:
    settings = get_settings()
    config = TimingConfig(
        poll_interval=settings.poll_interval,
        min_samples=settings.adaptive_min_samples,
        percentile=settings.adaptive_percentile,
        initial_wait=settings.initial_wait,
    )
    return SolveTimes(redis_client(), keys(), config)


@lru_cache(maxsize=1)
def pools() -> PoolStore:
    """The token pools.  The pools this process's ``CAPTCHAAI_POOLS`` declares are
    registered on first use: the variable counts in every process that reads it (a
    worker, beat, a ``captcha-tasks`` command, an app calling ``solve``)."""
    pool_store = PoolStore(redis_client(), keys())
    for spec in get_settings().pools:
        pool_store.register(spec)
    return pool_store


@lru_cache(maxsize=1)
def proxies() -> ProxyPool:
    return ProxyPool(redis_client(), keys(), quarantine_s=get_settings().proxy_cooloff)


@lru_cache(maxsize=1)
def batches() -> BatchStreams:
    return BatchStreams(redis_client(), keys())


@lru_cache(maxsize=1)
def secrets() -> RequestSecrets:
    return RequestSecrets(redis_client(), keys())


def reset() -> None:
    """Drop every cached handle (after fork, or when settings change)."""
    for cached in (
        redis_client,
        keys,
        api_client,
        limiter,
        board,
        solve_times,
        pools,
        proxies,
        batches,
        secrets,
    ):
        cached.cache_clear()
