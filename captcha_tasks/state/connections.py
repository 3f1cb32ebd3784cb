"""Every Redis connection of captcha-tasks, built from the settings in one place.

``REDIS_URL`` is the broker, the result backend and the state store at once: one Redis
(``redis://``, ``rediss://``), or the master a set of sentinels names
(``sentinel://...;sentinel://...`` with ``REDIS_SENTINEL_MASTER``).  This module turns it
into each client a process needs:

* :func:`redis_client`: the state layer's redis-py client (sync);
* :func:`async_redis_client`: a ``redis.asyncio`` client for :mod:`captcha_tasks.aio`;
* :func:`celery_options`: Celery's broker URL, result backend and the transport options
  of both (and RedBeat's), for :mod:`captcha_tasks.worker.config`;
* :func:`sentinels`: the sentinels themselves (discovery, ``SENTINEL`` commands);
* :func:`replica_fence`: whether a write must reach a replica before it is acted on;
* :data:`UNREACHABLE`: what a Redis call raises when Redis is, for us, not there;
* :data:`MASTER_CHANGES`: this process's count of reconnects and of master moves it saw.

No other module calls ``Redis.from_url``: a new way to reach Redis is added here, once,
and every process gets it.

Behind Sentinel every client asks the sentinels where the master is when it connects,
and, through :class:`MasterFollowingConnection`, again at most every :data:`FOLLOW_S`
while it sends: a connection whose master moved reconnects to the new one before it sends
(kombu's broker connections fail the command instead, and kombu reconnects).  Without
that, a graceful ``SENTINEL FAILOVER`` leaves every open connection on the old master,
which keeps accepting writes (later thrown away) until the sentinels demote it some ten
seconds on.  A connection still open to a demoted master gets ``READONLY`` for a write;
redis-py's Sentinel connections turn that into a ``ConnectionError`` and reconnect, and
:data:`UNREACHABLE` counts it as an outage for clients that reach a fixed address.

Replication is asynchronous: what the old master took after the sentinels promoted a
replica (a second or two in a graceful switch) is lost.  A write that money follows (a
submit's admission, before ``in.php``) waits for a replica to hold it (:class:`ReplicaFence`,
``WAIT``) whenever the sentinels count a replica that could be promoted.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelManagedConnection
from redis.backoff import NoBackoff
from redis.connection import SSLConnection
from redis.exceptions import InvalidResponse, ReadOnlyError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from ..settings import RedisSentinel, Settings, mask_url

#: Seconds to wait for a connection, and for a reply, of the state layer's client.
CONNECT_TIMEOUT_S = 5
SOCKET_TIMEOUT_S = 10
HEALTH_CHECK_S = 30
#: Seconds to wait for a sentinel's connection or reply: a dead one is skipped for the
#: next, so it must not hold discovery up for long.
SENTINEL_TIMEOUT_S = 2
#: Seconds RedBeat retries a Redis call before its tick fails (a failover takes a few).
REDBEAT_RETRY_S = 30
#: Seconds between two looks of one client at where the sentinels say the master is.
FOLLOW_S = 0.5
#: Seconds after a master move is seen during which every write that money follows waits
#: for a replica (see :class:`ReplicaFence`): a few looks of every connection.
MOVE_SETTLE_S = 4 * FOLLOW_S

#: What redis-py raises when nothing (or no Redis) answers at the URL, it refuses the
#: password, or a demoted master refuses a write (``READONLY``: the master moved):
#: not answering, timing out, a server that does not speak the protocol.  Each means
#: "Redis is not there for us now: retry", never a failed request.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, InvalidResponse, ReadOnlyError)

_STATE_OPTIONS: dict[str, Any] = {
    "decode_responses": True,
    "socket_connect_timeout": CONNECT_TIMEOUT_S,
    "socket_timeout": SOCKET_TIMEOUT_S,
    "health_check_interval": HEALTH_CHECK_S,
    "retry_on_timeout": True,
}


class MasterFollowingConnection(SentinelManagedConnection):
    """A connection to the master the sentinels name, that follows it when it moves.

    * It asks the sentinels again, at most every :data:`FOLLOW_S` for all the connections
      of its pool, before it sends; when they name another master it closes, and the
      command goes to the new one (or, with :attr:`raise_on_move`, fails with
      ``ConnectionError`` before anything is sent).  Nothing here uses ``WATCH``, which
      such a switch would drop.
    * Reconnecting after a drop asks the sentinels where to go: redis-py reconnects to the
      old address instead (redis-py #3874).
    """

    #: Fail the command instead of sending it to the new master (for a caller that holds
    #: the connection's socket, like kombu's poller).
    raise_on_move = False
    _was_connected = False

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if self._sock is None and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(*args, **kwargs)
        MASTER_CHANGES.connected(self, self.host, self.port)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        pool = self.connection_pool
        if self._sock is not None and pool.is_master:
            if _look_due(pool):
                # No sentinel answering keeps us where we are; a move also drops the
                # pool's idle connections.
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    pool.get_master_address()
            moved = _moved(self, pool.master_address)
            if moved is not None:
                self.disconnect()
                if self.raise_on_move:
                    raise moved
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class MasterFollowingSSLConnection(MasterFollowingConnection, SSLConnection):
    pass


class AsyncMasterFollowingConnection(AsyncSentinelManagedConnection):
    """:class:`MasterFollowingConnection` for ``redis.asyncio``."""

    _was_connected = False

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(*args, **kwargs)
        MASTER_CHANGES.connected(self, self.host, self.port)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        pool = self.connection_pool
        if self.is_connected and pool.is_master:
            if _look_due(pool):
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    await pool.get_master_address()
            if _moved(self, pool.master_address) is not None:
                await self.disconnect()
        await super().send_packed_command(command, check_health)


class AsyncMasterFollowingSSLConnection(AsyncMasterFollowingConnection, AsyncSSLConnection):
    pass


class MasterChangeLog:
    """What this process saw of the master behind Sentinel: reconnects (a connection that
    had been open connects again) and moves (a connection reaches another master than the
    one this process last reached).  Process-local; :meth:`drain` hands the reconnects to
    whoever stores them in Redis (:mod:`captcha_tasks.state.master_changes`) once it answers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._master: tuple[str, int] | None = None
        self._reconnects = 0
        #: Moves seen since the process started: a reader compares it with the value it
        #: last saw to learn that the master changed.
        self.generation = 0

    def connected(self, connection: Any, host: str, port: int) -> None:
        with self._lock:
            if connection._was_connected:
                self._reconnects += 1
            connection._was_connected = True
            if self._master is not None and self._master != (host, port):
                self.generation += 1
            self._master = (host, port)

    @property
    def reconnects(self) -> int:
        """Reconnects since the last drain (left in place: a cheap look before a report)."""
        with self._lock:
            return self._reconnects

    def drain(self) -> int:
        """Reconnects since the last drain (zero after it)."""
        with self._lock:
            count, self._reconnects = self._reconnects, 0
            return count

    def undrain(self, reconnects: int) -> None:
        """Give back reconnects that could not be stored (Redis away)."""
        with self._lock:
            self._reconnects += reconnects


#: This process's :class:`MasterChangeLog` (every following connection reports to it).
MASTER_CHANGES = MasterChangeLog()


def server_address(client: redis.Redis) -> str:
    """Where ``client``'s server is, as the deployment names it: behind Sentinel, the master
    the sentinels named (asked when they were not yet); else REDIS_URL's host and port (or
    socket path).  The same for every process, and across a restart of the same server,
    unlike the address a server sees a connection arrive at (``CLIENT INFO``'s ``laddr``:
    one per network path)."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        host, port = pool.master_address or pool.get_master_address()  # type: ignore[no-untyped-call]
        return f"{host}:{port}"
    where = pool.connection_kwargs
    return str(where.get("path") or f"{where.get('host', 'localhost')}:{where.get('port', 6379)}")


#: Flags of a replica, in the sentinels' view, that cannot take over now: down (a link
#: merely "disconnected" is not: mid-switch, the replica being promoted has left the old
#: master, whose writes must still wait).
_NOT_A_CANDIDATE = {"s_down", "o_down"}
#: Milliseconds a fenced write waits for a replica's acknowledgement.
FENCE_WAIT_MS = 500


class ReplicaFence:
    """Whether a write must reach a replica before it is acted on, and the ``WAIT`` that
    checks it.

    Behind Sentinel a write the old master took after a replica was promoted is lost; so
    is one the new master took before the old one became its replica again (some ten
    seconds after a graceful switch: a kill of the new master in that time promotes the
    stale one).  A write counts as safe once a replica holds it, or when the sentinels
    know of no replica that could be promoted (the only node left after a kill: nothing
    can take over from it, and its writes stay).  The sentinels' view is looked at most
    every :data:`FOLLOW_S`.

    Right after the sentinels name a new master, they list the old one as its replica,
    not yet one that could be promoted, while connections may still write to the old one
    (each follows the master within :data:`FOLLOW_S`): for :data:`MOVE_SETTLE_S` after a
    move is seen, the fence is needed whatever the replicas are (a write the old master
    took then is lost, and is not acknowledged: it is tried again on the new one)."""

    def __init__(self, sentinel: Sentinel, master: str) -> None:
        self._sentinel = sentinel
        self._master = master
        self._lock = threading.Lock()
        self._needed = True
        self._next_look = 0.0
        self._address: tuple[str, int] | None = None
        self._moved_at = float("-inf")

    def needed(self) -> bool:
        """Whether a replica that could be promoted exists (True when no sentinel says)."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_look:
                return self._needed
            self._next_look = now + FOLLOW_S
        needed = self._look(now)
        with self._lock:
            self._needed = needed
        return needed

    def _look(self, now: float) -> bool:
        for sentinel in self._sentinel.sentinels:
            try:
                master: dict[str, Any] = sentinel.sentinel_master(self._master)  # type: ignore[assignment]
                replicas = sentinel.sentinel_slaves(self._master)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                continue
            address = (str(master.get("ip")), int(master.get("port", 0)))
            with self._lock:
                if self._address is not None and address != self._address:
                    self._moved_at = now
                self._address = address
                settling = now - self._moved_at < MOVE_SETTLE_S
            return settling or any(_candidate(replica) for replica in replicas)
        return True  # no sentinel answers: assume a replica could take over

    @staticmethod
    def wait_command() -> tuple[str, int, int]:
        """``WAIT 1 <ms>``: queued after the write, on its connection (a pipeline)."""
        return ("WAIT", 1, FENCE_WAIT_MS)


def _candidate(replica: dict[str, Any]) -> bool:
    """Whether the sentinels could promote this replica now."""
    return not _NOT_A_CANDIDATE & set(str(replica.get("flags", "")).split(","))


def replica_fence(settings: Settings) -> ReplicaFence | None:
    """The fence of a ``sentinel://`` deployment (None for one Redis: nothing to fail over
    to, and ``WAIT`` would wait for replicas that do not exist)."""
    where = settings.redis.sentinel
    if where is None:
        return None
    return ReplicaFence(sentinels(settings), where.master)


_LOOKS_LOCK = threading.Lock()
#: Attribute of a Sentinel pool: when its connections may next ask the sentinels.
_NEXT_LOOK = "_captcha_tasks_next_master_look"


def _look_due(pool: Any) -> bool:
    """Whether to ask the sentinels again: at most once per FOLLOW_S for all of a pool's
    connections."""
    now = time.monotonic()
    with _LOOKS_LOCK:
        if getattr(pool, _NEXT_LOOK, 0.0) > now:
            return False
        setattr(pool, _NEXT_LOOK, now + FOLLOW_S)
        return True


def _moved(connection: Any, master: Any) -> redis.ConnectionError | None:
    """The error for a connection that is not where the sentinels last said the master is."""
    if master is None or (connection.host, connection.port) == tuple(master):
        return None
    return redis.ConnectionError(f"the Redis master moved to {master[0]}:{master[1]}")


def redis_client(settings: Settings) -> redis.Redis:
    """The state layer's client (replies decoded to ``str``)."""
    where = settings.redis.sentinel
    if where is None:
        return redis.Redis.from_url(settings.redis.url, **_STATE_OPTIONS)
    client: redis.Redis = sentinels(settings).master_for(  # type: ignore[no-untyped-call,unused-ignore]
        where.master,
        redis_class=redis.Redis,
        connection_class=following_connection(where.tls),
        **_STATE_OPTIONS,
    )
    return client


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
    where = settings.redis.sentinel
    if where is None:
        return aioredis.Redis.from_url(settings.redis.url, **kwargs)
    manager = AsyncSentinel(  # type: ignore[no-untyped-call,unused-ignore]
        where.sentinels,
        sentinel_kwargs=_sentinel_kwargs(where, asyncio=True),
        **_server_kwargs(where),
    )
    connection_class = (
        AsyncMasterFollowingSSLConnection if where.tls else AsyncMasterFollowingConnection
    )
    client: aioredis.Redis = manager.master_for(
        where.master, redis_class=aioredis.Redis, connection_class=connection_class, **kwargs
    )
    return client


def following_connection(tls: bool) -> type[MasterFollowingConnection]:
    """The connection class of a client of the master behind Sentinel (kombu's and
    Celery's too)."""
    return MasterFollowingSSLConnection if tls else MasterFollowingConnection


def sentinels(settings: Settings) -> Sentinel:
    """The sentinels of a ``sentinel://`` REDIS_URL (redis-py's :class:`Sentinel`: ask it
    ``discover_master``, or send ``SENTINEL`` commands through its ``sentinels``)."""
    where = settings.redis.sentinel
    if where is None:
        raise ValueError("REDIS_URL names no sentinels")
    return Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        where.sentinels, sentinel_kwargs=_sentinel_kwargs(where), **_server_kwargs(where)
    )


def reachable(settings: Settings) -> bool:
    """Whether Redis (behind Sentinel: the master) answers a PING right now."""
    client = redis_client(settings)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
        # The sentinels' own connections (Sentinel.close: redis-py 8.1+).
        close = getattr(getattr(client.connection_pool, "sentinel_manager", None), "close", None)
        if close is not None:
            close()


def unacked_mutex_expire(visibility: float) -> int:
    """Seconds kombu's lock on putting unacknowledged messages back may outlive its
    holder: a fraction of the visibility timeout (kombu's own default is 300 s)."""
    return max(2, int(visibility / 6))


def celery_options(settings: Settings) -> dict[str, Any]:
    """Celery's settings that say where Redis is: the broker and result backend URLs and
    the transport options of each, their TLS, and RedBeat's URL and options."""
    visibility = settings.celery.visibility_timeout
    options: dict[str, Any] = {
        "broker_url": settings.redis.url,
        "result_backend": settings.redis.url,
        "broker_transport_options": {
            "visibility_timeout": visibility,
            "unacked_restore_interval": max(1, int(visibility / 12)),
            "unacked_restore_throttle": 1,
            # The lock one worker takes to put those messages back.  Left by a worker
            # killed inside it, or by a release that met Redis restarting (kombu releases
            # it in a finally that fails then), kombu's 5 minutes stopped every restore
            # for as long: messages that returned after the visibility timeout returned
            # five minutes late (a chaos run lost a captcha that way).  Restoring is
            # transactional per message (WATCH), so a lock that lapses early is harmless.
            "unacked_mutex_expire": unacked_mutex_expire(visibility),
        },
        "result_backend_transport_options": {
            "retry_policy": {"timeout": 5.0},
            # A demoted master answers writes with READONLY: reconnect and retry, as for
            # a dropped connection (celery #10119).
            "additional_connection_errors": (ReadOnlyError,),
        },
        # The consumer reconnects after a Redis error reply too (READONLY from a demoted
        # master: celery #7946) instead of stopping the worker.
        "broker_channel_error_retry": True,
        "broker_use_ssl": False,  # Celery's defaults: rediss:// carries its own TLS options
        "redis_backend_use_ssl": None,
        "redbeat_redis_url": settings.redis.url,
        "redbeat_redis_options": {},
    }
    where = settings.redis.sentinel
    return options if where is None else {**options, **_celery_sentinel(where, options)}


def _celery_sentinel(where: RedisSentinel, plain: dict[str, Any]) -> dict[str, Any]:
    """What changes in :func:`celery_options` behind Sentinel."""
    # The broker and the result backend each read their own transport options: without
    # master_name in the backend's, every result (and beat's every tick) fails with
    # "No master found for None".
    located = {"master_name": where.master, "sentinel_kwargs": _sentinel_kwargs(where)}
    broker = {
        **plain["broker_transport_options"],
        **located,
        # A master that vanishes without closing its sockets (a frozen host, a network
        # partition) must not hold a publish or a consumer forever (celery #6348).
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_keepalive": True,
        # One retry of a command (an ack, a publish) that failed on a connection whose
        # master moved: it reconnects to the new master (see MasterFollowingConnection).
        "retry_on_timeout": True,
    }
    first_host, first_port = where.sentinels[0]
    tls = _ssl_options(where) if where.tls else None
    return {
        "broker_transport_options": broker,
        "result_backend_transport_options": {
            **plain["result_backend_transport_options"],
            **located,
        },
        "broker_use_ssl": tls or False,
        "redis_backend_use_ssl": tls,
        # RedBeat reads only the scheme of its URL; the sentinels come from its options.
        "redbeat_redis_url": f"redis-sentinel://{first_host}:{first_port}/{where.db}",
        "redbeat_redis_options": {
            "sentinels": list(where.sentinels),
            "service_name": where.master,
            "password": where.password,
            "db": where.db,
            "socket_timeout": SOCKET_TIMEOUT_S,
            "sentinel_kwargs": _sentinel_kwargs(where),
            "retry_period": REDBEAT_RETRY_S,
        },
    }


def _server_kwargs(where: RedisSentinel) -> dict[str, Any]:
    """How to talk to the Redis servers the sentinels name."""
    kwargs: dict[str, Any] = {"db": where.db, **_tls(where)}
    if where.password is not None:
        kwargs["password"] = where.password
    return kwargs


def _sentinel_kwargs(where: RedisSentinel, asyncio: bool = False) -> dict[str, Any]:
    """How to talk to the sentinels: their own password, short timeouts, and TLS (kombu,
    Celery and redis-py all leave the sentinels in plain text unless it is here).  An
    asyncio client gets asyncio's retry policy (redis-py 8.2 warns on a synchronous one)."""
    retry_class = AsyncRetry if asyncio else Retry
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
        "socket_timeout": SENTINEL_TIMEOUT_S,
        # No retries: discovery asks the next sentinel at once (redis-py's default, ten
        # with back-off, holds it up for most of a minute on one silent sentinel).
        "retry": retry_class(NoBackoff(), 0),
        **_tls(where),
    }
    if where.sentinel_password is not None:
        kwargs["password"] = where.sentinel_password
    return kwargs


def _tls(where: RedisSentinel) -> dict[str, Any]:
    return {"ssl": True, **_ssl_options(where)} if where.tls else {}


def _ssl_options(where: RedisSentinel) -> dict[str, Any]:
    # redis-py's ssl_* arguments, also the form of Celery's broker_use_ssl and
    # redis_backend_use_ssl.  Certificates are always verified.
    options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if where.tls_ca_file is not None:
        options["ssl_ca_certs"] = where.tls_ca_file
    return options


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
