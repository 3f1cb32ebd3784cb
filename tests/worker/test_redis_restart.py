"""Redis restarts mid-batch: a server of the module's own, with an append-only file,
restarted on the same port while ``captcha-tasks batch`` runs a batch through two real
workers.

* Graceful (SIGTERM: the server syncs its file): every solve ends solved, nothing is
  paid twice, no thread lease is left, and the batch command does not die.
* ``kill -9`` with ``appendfsync everysec`` (up to a second of writes lost): every solve
  ends, solved or failed with a typed reason, within its deadline.

And one solve whose ``in.php`` answers while Redis is down: it waits for Redis in the
worker, and is registered and solved, paid once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import (
    CeleryProcess,
    RedisServer,
    free_port,
    queue_names,
    wait_until,
)
from harness.batch_files import write_tasks

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/restart"
COUNT = 120
THREADS = 15
DEADLINE_S = 60
#: A solve whose every trace the lost second of a ``kill -9`` took (its queued message and
#: Redis's note of it) is failed by the batch when its result is this late.
TASK_TIMEOUT_S = DEADLINE_S + 15
#: Short HTTP timeouts allow a short visibility timeout: messages a restart left
#: unacknowledged come back within seconds.
FAST = {
    "CAPTCHAAI_THREADS": str(THREADS),
    "CAPTCHAAI_CONNECT_TIMEOUT": "2",
    "CAPTCHAAI_READ_TIMEOUT": "5",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "10",
    "CAPTCHAAI_SOLVE_TIMEOUT": str(DEADLINE_S),
    "CAPTCHAAI_SLOT_LEASE": "20",
}


class Stack:
    """Two workers, beat and the metrics exporter on the module's own Redis server."""

    def __init__(self, server: RedisServer, env: dict[str, str], out: Path) -> None:
        self.server, self.env, self.out = server, env, out
        self.processes: list[CeleryProcess] = []
        self.metrics_port = free_port()
        self.metrics: subprocess.Popen[bytes] | None = None

    def start(self, log_dir: Path, tag: str) -> None:
        for n in range(2):
            proc = CeleryProcess("worker", env=self.env, log_dir=log_dir, name=f"{tag}-w{n}")
            self.processes.append(proc.start())
        beat = CeleryProcess("beat", env=self.env, log_dir=log_dir, name=f"{tag}-beat")
        self.processes.append(beat.start())
        argv = [sys.executable, "-m", "captcha_tasks.cli", "metrics", "--port"]
        with open(log_dir / f"{tag}-metrics.log", "ab") as log:
            self.metrics = subprocess.Popen(
                [*argv, str(self.metrics_port)],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: self.scrape() == 200, 15, what="the metrics exporter")

    def scrape(self) -> int:
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            return requests.get(url, timeout=5).status_code
        except requests.ConnectionError:
            return 0

    def stop(self) -> None:
        for proc in self.processes:
            proc.stop()
        if self.metrics is not None:
            self.metrics.terminate()
            self.metrics.wait(10)


@pytest.fixture(params=["graceful", "kill-9"])
def stack(request: pytest.FixtureRequest, output_dir: Path, sandbox: Any) -> Iterator[Stack]:
    graceful = request.param == "graceful"
    log_dir = output_dir / f"restart-{request.param}"
    server = RedisServer(log_dir=log_dir, appendfsync="always" if graceful else "everysec")
    server.start()
    env = {
        **FAST,
        "CAPTCHAAI_BASE_URL": sandbox.url,  # the module's own sandbox
        "REDIS_URL": server.url,
        "CAPTCHAAI_KEY_PREFIX": f"restart-{request.param}",
        "CAPTCHAAI_QUEUE_PREFIX": f"restart-{request.param}",
    }
    built = Stack(server, env, log_dir / "out.jsonl")
    built.start(log_dir, request.param)
    yield built
    built.stop()
    server.stop()


def run_batch(
    stack: Stack, sandbox: Any, graceful: bool
) -> tuple[list[dict[str, Any]], float, str]:
    sandbox.configure(threads=50, solve_time=0.5, jitter=0.2)
    source = write_tasks(stack.out.with_name("in.jsonl"), COUNT, PAGE)
    stack.out.unlink(missing_ok=True)
    started = time.monotonic()
    batch = subprocess.Popen(
        [
            *(sys.executable, "-m", "captcha_tasks.cli", "batch", str(source)),
            *("-o", str(stack.out), "--timeout-per-task", str(TASK_TIMEOUT_S)),
        ],
        env={**os.environ, **stack.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: done_lines(stack.out) >= COUNT // 4, 60, what="a quarter of the batch")
        stack.server.restart(graceful=graceful, down_s=2.0)
        out, err = batch.communicate(timeout=TASK_TIMEOUT_S + 60)
    finally:
        if batch.poll() is None:  # a test that fails leaves no batch running
            batch.kill()
            batch.wait()
    took = time.monotonic() - started
    assert batch.returncode in (0, 1), err[-2000:]  # it did not die of the outage
    lines = [json.loads(t) for t in stack.out.read_text().splitlines() if t.strip()]
    return lines, took, err


def done_lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


@pytest.mark.timeout(TASK_TIMEOUT_S + 120)
def test_redis_restarts_mid_batch(
    stack: Stack, sandbox: Any, request: pytest.FixtureRequest
) -> None:
    graceful = "graceful" in request.node.callspec.id
    lines, took, err = run_batch(stack, sandbox, graceful)
    ended = sorted(line["index"] for line in lines)
    assert ended == list(range(COUNT)), err[-3000:]  # each ended, once
    assert took <= TASK_TIMEOUT_S + 30
    solved = [line for line in lines if line["status"] == "solved"]
    if graceful:
        assert len(solved) == COUNT, [line for line in lines if line["status"] != "solved"]
        assert sandbox.stats()["submits"] == COUNT  # nothing paid twice
    else:
        failed = [line for line in lines if line["status"] != "solved"]
        assert all(line["error"].startswith("ERROR_") for line in failed), failed
    tokens = [line["token"] for line in solved]
    assert len(set(tokens)) == len(tokens)  # no token delivered twice
    conn = redis.Redis.from_url(stack.server.url, decode_responses=True)
    keys = Keys(prefix=stack.env["CAPTCHAAI_KEY_PREFIX"])
    ours = lambda: [m for m in conn.zrange(keys.slots(), 0, -1) if not m.startswith("external:")]  # noqa: E731
    # kill -9 may lose the write that freed a lease: then it expires with its lease
    settle = 10 if graceful else float(FAST["CAPTCHAAI_SLOT_LEASE"]) + 15
    wait_until(lambda: not ours(), settle, what="every thread lease released")
    assert not any(conn.llen(q) for q in queue_names(stack.env))
    # every process is still there, and talks to the new server
    assert all(proc.alive() for proc in stack.processes), [p.name for p in stack.processes]
    assert stack.scrape() == 200


#: Seconds every in.php takes in the next test: Redis goes down while it is under way.
HANG_S = 3.0
PAID_PAGE = "https://example.com/paid-while-down"
SEND = (
    "from captcha_tasks import solve; "
    f"print(solve.delay(method='turnstile', sitekey='0x4AAAAAAApaid', pageurl={PAID_PAGE!r}).id)"
)


@pytest.mark.timeout(120)
def test_a_captcha_paid_for_while_redis_is_down_waits_to_be_registered(
    output_dir: Path, sandbox: Any
) -> None:
    """in.php answers while Redis (the broker too) is down: the captcha id exists only in
    the worker until the board holds it.  It waits for Redis in place, and the solve ends
    solved, paid once: no retry that would pay again, no message rejected in silence."""
    from captcha_tasks.worker.app import app
    from captcha_tasks.worker.results import Results

    log_dir = output_dir / "restart-paid"
    server = RedisServer(log_dir=log_dir, appendfsync="always").start()
    env = {
        **FAST,
        "CAPTCHAAI_BASE_URL": sandbox.url,  # the module's own sandbox
        "REDIS_URL": server.url,
        "CAPTCHAAI_KEY_PREFIX": "restart-paid",
        "CAPTCHAAI_QUEUE_PREFIX": "restart-paid",
    }
    worker_log = log_dir / "paid-w0.log"
    worker_log.unlink(missing_ok=True)  # what this test's worker says, not an earlier run's
    worker = CeleryProcess("worker", env=env, log_dir=log_dir, name="paid-w0").start()
    try:
        sandbox.configure(hang_rate=1.0, hang_s=HANG_S, solve_time=0.3, jitter=0.0)
        sent = subprocess.run(
            [sys.executable, "-c", SEND],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        solve_id = sent.stdout.strip()
        wait_until(lambda: sandbox.stats()["hangs"] >= 1, 15, what="in.php under way")
        sandbox.configure(hang_rate=0.0)  # the polls after it answer at once
        server.restart(graceful=True, down_s=HANG_S + 4)  # in.php answers meanwhile

        results = Results(app)
        conn = redis.Redis.from_url(server.url, decode_responses=True)
        key = results.key(solve_id)

        def ended() -> bool:
            record = conn.get(key)
            return record is not None and results.read(record).ready

        wait_until(ended, 45, what="the solve's outcome")
        outcome = results.read(conn.get(key)).outcome()
        conn.close()
        assert outcome["status"] == "solved"
        assert sandbox.stats()["submits"] == 1  # paid once
    finally:
        worker.stop()
        server.stop()
    said = worker_log.read_text()
    assert "waits here for it to be registered" in said
    assert "reject requeue=False" not in said
