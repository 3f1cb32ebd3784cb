"""Both batch drivers, ``stream()`` and ``aio.stream``, held to one set of behaviours: each
test body runs against each driver (the ``driver`` fixture).  Real Redis, a real worker and
the sandbox.

Tests that stop and restart Redis use a server of this module's own (append-only,
``appendfsync always``, a password) and run the caller in a process of its own
(``batch_driver.py``): a process's Celery app, broker included, is configured from its
environment once, so this process cannot move to another Redis.

Also the asyncio calls with Redis down: the typed errors of their sync twins, and nothing
in the log beyond one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from contract import validate

from captcha_tasks import aio, errors, solve
from captcha_tasks.batch import stream
from captcha_tasks.core.batching import MAX_BLOCK_S
from captcha_tasks.core.outcome import parse_iso
from captcha_tasks.settings import Settings
from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import CeleryProcess, RedisServer, free_port, wait_until
from captcha_tasks.worker.app import app

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/drivers"
SITE = "example.com#0x4AAAAAAAdrivers"
PASSWORD = "pw-" + os.urandom(4).hex()
THREADS = 6
#: Short HTTP timeouts allow a short visibility timeout: messages a restart left
#: unacknowledged come back within seconds.
MODULE_ENV = {
    "CAPTCHAAI_THREADS": str(THREADS),
    "CAPTCHAAI_CONNECT_TIMEOUT": "1",
    "CAPTCHAAI_READ_TIMEOUT": "3",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "6",
    "CAPTCHAAI_SLOT_LEASE": "20",
}
DRIVER = Path(__file__).with_name("batch_driver.py")
#: Per task, in the restart test: past the solve timeout (30 s in tests), a lost solve fails.
TASK_TIMEOUT_S = 35


def task(**extra: Any) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": "0x4AAAAAAAdrivers", "pageurl": PAGE, **extra}


@dataclass
class Driver:
    """One batch driver, consumed the same way whichever it is."""

    name: str

    def run(
        self,
        tasks: list[dict[str, Any]],
        *,
        each: Callable[[list[dict[str, Any]]], bool] = lambda seen: False,
        **options: Any,
    ) -> list[dict[str, Any]]:
        """The outcomes, in the order they came; the caller leaves the loop when
        ``each(seen)`` returns True."""
        seen: list[dict[str, Any]] = []
        if self.name == "sync":
            with contextlib.closing(stream(tasks, **options)) as results:
                for result in results:
                    seen.append(result)
                    if each(seen):
                        break
            return seen

        async def consume() -> None:
            async with contextlib.aclosing(aio.stream(tasks, **options)) as results:
                async for result in results:
                    seen.append(result)
                    if each(seen):
                        break

        asyncio.run(consume())
        return seen


@pytest.fixture(params=["sync", "aio"])
def driver(request: pytest.FixtureRequest) -> Driver:
    return Driver(request.param)


@pytest.fixture
def idle(worker: Any, clean_state: None, sandbox: Any) -> Iterator[Any]:
    """The sandbox, and the deployment left idle after the test (no thread held)."""
    yield sandbox
    limiter = app.runtime().state.limiter
    wait_until(lambda: limiter.in_use() == 0, 30, what="every thread given back")


@contextlib.contextmanager
def redis_elsewhere(env: dict[str, str]) -> Iterator[str]:
    """This process's REDIS_URL points, for the block, at a port where nothing listens
    (with a password); returns the URL."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    before = app.runtime()
    app.use(Settings.from_env({**env, "REDIS_URL": url}))
    try:
        yield url
    finally:
        app.use(before.settings, before.state)


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What this process logged at INFO and above, from any logger."""
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.INFO]


# -- the same behaviour from both drivers, in this process -----------------------------------


def test_each_line_has_the_result_shape_with_its_index(driver: Driver, idle: Any) -> None:
    """What ``get()`` returns, plus ``index``: ``method``, and for a solved task when it
    was solved and until when its token may be used (the batch-entry JSON Schema)."""
    results = {r["index"]: r for r in driver.run([task(), task(pageurl="ftp://nope")])}
    solved, failed = results[0], results[1]
    validate("batch-entry", solved)
    validate("batch-entry", failed)
    assert solved["status"] == "solved" and solved["method"] == "turnstile"
    assert parse_iso(solved["solved_at"]) < parse_iso(solved["expires_at"])
    assert failed["status"] == "failed" and failed["method"] == "turnstile"
    # the site the router used: with provider and captcha_id, what a report per site needs
    assert (solved["site"], solved["provider"]) == (SITE, "captchaai")


def test_a_quiet_wait_longer_than_a_read_is_not_an_outage(
    driver: Driver, idle: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    idle.configure(solve_time=MAX_BLOCK_S + 1.5, jitter=0.0)  # reads that find nothing
    (result,) = driver.run([task()])
    assert result["status"] == "solved"
    assert not logged(caplog)  # no outage, no reconnect


def test_redis_down_at_the_start_raises_at_once(
    driver: Driver, env: dict[str, str], idle: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    started = time.monotonic()
    with redis_elsewhere(env) as url, pytest.raises(errors.StoreUnavailable) as info:
        driver.run([task(), task()])
    assert time.monotonic() - started < 2
    message = str(info.value)
    assert info.value.code == "ERROR_REDIS_UNAVAILABLE"
    assert f"REDIS_URL=redis://:***@{url.rsplit('@', 1)[1]}" in message
    assert PASSWORD not in message
    assert not logged(caplog)  # the error says it all
    assert idle.stats()["submits"] == 0


def test_leaving_cancels_the_batch_and_nothing_more_is_paid(driver: Driver, idle: Any) -> None:
    total = 4 * THREADS
    # The sandbox's clock stops at the first answer (its latch, closing itself): a submit
    # sent after it cannot end before the caller has left, however slowly the caller
    # reacts on a loaded machine (a CI run paid for a third wave so).
    idle.configure(threads=total, solve_time=0.8, jitter=0.3, hold_after_reads=1)
    results = driver.run([task() for _ in range(total)], window=total, each=lambda seen: True)
    assert [r["status"] for r in results] == ["solved"]
    state = app.runtime().state
    assert len(list(state.redis.scan_iter(state.keys.batch_cancelled("*")))) == 1
    idle.configure(hold=False)  # the caller has left: let the rest run
    wait_until(lambda: state.limiter.in_use() == 0, 15, what="in-flight captchas to finish")
    submitted = idle.stats()["submits"]
    # at most the first wave and the submits that took its freed threads before the
    # caller left were paid for; everything still queued or parked was dropped
    assert THREADS <= submitted <= 2 * THREADS
    assert state.limiter.parked_count() == 0
    wait_until(lambda: idle.stats()["in_flight"] == 0, 10, what="the provider to go idle")
    assert idle.stats()["submits"] == submitted


# -- the asyncio calls with Redis down --------------------------------------------------------


def test_aio_solve_with_redis_down_raises_what_solve_delay_raises(
    env: dict[str, str], idle: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with redis_elsewhere(env):
        with pytest.raises(errors.StoreUnavailable) as sync:
            solve.delay(**task())
        with pytest.raises(errors.StoreUnavailable) as info:
            asyncio.run(aio.solve(**task()))
        # bad arguments are still named first, as solve.delay names them
        with pytest.raises(errors.ValidationError) as bad_sync:
            solve.delay(**task(pageurl="nope"))
        with pytest.raises(errors.ValidationError) as bad:
            asyncio.run(aio.solve(**task(pageurl="nope")))
    assert type(info.value) is type(sync.value)
    assert (info.value.code, str(info.value)) == (sync.value.code, str(sync.value))
    assert str(bad.value) == str(bad_sync.value)
    assert PASSWORD not in str(info.value)
    assert not logged(caplog)
    assert idle.stats()["submits"] == 0


# -- Redis restarted under a caller in a process of its own ----------------------------------


@pytest.fixture(scope="module")
def server(output_dir: Path) -> Iterator[RedisServer]:
    redis_server = RedisServer(
        log_dir=output_dir / "drivers-redis", password=PASSWORD, appendfsync="always"
    )
    yield redis_server.start()
    redis_server.stop()


@pytest.fixture(scope="module")
def own_env(server: RedisServer, env: dict[str, str], output_dir: Path) -> Iterator[dict[str, str]]:
    """The environment of a deployment on the module's own Redis, with one worker."""
    own = {**env, "REDIS_URL": server.url}
    worker = CeleryProcess("worker", env=own, concurrency=16, log_dir=output_dir, name="drivers-w")
    worker.start()
    yield own
    worker.stop()


class Caller:
    """``batch_driver.py`` running: outcomes on stdout, log lines on stderr."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin and proc.stdout and proc.stderr
        self.proc, self.stdin, self.stdout = proc, proc.stdin, proc.stdout
        self.log: list[str] = []
        # stderr is drained all along (a full pipe would stall the caller); stdout is read
        # through one buffered file only (communicate() would skip what readline buffered)
        self.drain = threading.Thread(target=self.log.extend, args=(proc.stderr,), daemon=True)
        self.drain.start()

    def outcome(self) -> dict[str, Any]:
        line = self.stdout.readline()
        assert line, self.finish()[1]
        return dict(json.loads(line))

    def tell(self, line: str) -> None:
        self.stdin.write(line + "\n")
        self.stdin.flush()

    def finish(self, timeout: float = 90) -> tuple[list[dict[str, Any]], list[str]]:
        """The outcomes not read yet, and every log line."""
        self.stdin.close()
        rest = self.stdout.read()  # to the end: the caller exited or closed it
        self.proc.wait(timeout)
        self.drain.join(timeout)
        log = [line.rstrip("\n") for line in self.log]
        assert self.proc.returncode == 0, "\n".join(log[-40:])
        return [json.loads(t) for t in rest.splitlines() if t.strip()], log


def held_threads(env: dict[str, str]) -> list[str]:
    """The thread leases the deployment of ``env`` holds (another client's excluded)."""
    conn = redis.Redis.from_url(env["REDIS_URL"], decode_responses=True)
    try:
        slots = conn.zrange(Keys(env["CAPTCHAAI_KEY_PREFIX"]).slots(), 0, -1)
    finally:
        conn.close()
    return [s for s in slots if not s.startswith("external:")]


@pytest.fixture
def call(own_env: dict[str, str], sandbox: Any) -> Iterator[Callable[..., Caller]]:
    """Starts ``batch_driver.py`` on the module's own Redis, once its deployment holds no
    thread (a solve an earlier restart lost holds one until its lease expires)."""
    lease = float(MODULE_ENV["CAPTCHAAI_SLOT_LEASE"])
    wait_until(lambda: not held_threads(own_env), lease + 15, what="every thread given back")
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> Caller:
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), *args],
            env=own_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return Caller(proc)

    yield start
    for proc in started:  # a failed test leaves no caller running, and no pipe open
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.parametrize("mode", ["sync", "aio"])
def test_every_index_arrives_across_a_redis_restart(
    mode: str, server: RedisServer, call: Callable[..., Caller], sandbox: Any
) -> None:
    """The driver's part: it rides the outage out and yields every index once.  That the
    workers lose no solve and pay none twice across a restart is
    tests/worker/test_redis_restart.py's to show: a solve they lose fails here by its
    (short) per-task timeout, with its index."""
    sandbox.configure(solve_time=0.5, jitter=0.2)
    n = 40
    caller = call(mode, str(n), "--timeout-per-task", str(TASK_TIMEOUT_S))
    first = [caller.outcome() for _ in range(10)]
    server.restart(down_s=2.0)  # while the caller reads and sends
    rest, log = caller.finish()
    results = first + rest
    assert sorted(r["index"] for r in results) == list(range(n)), log
    failed = [r for r in results if r["status"] != "solved"]
    assert len(failed) < THREADS, failed  # a solve the workers lost, not the window
    assert all(r["error"].startswith("ERROR_") for r in failed), failed
    tokens = [r["token"] for r in results if r["status"] == "solved"]
    assert len(set(tokens)) == len(tokens)
    said = [line for line in log if "captcha_tasks.core.batching" in line]
    assert len(said) == 2 and "Redis is unavailable" in said[0], log  # once when it went...
    assert "Redis is back" in said[1], log  # ... and once when it came back
    assert not [line for line in log if PASSWORD in line]


@pytest.mark.parametrize("mode", ["sync", "aio"])
def test_leaving_while_redis_is_down_says_so_in_one_line(
    mode: str, server: RedisServer, call: Callable[..., Caller], sandbox: Any
) -> None:
    sandbox.configure(solve_time=0.5, jitter=0.2)
    caller = call(mode, str(2 * THREADS), "--leave-after", "1")
    assert caller.outcome()["status"] == "solved"
    server.stop()
    try:
        caller.tell("leave")
        rest, log = caller.finish()
    finally:
        server.start()
    assert rest == []
    assert len(log) == 1, log  # one line, no traceback
    assert log[0].startswith("WARNING captcha_tasks.batch: could not cancel batch "), log
    assert "ERROR_REDIS_UNAVAILABLE" in log[0] and "REDIS_URL=redis://:***@" in log[0]


def test_aio_solves_wait_out_a_redis_restart(
    server: RedisServer, call: Callable[..., Caller], sandbox: Any
) -> None:
    sandbox.configure(solve_time=3.0, jitter=0.2)
    n = THREADS // 2
    caller = call("solve", str(n))
    wait_until(lambda: sandbox.stats()["in_flight"] == n, 15, what="every solve submitted")
    server.restart(down_s=1.0)  # while every call waits for its result
    results, log = caller.finish()
    assert [r["status"] for r in results] == ["solved"] * n, results
    said = [line for line in log if "captcha_tasks.aio" in line]
    # one line each way, not one per attempt to reconnect
    assert [line.split(": ", 1)[1].split(" (")[0] for line in said] == [
        "result channel lost",
        "result channel is back",
    ], log
