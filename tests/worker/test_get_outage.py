"""``get()`` waits out a Redis outage within its timeout, as the solve does; so does
``aio.solve(timeout=...)``.

A Redis server of the test's own (append-only file synced on every write) is stopped and
started again on the same port; the caller is a process of its own on it
(``outage_caller.py``), the worker a real one, started only once Redis is back, so the
outcome cannot exist before the outage ends:

* ``get(timeout=30)`` issued during a 10 s outage returns the outcome after it;
  ``aio.solve(timeout=30)`` waiting when a 10 s outage begins does the same;
* an outage longer than the timeout raises ``StoreUnavailable`` (REDIS_URL, password
  masked), never a redis-py error, at the timeout; with Redis back and no outcome yet, the
  timeout is the plain one (Celery's ``TimeoutError``, asyncio's ``TimeoutError``), and
  once a worker runs the next call has the outcome;
* the first call after a restart (connections of the old server in the pools) returns;
  the worker, through the same restart, says Redis restarted (not that the master
  changed) and logs no Celery deprecation notice.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import CeleryProcess, RedisServer, queue_names

pytestmark = pytest.mark.e2e

CALLER = Path(__file__).with_name("outage_caller.py")
OUTAGE_S = 10.0
TIMEOUT_S = 30.0
#: The short timeout of the calls that outlast it.
SHORT_S = 5.0
#: What the caller says when it meets the outage, sync and asyncio.
WENT_AWAY = {"sync": "Redis went away while a result was awaited", "aio": "result channel lost"}
#: How late past its timeout a call may raise (a back-off step is at most 1 s).
LATE_S = 1.5
#: Longest wait for any one thing the test expects (a reply, a log line, a state).
WAIT_S = 60.0
PASSWORD = "outage-secret-pw"


class Caller:
    """The caller process: commands in, JSON lines out (read by a thread into a queue)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.stderr = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, str(CALLER)],
            env={**os.environ, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.said: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(json.loads(raw))

    def ask(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def next(self, key: str) -> dict[str, Any]:
        """The next line carrying ``key`` (log lines on the way are kept in ``said``)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                said = self.said
                raise AssertionError(f"the caller said no {key!r} line; it said {said}") from None
            if "log" in line:
                self.said.append(line["log"])
            if key in line:
                return line
            if "raised" in line or "got" in line:
                raise AssertionError(f"expected {key!r}, the caller answered {line}")

    def says(self, text: str) -> None:
        """Wait until the caller has logged ``text``."""
        while not any(text in said for said in self.said):
            self.next("log")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


class Stack:
    """The test's Redis server, the caller on it, and a worker once asked for."""

    def __init__(self, out: Path, name: str, sandbox_url: str, password: str | None = None) -> None:
        self.out = out
        self.server = RedisServer(log_dir=out, appendfsync="always", password=password)
        self.server.start()
        prefix = f"get-outage-{uuid.uuid4().hex[:8]}"
        self.env = {
            "CAPTCHAAI_BASE_URL": sandbox_url,  # the module's own sandbox
            "REDIS_URL": self.server.url,
            "CAPTCHAAI_KEY_PREFIX": prefix,
            "CAPTCHAAI_QUEUE_PREFIX": prefix,
        }
        self.caller = Caller(self.env, out / "caller.log")
        self.worker: CeleryProcess | None = None
        self.stopped = 0.0

    def query(self, call: Callable[[redis.Redis], Any]) -> Any:
        """``call`` on a client of the test's own (closed after it)."""
        with redis.Redis.from_url(self.server.url, decode_responses=True) as conn:
            return call(conn)

    def start_worker(self) -> None:
        self.worker = CeleryProcess("worker", env=self.env, log_dir=self.out, name="w0").start()

    def stop_redis(self) -> None:
        self.server.stop()  # SIGTERM: the append-only file holds every write
        self.stopped = time.monotonic()

    def start_redis_after(self, outage_s: float) -> float:
        """Start Redis again ``outage_s`` after it stopped; returns when it answered."""
        # The outage's chosen length, not a synchronisation.
        time.sleep(max(0.0, self.stopped + outage_s - time.monotonic()))  # the outage's length
        self.server.start()
        return time.monotonic()

    def wait_for(self, state: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not state():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)  # a poll of a condition with a deadline

    def close(self) -> None:
        self.caller.close()
        if self.worker is not None:
            self.worker.stop()
        self.server.stop()


@pytest.fixture
def stack(request: pytest.FixtureRequest, output_dir: Path, sandbox: Any) -> Iterator[Stack]:
    name = request.node.name.replace("[", "-").rstrip("]")
    password = PASSWORD if "timeout" in name else None
    built = Stack(output_dir / "get-outage" / name, name, sandbox.url, password)
    yield built
    built.close()


def aio_waiting(stack: Stack) -> Callable[[], bool]:
    """The caller's aio.solve has sent its message and subscribed to its result."""
    queues = queue_names(stack.env)

    def state() -> bool:
        queued = stack.query(lambda r: sum(r.llen(q) for q in queues))
        subscribed = stack.query(lambda r: r.pubsub_channels("celery-task-meta-*"))
        return bool(queued == 1 and len(subscribed) == 1)

    return state


@pytest.mark.timeout(180)
def test_get_issued_during_an_outage_returns_the_outcome_after_it(stack: Stack) -> None:
    stack.caller.ask(do="send")
    task_id = stack.caller.next("sent")["sent"]
    stack.stop_redis()
    stack.caller.ask(do="get", id=task_id, timeout=TIMEOUT_S)
    stack.caller.says(WENT_AWAY["sync"])  # get() met the outage, and waits
    back = stack.start_redis_after(OUTAGE_S)
    stack.start_worker()  # the outcome can only exist from now on
    reply = stack.caller.next("got")
    assert reply["got"]["status"] == "solved", reply
    assert reply["ended"] > back


@pytest.mark.timeout(180)
def test_aio_waiting_when_an_outage_begins_returns_the_outcome_after_it(stack: Stack) -> None:
    stack.caller.ask(do="aio", timeout=TIMEOUT_S)
    stack.wait_for(aio_waiting(stack), "the solve queued and its result subscribed")
    stack.stop_redis()
    stack.caller.says(WENT_AWAY["aio"])
    back = stack.start_redis_after(OUTAGE_S)
    stack.start_worker()
    reply = stack.caller.next("got")
    assert reply["got"]["status"] == "solved", reply
    assert reply["ended"] > back


def assert_store_unavailable(reply: dict[str, Any], stack: Stack) -> None:
    assert reply.get("raised") == "captcha_tasks.errors.StoreUnavailable", reply
    assert SHORT_S - 0.1 <= reply["s"] <= SHORT_S + LATE_S, reply
    message = reply["message"]
    assert message.startswith("ERROR_REDIS_UNAVAILABLE: Redis is down"), message
    assert f"127.0.0.1:{stack.server.port}" in message and ":***@" in message, message
    assert PASSWORD not in message


@pytest.mark.timeout(180)
def test_get_past_its_timeout_with_redis_away_raises_store_unavailable(stack: Stack) -> None:
    stack.caller.ask(do="send")
    task_id = stack.caller.next("sent")["sent"]
    stack.stop_redis()
    stack.caller.ask(do="get", id=task_id, timeout=SHORT_S)
    assert_store_unavailable(stack.caller.next("raised"), stack)
    stack.start_redis_after(0)
    # Redis answers, no worker: the timeout is Celery's own
    stack.caller.ask(do="get", id=task_id, timeout=1)
    reply = stack.caller.next("raised")
    assert reply["raised"] == "celery.exceptions.TimeoutError", reply
    stack.start_worker()  # and the next get() of the same result has it
    stack.caller.ask(do="get", id=task_id, timeout=TIMEOUT_S)
    assert stack.caller.next("got")["got"]["status"] == "solved"


@pytest.mark.timeout(180)
def test_aio_past_its_timeout_with_redis_away_raises_store_unavailable(stack: Stack) -> None:
    stack.caller.ask(do="aio", timeout=SHORT_S)
    stack.wait_for(aio_waiting(stack), "the solve queued and its result subscribed")
    stack.stop_redis()
    assert_store_unavailable(stack.caller.next("raised"), stack)
    stack.start_redis_after(0)
    stack.caller.ask(do="aio", timeout=1)  # Redis answers, no worker: asyncio's timeout
    reply = stack.caller.next("raised")
    assert reply["raised"] == "builtins.TimeoutError", (reply, stack.caller.said)
    stack.start_worker()  # and the next call has its outcome
    stack.caller.ask(do="aio", timeout=TIMEOUT_S)
    assert stack.caller.next("got")["got"]["status"] == "solved"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("api", ["sync", "aio"])
def test_the_first_call_after_a_restart_returns(stack: Stack, api: str) -> None:
    stack.start_worker()

    def call() -> dict[str, Any]:
        if api == "sync":
            stack.caller.ask(do="send")
            stack.caller.ask(do="get", id=stack.caller.next("sent")["sent"], timeout=TIMEOUT_S)
        else:
            stack.caller.ask(do="aio", timeout=TIMEOUT_S)
        return stack.caller.next("got")["got"]

    assert call()["status"] == "solved"  # the caller's pools and pub/sub now hold connections
    master = Keys(stack.env["CAPTCHAAI_KEY_PREFIX"]).redis_master()
    looked = lambda: bool(stack.query(lambda r: r.exists(master)))  # noqa: E731
    stack.wait_for(looked, "the worker's look at the master")
    stack.stop_redis()
    stack.start_redis_after(1.0)
    assert call()["status"] == "solved"
    # The worker rode the restart too, and says it was one: the same server, back.
    worker = stack.worker
    assert worker is not None
    stack.wait_for(lambda: "Redis restarted: sending again" in worker.log_text(), "its note")
    said = worker.log_text()
    assert "the Redis master changed" not in said
    assert "CPendingDeprecationWarning" not in said  # its broker connection was lost
