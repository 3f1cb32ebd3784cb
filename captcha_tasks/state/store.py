"""Deprecated (removed in the next release): per-process handles on the Redis state.

The state is one value now, built from the settings and passed in
(:class:`captcha_tasks.state.State`).  For your own code:

* the Redis client and key names: ``State.build(get_settings())`` (``.redis``, ``.keys``);
* shared cookies and the proxy pool: :mod:`captcha_tasks.toolkit`.

What is left here keeps code written for the last release running, with a warning.
"""

from __future__ import annotations

import warnings
from functools import cache
from typing import TYPE_CHECKING

import redis

from ..connections import redis_client as _connect
from ..keys import Keys
from ..settings import get_settings

if TYPE_CHECKING:
    from ..toolkit.proxies import ProxyPool

__all__ = ["keys", "proxies", "redis_client"]

#: The last release's other handles, undocumented: gone, with an error that says where to.
_REMOVED = frozenset(
    [
        "api_client",
        "batches",
        "board",
        "connect",
        "limiter",
        "ping",
        "pools",
        "reset",
        "secrets",
        "solve_times",
    ]
)


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(
        f"captcha_tasks.store.{name}() is deprecated: use {instead}",
        DeprecationWarning,
        stacklevel=3,
    )


@cache
def _client() -> redis.Redis:
    return _connect(get_settings())


def redis_client() -> redis.Redis:
    """Deprecated: ``State.build(get_settings()).redis``."""
    _deprecated("redis_client", "captcha_tasks.state.State.build(get_settings()).redis")
    return _client()


def keys() -> Keys:
    """Deprecated: ``Keys(get_settings().key_prefix)``."""
    _deprecated("keys", "captcha_tasks.keys.Keys(get_settings().key_prefix)")
    return Keys(get_settings().key_prefix)


def proxies() -> ProxyPool:
    """Deprecated: ``ProxyPool.from_settings()``."""
    _deprecated("proxies", "captcha_tasks.toolkit.proxies.ProxyPool.from_settings()")
    from ..toolkit.proxies import ProxyPool

    return ProxyPool.from_settings()


def __getattr__(name: str) -> object:
    if name in _REMOVED:
        raise AttributeError(
            f"captcha_tasks.store.{name}() was removed: the Redis state is one value now, "
            f"captcha_tasks.state.State.build(get_settings()); see captcha_tasks.toolkit "
            "for cookies and proxies"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
