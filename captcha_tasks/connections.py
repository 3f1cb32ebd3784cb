"""Every Redis connection of captcha-tasks, built from the settings in one place.

``REDIS_URL`` is the broker, the result backend and the state store at once.  This module
turns it into each client a process needs:

* :func:`redis_client`: the state layer's redis-py client (sync);
* :func:`async_redis_client`: a ``redis.asyncio`` client for :mod:`captcha_tasks.aio`;
* :func:`celery_options`: Celery's broker URL, result backend and the transport options
  of both (and RedBeat's), for :mod:`captcha_tasks.worker.config`.

No other module calls ``Redis.from_url``: a new way to reach Redis is added here, once,
and every process gets it.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

from .settings import Settings, mask_url

#: Seconds to wait for a connection, and for a reply, of the state layer's client.
CONNECT_TIMEOUT_S = 5
SOCKET_TIMEOUT_S = 10
HEALTH_CHECK_S = 30

#: What redis-py raises when nothing (or no Redis) answers at the URL, or it refuses the
#: password: not answering, timing out, or a server that does not speak the protocol.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.InvalidResponse)


def redis_client(settings: Settings) -> redis.Redis:
    """The state layer's client (replies decoded to ``str``)."""
    return redis.Redis.from_url(
        settings.redis_url,
        decode_responses=True,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=HEALTH_CHECK_S,
        retry_on_timeout=True,
    )


def async_redis_client(settings: Settings, **options: Any) -> aioredis.Redis:
    """A ``redis.asyncio`` client.  No socket timeout: pub/sub readers and ``XREAD BLOCK``
    wait on purpose (``options`` add to or override the defaults).  Said explicitly:
    redis-py 8 reads with a 5 s timeout by default, which breaks a blocking read that
    waits as long; redis-py 5 applies any socket timeout to pub/sub reads too."""
    kwargs: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": None,
        "socket_keepalive": True,
        **options,
    }
    return aioredis.Redis.from_url(settings.redis_url, **kwargs)


def celery_options(settings: Settings) -> dict[str, Any]:
    """Celery's settings that say where Redis is: the broker and result backend URLs and
    the transport options of each, and RedBeat's URL and options."""
    visibility = settings.visibility_timeout
    return {
        "broker_url": settings.redis_url,
        "result_backend": settings.redis_url,
        "broker_transport_options": {
            "visibility_timeout": visibility,
            "unacked_restore_interval": max(1, int(visibility / 12)),
            "unacked_restore_throttle": 1,
        },
        "result_backend_transport_options": {"retry_policy": {"timeout": 5.0}},
        "redbeat_redis_url": settings.redis_url,
        "redbeat_redis_options": {},
    }


def describe(r: redis.Redis) -> str:
    """Where client ``r`` looks for Redis, as a URL with its password masked (for error
    messages and logs)."""
    pool = r.connection_pool
    service = getattr(pool, "service_name", None)
    if service:
        return f"sentinel master {service!r}"
    kw = pool.connection_kwargs
    if "path" in kw:
        return f"unix://{kw['path']}"
    scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
    auth = ""
    if kw.get("username") or kw.get("password"):
        auth = f"{kw.get('username') or ''}:{kw.get('password') or ''}@"
    url = f"{scheme}://{auth}{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
    return mask_url(url)
