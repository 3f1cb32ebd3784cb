"""Which broker transport and result backend a Redis URL selects: kombu's Redis transports
(one Redis, and Redis behind Sentinel) with one fault of kombu's closed, the result
backend each uses (``get()`` waits out an outage), and the Sentinel one on connections that
follow the master.  The classes are in the Celery boundary
(:mod:`.celery_compat.transport`, :mod:`.celery_compat.backend`); this module only names them.
"""

from __future__ import annotations

#: ``broker_transport`` of our Celery app (schemes ``redis://`` and ``rediss://``).
TRANSPORT = "captcha_tasks.worker.celery_compat.transport:Transport"
#: ``broker_transport`` for a ``sentinel://`` broker URL.
SENTINEL_TRANSPORT = "captcha_tasks.worker.celery_compat.transport:SentinelTransport"
#: The result backend class for a ``sentinel://`` URL (Celery's ``<class>+<url>`` form)...
SENTINEL_BACKEND = "captcha_tasks.worker.celery_compat.transport:SentinelBackend"
#: ... and for ``redis://`` and ``rediss://``.
REDIS_BACKEND = "captcha_tasks.worker.celery_compat.backend:RedisBackend"


def transport(broker_url: str) -> str | None:
    """Our ``broker_transport`` for ``broker_url`` (None: kombu's own, for unix sockets)."""
    if broker_url.startswith(("redis://", "rediss://")):
        return TRANSPORT
    if broker_url.startswith("sentinel://"):
        return SENTINEL_TRANSPORT
    return None


def backend_url(url: str) -> str:
    """Our ``result_backend`` for ``url``: Celery's Redis backend whose ``get()`` waits out
    an outage (:mod:`.celery_compat.backend`), behind Sentinel on connections that follow
    the master; unix sockets keep Celery's own."""
    if url.startswith("sentinel://"):
        return f"{SENTINEL_BACKEND}+{url}"
    if url.startswith(("redis://", "rediss://")):
        return f"{REDIS_BACKEND}+{url}"
    return url
