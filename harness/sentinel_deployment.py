"""A whole deployment behind Redis Sentinel, and a batch run through failovers: for the
failover test (``tests/ha/test_failover_batch.py``) and ``scripts/bench_failover.py``.

:class:`SentinelDeployment` starts, on a :class:`~.sentinel_cluster.SentinelCluster`, a sandbox
provider that journals every captcha it is paid for, two workers, beat, the metrics
exporter and the pingback receiver.  :func:`run_batch` runs ``captcha-tasks batch`` on it,
notes when each result line arrives, and fires the events it is given (a graceful switch,
a kill -9 of the master) once so many captchas are solved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import requests

from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import (
    CeleryProcess,
    SandboxProcess,
    free_port,
    redis_client,
    wait_until,
)

from .batch_files import write_tasks
from .sentinel_cluster import SentinelCluster

PAGE = "https://example.com/failover"
#: Short HTTP timeouts allow a short visibility timeout (messages a lost connection left
#: unacknowledged come back within seconds), and a short lease shows a stranded one soon.
FAST = {
    "CAPTCHAAI_THREADS": "20",
    "CAPTCHAAI_POLL_INTERVAL": "0.25",
    "CAPTCHAAI_INITIAL_WAIT": "0.3",
    "CAPTCHAAI_CONNECT_TIMEOUT": "2",
    "CAPTCHAAI_READ_TIMEOUT": "5",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "10",
    "CAPTCHAAI_SOLVE_TIMEOUT": "40",
    "CAPTCHAAI_SLOT_LEASE": "15",
    "CAPTCHAAI_PREWARM_EVERY": "1",
    "CAPTCHAAI_THREADS_CHECK_EVERY": "5",
}
#: The sandbox: more threads than the plan, 0.6 s ± 0.2 s solves.
SANDBOX_OPTIONS = ("--threads", "60", "--solve-time", "0.6", "--jitter", "0.2")


class SentinelDeployment:
    """The sandbox, two workers, beat, the exporter and the receiver on ``cluster``."""

    def __init__(
        self, cluster: SentinelCluster, log_dir: Path, tag: str, env: Mapping[str, str] = {}
    ) -> None:
        self.cluster, self.log_dir, self.tag = cluster, log_dir, tag
        self.sandbox = SandboxProcess("failover", options=SANDBOX_OPTIONS, log_dir=log_dir)
        self.env = {
            **FAST,
            **cluster.env(),
            "CAPTCHAAI_API_KEY": self.sandbox.api_key,
            "CAPTCHAAI_BASE_URL": self.sandbox.url,
            "CAPTCHAAI_KEY_PREFIX": tag,
            "CAPTCHAAI_QUEUE_PREFIX": tag,
            "CAPTCHAAI_PINGBACK_SECRET": "failover-" + os.urandom(8).hex(),
            **env,
        }
        self.celery: list[CeleryProcess] = []
        self.servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    def start(self) -> SentinelDeployment:
        try:
            self.sandbox.start()
            for n in range(2):
                worker = CeleryProcess("worker", env=self.env, log_dir=self.log_dir, name=f"w{n}")
                self.celery.append(worker.start())
            beat = CeleryProcess("beat", env=self.env, log_dir=self.log_dir, name="beat")
            self.celery.append(beat.start())
            self._serve("metrics", "metrics", "/metrics")
            self._serve("receiver", "pingback-server", "/health")
        except BaseException:
            self.stop()
            raise
        return self

    def _serve(self, name: str, command: str, path: str) -> None:
        port = free_port()
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "captcha_tasks.cli", command, "--port", str(port)],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.servers[name] = (proc, f"http://127.0.0.1:{port}{path}")
        # A bound on start-up, not a pace: a loaded machine imports the CLI slowly.
        wait_until(lambda: self._answers(name, proc), 60, what=name)

    def _answers(self, name: str, proc: subprocess.Popen[bytes]) -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: see {self.log_dir}/{name}.log")
        return self.get(name) is not None

    def get(self, name: str) -> str | None:
        """The body of a 200 from server ``name`` (``metrics``, ``receiver``), or None."""
        try:
            reply = requests.get(self.servers[name][1], timeout=5)
        except requests.ConnectionError:
            return None
        return reply.text if reply.status_code == 200 else None

    def dead(self) -> list[str]:
        """The processes of the deployment that are no longer running."""
        gone = [p.name for p in self.celery if not p.alive()]
        gone += [name for name, (proc, _) in self.servers.items() if proc.poll() is not None]
        return gone + ([] if self.sandbox.alive() else ["sandbox"])

    def leases(self) -> list[str]:
        """Thread leases our solves hold on the master now (another client's excluded)."""
        master = redis_client(self.cluster.master().url)
        held: list[str] = master.zrange(Keys(self.tag).slots(), 0, -1)  # type: ignore[assignment]
        return [m for m in held if not m.startswith("external:")]

    def stop(self) -> None:
        for proc, _ in self.servers.values():
            proc.terminate()
            proc.wait(10)
        for celery in self.celery:
            celery.stop()
        self.sandbox.stop()

    def __enter__(self) -> SentinelDeployment:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Event:
    """``what`` ("switch" or "kill") once ``at_solved`` captchas are solved."""

    what: str
    at_solved: int


@dataclass
class BatchRun:
    """What one batch went through: its result lines, when each arrived (monotonic), when
    each event began and ended, the command's exit code and summary line."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)
    events: list[tuple[str, float, float]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    returncode: int | None = None
    summary: str = ""

    def solved(self) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["status"] == "solved"]

    def longest_gap(self) -> float:
        """The longest time without a result line, from the start to the last line."""
        times = [self.started, *self.arrived]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    def recovery(self, event: int = 0) -> float:
        """Seconds from the start of event ``event`` until results come back for good: the
        end of the longest gap between results after it (captchas in flight at the event
        may still arrive before that gap)."""
        _, began, _ = self.events[event]
        times = [began, *(t for t in self.arrived if t >= began)]
        gaps = [(b - a, b) for a, b in zip(times, times[1:], strict=False)]
        return max(gaps)[1] - began if gaps else 0.0


def run_batch(
    deployment: SentinelDeployment,
    count: int,
    events: Sequence[Event],
    timeout_per_task: float,
    page: str = PAGE,
) -> BatchRun:
    """``captcha-tasks batch`` of ``count`` captchas on ``deployment``, with ``events``."""
    d = deployment
    source = write_tasks(d.log_dir / "in.jsonl", count, page)
    out = d.log_dir / "out.jsonl"
    out.unlink(missing_ok=True)
    run = BatchRun(started=time.monotonic())
    with open(d.log_dir / "batch.err", "w") as err:
        batch = subprocess.Popen(
            [
                *(sys.executable, "-m", "captcha_tasks.cli", "batch", str(source)),
                *("-o", str(out), "--timeout-per-task", str(timeout_per_task)),
            ],
            env={**os.environ, **d.env},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    tail = _Tail(out, run)
    try:
        for event in events:
            wait_until(
                partial(_solved_at_least, run, event.at_solved),
                timeout_per_task + 60,
                interval=0.05,
                what=f"{event.at_solved} solved",
            )
            began = time.monotonic()
            if event.what == "switch":
                d.cluster.failover()
            else:
                d.cluster.kill_master()
            run.events.append((event.what, began, time.monotonic()))
        run.returncode = batch.wait(timeout=timeout_per_task + 120)
    finally:
        if batch.poll() is None:  # nothing is left running
            batch.kill()
            batch.wait()
        tail.stop()
    run.ended = time.monotonic()
    said = (d.log_dir / "batch.err").read_text().strip().splitlines()
    run.summary = said[-1] if said else ""
    return run


def _solved_at_least(run: BatchRun, count: int) -> bool:
    return len(run.solved()) >= count


class _Tail:
    """Reads result lines as they are written, noting when each arrived."""

    def __init__(self, path: Path, run: BatchRun) -> None:
        self.path, self.run = path, run
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _follow(self) -> None:
        offset, partial = 0, ""
        while True:
            finished = self.done.is_set()
            if self.path.exists():
                with open(self.path, encoding="utf-8") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
                    offset = fh.tell()
                partial += chunk
                *complete, partial = partial.split("\n")
                now = time.monotonic()
                for text in complete:
                    if text.strip():
                        self.run.lines.append(json.loads(text))
                        self.run.arrived.append(now)
            if finished:
                return
            self.done.wait(0.02)  # a polling cadence for the file, not a synchronisation

    def stop(self) -> None:
        self.done.set()
        self.thread.join(10)
