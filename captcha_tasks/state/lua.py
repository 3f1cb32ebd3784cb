"""Shared plumbing of the Redis-state modules: Lua scripts registered once per client,
the Lua prologue every script starts with, and Redis outages turned into
:class:`~captcha_tasks.errors.StoreUnavailable`.

Every script says what its ``KEYS`` and ``ARGV`` are and what it returns in a header, and
is built with :func:`lua`, which puts :data:`NOW_MS` first: ``now`` is always the Redis
server's clock in ms, never a host's.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.commands.core import Script

from ..connections import UNREACHABLE
from ..errors import StoreUnavailable
from ..settings import get_settings, mask_url

T = TypeVar("T")

#: Lua prologue: ``now`` in ms on the Redis server's clock.
NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_SCRIPTS: weakref.WeakKeyDictionary[Any, dict[str, Script]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def lua(header: str, *body: str) -> str:
    """A script's source: its header (the KEYS / ARGV / returns comment), ``now``, then
    the shared functions and the body it is made of."""
    return header.strip("\n") + "\n" + NOW_MS + "".join(body)


def script(r: redis.Redis, source: str) -> Script:
    """``source`` registered once per client, however many objects use it (redis-py's
    ``Script`` runs EVALSHA and reloads the script after a server restart)."""
    with _LOCK:
        per_client = _SCRIPTS.setdefault(r, {})
        if source not in per_client:
            per_client[source] = r.register_script(source)
        return per_client[source]


def guard(call: Callable[[], T], what: str = "") -> T:
    """Run a Redis call; an unreachable Redis fails closed with a clear error."""
    try:
        return call()
    except UNREACHABLE as exc:
        raise unavailable(exc, what) from None


def unavailable(exc: BaseException, what: str = "") -> StoreUnavailable:
    """The error for a Redis call that failed with ``exc``: it names REDIS_URL (every
    handle of :mod:`.store` is built from it), password masked, and redis-py's reason."""
    suffix = f": {what}" if what else ""
    url = mask_url(get_settings().redis_url)
    return StoreUnavailable(
        f"Redis is down or REDIS_URL is wrong (REDIS_URL={url}; {type(exc).__name__}: {exc})"
        + suffix
    )


def text(value: Any) -> str:
    """A reply value as ``str`` (clients without ``decode_responses`` return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def ms(seconds: float) -> int:
    return int(seconds * 1000)
