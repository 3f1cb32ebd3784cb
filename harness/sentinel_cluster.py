"""A Redis Sentinel cluster on loopback for tests and benchmarks: one master, one replica
and three sentinels (:class:`SentinelCluster`), each a child process stopped by
``stop()`` or the ``with`` block.  Its :meth:`SentinelCluster.failover` and
:meth:`SentinelCluster.kill_master` are the master changes the HA tests and
``scripts/bench_failover.py`` ride out."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from captcha_tasks.settings import RedisSettings, Settings
from captcha_tasks.state import connections
from captcha_tasks.testing.processes import (
    ChildProcess,
    RedisServer,
    find_redis_server,
    free_port,
    redis_client,
    wait_until,
)


class SentinelServer(ChildProcess):
    """One Redis Sentinel (``redis-server --sentinel``, the same binary) watching
    ``master_name`` at ``master_port`` on loopback, with its own rewritable config file."""

    def __init__(
        self,
        master_name: str,
        master_port: int,
        *,
        log_dir: Path,
        quorum: int = 2,
        password: str | None = None,
        sentinel_password: str | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.port = free_port()
        super().__init__(f"sentinel-{self.port}", log_dir)
        self.master_name = master_name
        self.sentinel_password = sentinel_password
        monitor = f"{master_name} 127.0.0.1 {master_port} {quorum}"
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.log_dir}",
            f"sentinel monitor {monitor}",
            f"sentinel down-after-milliseconds {master_name} {down_after_ms}",
            f"sentinel failover-timeout {master_name} {failover_timeout_ms}",
            f"sentinel parallel-syncs {master_name} 1",
        ]
        if password:
            lines.append(f"sentinel auth-pass {master_name} {password}")
        if sentinel_password:
            # Clients authenticate to the sentinels, and the sentinels to each other.
            lines.append(f"requirepass {sentinel_password}")
            lines.append(f"sentinel sentinel-pass {sentinel_password}")
        self.config_path = self.log_dir / f"sentinel-{self.port}.conf"
        self.config_path.write_text("\n".join(lines) + "\n")
        self._client: redis.Redis | None = None

    def settings(self) -> Settings:
        """Settings naming this sentinel alone."""
        return Settings(
            redis=RedisSettings(
                url=f"sentinel://127.0.0.1:{self.port}",
                sentinel_master=self.master_name,
                sentinel_password=self.sentinel_password or "",
            )
        )

    def client(self) -> redis.Redis:
        """A client of this sentinel (``SENTINEL ...`` commands), built by
        :mod:`captcha_tasks.state.connections`."""
        if self._client is None:
            self._client = connections.sentinels(self.settings()).sentinels[0]
        return self._client

    def stop(self, timeout: float = 10) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        super().stop(timeout)

    def start(self, timeout: float = 10) -> Self:
        self._spawn([find_redis_server(), str(self.config_path), "--sentinel"])
        wait_until(self._answers, timeout, what=f"sentinel {self.port}")
        return self

    def _answers(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited early:\n{self.log_text()[-3000:]}")
        try:
            return bool(self.client().ping())
        except (redis.RedisError, OSError):
            return False

    def master_address(self) -> tuple[str, int] | None:
        """Where this sentinel says the master is (None: it does not answer)."""
        try:
            reply = self.client().sentinel_get_master_addr_by_name(self.master_name)
        except (redis.RedisError, OSError):
            return None
        if not isinstance(reply, tuple | list):
            return None
        host = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return host, int(reply[1])


class SentinelCluster:
    """One master, one replica and three sentinels on loopback, with timeouts short enough
    that a failover takes seconds: a Redis Sentinel deployment for tests and benchmarks.

    :attr:`url` and :meth:`env` are the settings to use; :meth:`failover` switches the
    master gracefully (``SENTINEL FAILOVER``), :meth:`kill_master` SIGKILLs it so that the
    sentinels promote a replica; both return once every sentinel names the new master and
    it answers as one.  :meth:`stop` (or leaving the ``with`` block) ends every process.
    """

    def __init__(
        self,
        log_dir: Path | None = None,
        *,
        master_name: str = "captcha-tasks",
        password: str | None = None,
        sentinel_password: str | None = None,
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="captcha-tasks-sentinel-"))
        self.master_name = master_name
        self.password = password
        self.sentinel_password = sentinel_password
        # Nodes replicate at once (no diskless-sync delay) and each keeps its files apart.
        common = ["--repl-diskless-sync-delay", "0"]
        if password:
            common += ["--masterauth", password]  # for when a node becomes a replica
        self.nodes = [
            RedisServer(log_dir=self.log_dir / f"node{n}", password=password, extra_args=common)
            for n in range(1 + replicas)
        ]
        first = self.nodes[0]
        for replica in self.nodes[1:]:
            replica.extra_args += ["--replicaof", "127.0.0.1", str(first.port)]
        self.sentinels = [
            SentinelServer(
                master_name,
                first.port,
                log_dir=self.log_dir / "sentinels",
                quorum=sentinels // 2 + 1,
                password=password,
                sentinel_password=sentinel_password,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for _ in range(sentinels)
        ]

    @property
    def url(self) -> str:
        """REDIS_URL: every sentinel, the master's password in the first part."""
        auth = f":{self.password}@" if self.password else ""
        parts = [f"sentinel://{auth if n == 0 else ''}127.0.0.1:{s.port}/0"
                 for n, s in enumerate(self.sentinels)]  # fmt: skip
        return ";".join(parts)

    def env(self) -> dict[str, str]:
        """The environment variables that point captcha-tasks at this deployment."""
        return {
            "REDIS_URL": self.url,
            "REDIS_SENTINEL_MASTER": self.master_name,
            "REDIS_SENTINEL_PASSWORD": self.sentinel_password or "",
        }

    def settings(self) -> Settings:
        return Settings(
            redis=RedisSettings(
                url=self.url,
                sentinel_master=self.master_name,
                sentinel_password=self.sentinel_password or "",
            )
        )

    def start(self, timeout: float = 30) -> Self:
        try:
            for node in self.nodes:
                node.start()
            for sentinel in self.sentinels:
                sentinel.start()
            wait_until(self._ready, timeout, interval=0.1, what="the sentinels to see everyone")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        """Every sentinel knows the others and an in-sync replica of the master."""
        for sentinel in self.sentinels:
            client = sentinel.client()
            try:
                master = client.sentinel_master(self.master_name)
                replicas = client.sentinel_slaves(self.master_name)
            except (redis.RedisError, OSError):
                return False
            others = int(master["num-other-sentinels"]) if isinstance(master, dict) else -1
            if others != len(self.sentinels) - 1:
                return False
            synced = [r for r in replicas if r["master-link-status"] == "ok" and not r["is_sdown"]]
            if len(synced) < len(self.nodes) - 1:
                return False
        return True

    def master_address(self) -> tuple[str, int] | None:
        """The master's address, when every live sentinel agrees on it."""
        answers = {s.master_address() for s in self.sentinels if s.alive()}
        answers.discard(None)
        return answers.pop() if len(answers) == 1 else None

    def master(self) -> RedisServer:
        """The node the sentinels name master."""
        address = self.master_address()
        for node in self.nodes:
            if address == ("127.0.0.1", node.port):
                return node
        raise RuntimeError(f"the sentinels do not agree on a master ({address})")

    def failover(self, timeout: float = 30) -> tuple[RedisServer, RedisServer]:
        """``SENTINEL FAILOVER``: the master hands over to a replica and becomes one.
        Returns (old master, new master) once the new one is in place."""
        old = self.master()
        self.sentinels[0].client().sentinel_failover(self.master_name)
        return old, self.wait_for_new_master(old, timeout)

    def kill_master(self, timeout: float = 30) -> tuple[RedisServer, RedisServer]:
        """SIGKILL the master; returns (dead master, promoted replica) once the sentinels
        agree on the promoted one and it answers as master."""
        old = self.master()
        old.kill()
        return old, self.wait_for_new_master(old, timeout)

    def wait_for_new_master(self, old: RedisServer, timeout: float = 30) -> RedisServer:
        def promoted() -> RedisServer | None:
            address = self.master_address()
            if address is None or address == ("127.0.0.1", old.port):
                return None
            node = next(n for n in self.nodes if ("127.0.0.1", n.port) == address)
            return node if role(node) == "master" else None

        new = wait_until(promoted, timeout, interval=0.05, what="a new master")
        assert isinstance(new, RedisServer)
        return new

    def stop(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def role(node: RedisServer) -> str | None:
    """``master`` or ``slave`` as the node itself says (None: it does not answer)."""
    client = redis_client(node.url)
    try:
        return str(client.role()[0])
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()
