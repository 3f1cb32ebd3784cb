"""The one builder of Redis clients: what it hands Celery, kombu, RedBeat and redis-py for
one Redis and for Redis behind Sentinel (no server needed: building connects nothing)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import ReadOnlyError
from redis.sentinel import SentinelConnectionPool

from captcha_tasks.settings import RedisSettings, Settings
from captcha_tasks.state import connections, db

pytestmark = pytest.mark.unit

PLAIN = Settings(redis=RedisSettings(url="redis://:secret@cache:6379/3"))
SENTINEL_URL = "sentinel://:secret@s1:26379/3;sentinel://s2:26380/3"


def sentinel_settings(**extra: Any) -> Settings:
    return Settings(
        redis=RedisSettings(
            url=SENTINEL_URL, sentinel_master="main", sentinel_password="s-secret", **extra
        )
    )


@pytest.fixture
def ca_file(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(path)


def test_a_demoted_master_counts_as_unreachable_for_the_state_layer() -> None:
    assert issubclass(ReadOnlyError, connections.UNREACHABLE)
    assert db.UNREACHABLE is connections.UNREACHABLE  # one definition, used by Db.guard()


def test_one_redis_keeps_its_url_everywhere() -> None:
    options = connections.celery_options(PLAIN)
    assert options["broker_url"] == options["result_backend"] == PLAIN.redis.url
    assert options["redbeat_redis_url"] == PLAIN.redis.url
    assert "master_name" not in options["broker_transport_options"]
    assert "master_name" not in options["result_backend_transport_options"]
    backend = options["result_backend_transport_options"]
    assert ReadOnlyError in backend["additional_connection_errors"]
    assert options["broker_channel_error_retry"] is True


def test_broker_and_result_backend_each_get_the_master_and_the_sentinels_password() -> None:
    options = connections.celery_options(sentinel_settings())
    assert options["broker_url"] == options["result_backend"] == SENTINEL_URL
    for name in ("broker_transport_options", "result_backend_transport_options"):
        transport = options[name]
        assert transport["master_name"] == "main", name  # else: "No master found for None"
        assert transport["sentinel_kwargs"]["password"] == "s-secret", name
        assert "ssl" not in transport["sentinel_kwargs"], name
    broker = options["broker_transport_options"]
    assert broker["visibility_timeout"] == sentinel_settings().celery.visibility_timeout
    assert broker["socket_timeout"] > 0  # a frozen master cannot hold a publish forever
    assert options["broker_use_ssl"] is False and options["redis_backend_use_ssl"] is None


def test_redbeat_gets_its_sentinel_scheme_and_options() -> None:
    options = connections.celery_options(sentinel_settings())
    assert options["redbeat_redis_url"].startswith("redis-sentinel://")
    assert "secret" not in options["redbeat_redis_url"]
    redbeat = options["redbeat_redis_options"]
    assert redbeat["sentinels"] == [("s1", 26379), ("s2", 26380)]
    assert (redbeat["service_name"], redbeat["password"], redbeat["db"]) == ("main", "secret", 3)
    assert redbeat["sentinel_kwargs"]["password"] == "s-secret"


def test_tls_reaches_the_sentinels_and_the_servers_of_every_client(ca_file: str) -> None:
    options = connections.celery_options(
        sentinel_settings(sentinel_tls=True, sentinel_tls_ca_file=ca_file)
    )
    wanted = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": ca_file}
    for name in ("broker_transport_options", "result_backend_transport_options"):
        sentinel_kwargs = options[name]["sentinel_kwargs"]
        assert sentinel_kwargs["ssl"] is True, name  # else the sentinels speak plain text
        assert wanted.items() <= sentinel_kwargs.items(), name
    assert options["redbeat_redis_options"]["sentinel_kwargs"]["ssl"] is True
    assert options["broker_use_ssl"] == options["redis_backend_use_ssl"] == wanted


def test_the_state_clients_ask_the_sentinels_and_follow_the_master(ca_file: str) -> None:
    plain = connections.redis_client(sentinel_settings())
    pool = plain.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "main"
    assert pool.connection_class is connections.MasterFollowingConnection
    assert pool.connection_kwargs["password"] == "secret"
    assert pool.connection_kwargs["db"] == 3
    sentinel = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert (sentinel["host"], sentinel["port"], sentinel["password"]) == ("s1", 26379, "s-secret")

    tls = sentinel_settings(sentinel_tls=True, sentinel_tls_ca_file=ca_file)
    secure = connections.redis_client(tls).connection_pool
    assert secure.connection_class is connections.MasterFollowingSSLConnection
    assert secure.connection_kwargs["ssl_ca_certs"] == ca_file
    manager = secure.sentinel_manager.sentinels[0].connection_pool
    assert issubclass(manager.connection_class, redis.SSLConnection)

    aio = connections.async_redis_client(tls).connection_pool
    assert aio.connection_class is connections.AsyncMasterFollowingSSLConnection
    assert aio.service_name == "main"


def test_no_sentinels_in_a_plain_url() -> None:
    with pytest.raises(ValueError):
        connections.sentinels(PLAIN)


def test_the_replica_fence_counts_replicas_that_could_take_over() -> None:
    _candidate, replica_fence = connections._candidate, connections.replica_fence
    assert _candidate({"flags": "slave"})
    assert _candidate({"flags": "slave,promoted"})  # mid-switch: the old master's writes wait
    assert not _candidate({"flags": "s_down,slave,disconnected"})  # killed: nothing to wait for
    assert not _candidate({"flags": "slave,o_down"})
    # the replica being promoted has left the old master: the old master's writes wait
    assert _candidate({"flags": "slave,disconnected"})
    assert (
        replica_fence(Settings(redis=RedisSettings(url="redis://localhost:6379/0"))) is None
    )  # one Redis


class Sentinels:
    """What the sentinels answer, set by the test.  A stand-in: the moment of a switch when
    the sentinels name the new master and list the old one as not yet promotable lasts
    well under a second on a real cluster and cannot be held still (tests/ha covers the
    switch whole: bench_failover counts what it pays twice)."""

    def __init__(self) -> None:
        self.master = {"ip": "10.0.0.1", "port": 6379}
        self.replicas = [{"flags": "slave"}]
        self.sentinels = [self]

    def sentinel_master(self, name: str) -> dict[str, Any]:
        return self.master

    def sentinel_slaves(self, name: str) -> list[dict[str, Any]]:
        return self.replicas


def test_the_fence_holds_for_a_while_after_the_master_moves_whatever_the_replicas() -> None:
    seen = Sentinels()
    fence = connections.ReplicaFence(seen, "main")  # type: ignore[arg-type]
    t0 = 1000.0
    assert fence._look(t0)  # a replica could take over
    seen.replicas = [{"flags": "s_down,slave,disconnected"}]
    assert not fence._look(t0 + 1)  # the only node left: nothing to wait for
    # a switch: the new master's only replica is the old master, not promotable yet, and
    # connections may still write to the old one for a moment
    seen.master = {"ip": "10.0.0.2", "port": 6379}
    assert fence._look(t0 + 2)
    assert fence._look(t0 + 2 + connections.MOVE_SETTLE_S - 0.01)
    assert not fence._look(t0 + 2 + connections.MOVE_SETTLE_S)  # settled: as before


def test_a_lock_left_on_restoring_unacked_messages_lapses_within_the_visibility_timeout() -> None:
    # kombu's default (300 s) stopped every restore for five minutes after a worker died
    # holding it, or Redis restarted while it was held
    options = connections.celery_options(PLAIN)["broker_transport_options"]
    visibility = options["visibility_timeout"]
    assert options["unacked_mutex_expire"] == connections.unacked_mutex_expire(visibility)
    assert 2 <= connections.unacked_mutex_expire(10) < 10
    assert connections.unacked_mutex_expire(60) == 10
