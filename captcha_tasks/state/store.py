"""Per-process handles on the shared parts: the Redis client, the key names, the API client.

Each is created lazily, once per process (worker child processes reset them after fork).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import redis

from ..client import CaptchaAIClient, Timeout
from ..errors import ConfigurationError
from ..keys import Keys
from ..settings import Settings, get_settings
from .limiter import LimiterConfig, ThreadLimiter
from .polling import AnswerBoard, Poller

if TYPE_CHECKING:
    from .pools import PoolStore
    from .proxies import ProxyPool


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """The process's Redis client for captcha-tasks' own state (not Celery's)."""
    return connect(get_settings())


def connect(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(
        settings.redis_url,
        decode_responses=True,
        socket_connect_timeout=5,
        socket_timeout=10,
        health_check_interval=30,
        retry_on_timeout=True,
    )


@lru_cache(maxsize=1)
def keys() -> Keys:
    return Keys(get_settings().key_prefix)


@lru_cache(maxsize=1)
def api_client() -> CaptchaAIClient:
    """The worker process's API client: one pooled HTTP session, key from settings."""
    settings = get_settings()
    if not settings.api_key:
        raise ConfigurationError("CAPTCHAAI_API_KEY is not set on this worker")
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
    )
    return ThreadLimiter(redis_client(), keys(), config)


@lru_cache(maxsize=1)
def pools() -> PoolStore:
    from .pools import PoolStore

    return PoolStore(redis_client(), keys())


@lru_cache(maxsize=1)
def proxies() -> ProxyPool:
    from .proxies import ProxyPool

    return ProxyPool(redis_client(), keys(), quarantine_s=get_settings().proxy_cooloff)


@lru_cache(maxsize=1)
def answer_board() -> AnswerBoard:
    return AnswerBoard(redis_client(), keys(), get_settings().bulk_window_s)


@lru_cache(maxsize=1)
def poller() -> Poller:
    from ..worker.tasks import finished_elsewhere, pass_baton

    settings = get_settings()
    return Poller(
        answer_board(),
        api_client(),
        limiter(),
        finished_elsewhere,
        pass_baton,
        poll_interval=settings.poll_interval,
        bulk=settings.bulk_poll == "auto",
    )


def reset() -> None:
    """Drop every cached handle (after fork, or when settings change)."""
    for cached in (redis_client, keys, api_client, limiter, pools, proxies, answer_board, poller):
        cached.cache_clear()
