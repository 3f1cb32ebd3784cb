"""The state layer's clients behind real sentinels: through a graceful switch and a kill -9
of the master, the sync client (with a Lua script, reloaded on the new master) and the
asyncio client write to the new master without being rebuilt; a replica's READONLY (what a
demoted master answers) is an outage to retry; TLS really reaches the sentinels."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import kombu
import pytest
import redis
from celery import Celery
from celery.backends.redis import RedisBackend
from conftest import EVENTS, happen  # tests/ha/conftest.py

from captcha_tasks.errors import RetryableError, StoreUnavailable
from captcha_tasks.settings import RedisSettings, Settings
from captcha_tasks.state import connections
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.lua import Library
from captcha_tasks.testing.processes import RedisServer, redis_client, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.celery_compat import transport as broker
from harness.sentinel_cluster import SentinelCluster

pytestmark = pytest.mark.system

#: A script of the tests' own (tests/ha/lua/ha/count.lua), in the package's format.
COUNT = Library(Path(__file__).parent / "lua").script("ha/count")
#: Seconds a client may take to reach the new master after the event (generous: the
#: machine is shared; the times are recorded, not asserted).
RIDE_OUT_S = 30


def ride_out(write: Callable[[], int], seen_on_new: Callable[[], int | None]) -> float:
    """Write until a write lands on the new master; returns when (monotonic)."""

    def landed() -> bool:
        try:
            value = write()
        except (StoreUnavailable, *connections.UNREACHABLE):
            return False
        return seen_on_new() == value  # one writer: the new master holds exactly ours

    wait_until(landed, RIDE_OUT_S, interval=0.02, what="a write on the new master")
    return time.monotonic()


@pytest.mark.parametrize("event", EVENTS)
def test_the_sync_and_async_state_clients_follow_the_master(
    cluster: SentinelCluster, event: str, record: Callable[..., None]
) -> None:
    settings = cluster.settings()
    sync = Db(connections.redis_client(settings), Keys("ha"))
    count = sync.bind(COUNT)
    assert sync.guard(lambda: count({"counter": "sync"}, {"by": 1})) == 1
    [replica] = [node for node in cluster.nodes if node is not cluster.master()]
    # The replica never ran the script: the new master must get it again (NOSCRIPT).
    assert redis_client(replica.url).script_exists(count.sha) == [False]

    async def scenario() -> tuple[RedisServer, float, float, float]:
        aio = connections.async_redis_client(settings)
        assert await aio.incr("async") == 1
        started = time.monotonic()
        old, new = await asyncio.to_thread(happen, cluster, event)
        direct = redis_client(new.url)

        def on_new(key: str) -> Callable[[], int | None]:
            return lambda: int(direct.get(key) or 0)

        async def async_ride_out() -> float:
            deadline = time.monotonic() + RIDE_OUT_S
            while time.monotonic() < deadline:
                try:
                    value = await aio.incr("async")
                    if on_new("async")() == value:
                        return time.monotonic()
                except connections.UNREACHABLE:
                    pass
                await asyncio.sleep(0.02)  # a poll of a condition with a deadline
            raise TimeoutError("the asyncio client never wrote to the new master")

        sync_done, async_done = await asyncio.gather(
            asyncio.to_thread(
                ride_out,
                lambda: sync.guard(lambda: count({"counter": "sync"}, {"by": 1})),
                on_new("sync"),
            ),
            async_ride_out(),
        )
        await aio.aclose()
        assert old is not new
        return new, started, sync_done, async_done

    new, started, sync_done, async_done = asyncio.run(scenario())
    assert redis_client(new.url).script_exists(count.sha) == [True]  # reloaded there
    record(event=event, client="state sync (Lua)", seconds=round(sync_done - started, 2))
    record(event=event, client="state asyncio", seconds=round(async_done - started, 2))


def test_a_replica_s_readonly_is_an_outage_to_retry(
    cluster: SentinelCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A demoted master is a replica: writes get READONLY.  The state layer and the
    result backend treat it as Redis being away (retry), not as a failed request."""
    [replica] = [node for node in cluster.nodes if node is not cluster.master()]
    direct = redis_client(replica.url)
    with pytest.raises(redis.ReadOnlyError):
        direct.set("k", "v")  # what the boundary sees
    db = Db(direct, Keys("ha"))
    count = db.bind(COUNT)
    for call in (lambda: direct.set("k", "v"), lambda: count({"counter": "k"}, {"by": 1})):
        with pytest.raises(StoreUnavailable) as info:
            db.guard(call, "nothing was sent")
        assert isinstance(info.value, RetryableError)
        assert "ReadOnlyError" in str(info.value)

    backend = RedisBackend(app=app, url=replica.url)
    with pytest.raises(redis.ReadOnlyError), caplog.at_level("ERROR"):
        backend.set("celery-task-meta-x", "{}", max_retries=2, interval_start=0, interval_step=0)
    retried = [r for r in caplog.records if "Connection to Redis lost" in r.getMessage()]
    assert len(retried) == 2  # retried as a lost connection, then given up


class FirstBytes:
    """A loopback listener standing in for a sentinel: it notes the first bytes each
    connection sends, then hangs up."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.seen: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._note, args=(conn,), daemon=True).start()

    def _note(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                self.seen.append(conn.recv(16))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        self.sock.close()
        self.thread.join(5)


def clients_of(settings: Settings) -> dict[str, Callable[[], object]]:
    """Each kind of client the builder makes, told to reach Redis once."""
    options = connections.celery_options(settings)
    celery_app = Celery(set_as_current=False)
    celery_app.conf.update(options)

    async def aio() -> object:
        client = connections.async_redis_client(settings)
        try:
            return await client.ping()
        finally:
            await client.aclose()

    return {
        "state": lambda: connections.redis_client(settings).ping(),
        "asyncio": lambda: asyncio.run(aio()),
        "broker": lambda: kombu.Connection(
            options["broker_url"],
            transport=broker.SentinelTransport,
            transport_options=options["broker_transport_options"],
            ssl=options["broker_use_ssl"],
        ).ensure_connection(max_retries=1, interval_start=0, interval_step=0),
        "results": lambda: broker.SentinelBackend(
            app=celery_app, url=options["result_backend"]
        ).client.ping(),
    }


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_every_client_speaks_tls_to_the_sentinels_when_asked(tls: bool) -> None:
    sentinel = FirstBytes()
    try:
        settings = Settings(
            redis=RedisSettings(
                url=f"sentinel://127.0.0.1:{sentinel.port}", sentinel_master="m", sentinel_tls=tls
            )
        )
        for name, reach in clients_of(settings).items():
            sentinel.seen.clear()
            with pytest.raises(Exception):  # noqa: B017  (it hangs up on everyone)
                reach()
            assert sentinel.seen, name
            # A TLS handshake record (0x16, version 3.x), or a RESP command in plain text.
            start = b"\x16\x03" if tls else b"*"
            assert all(b.startswith(start) for b in sentinel.seen), (name, sentinel.seen)
    finally:
        sentinel.close()
