"""A captcha paid for while Redis is away waits in its worker, up to its solve's deadline
(issue 29).  Before, the wait had no bound: a solve whose Redis never came back held its
worker thread for ever.

The runner runs in this process against a Redis server of the test's own and the sandbox
over HTTP: ``in.php`` hangs, the test stops the server while it does, and ``in.php``
answers with Redis away.

* Redis comes back after the deadline (within the grace): the solve ends through the
  completion with ``ERROR_SOLVE_TIMEOUT`` naming its captcha, its thread freed, paid once.
* Redis never comes back: the wait ends by the deadline and the grace, and the solve is
  logged as lost with its captcha id.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from captcha_tasks import errors
from captcha_tasks.state import State
from captcha_tasks.testing.processes import RedisServer, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.edges import Message
from captcha_tasks.worker.results import Results
from captcha_tasks.worker.runtime import Runtime

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/holding"
#: Seconds ``in.php`` hangs: the server is stopped meanwhile (a stop takes well under 1 s).
HANG_S = 3.0
#: The solve's deadline, from its start: it passes while Redis is away.
DEADLINE_S = HANG_S + 2.0
#: Seconds past the deadline the solve may still be ended through the completion.
GRACE_S = 10.0


@pytest.fixture
def server(output_dir: Path) -> Iterator[RedisServer]:
    # an append-only file: a server stopped and started again keeps the slot and the claim
    found = RedisServer(log_dir=output_dir / "holding", appendfsync="always").start()
    yield found
    found.stop()


class Said(logging.Handler):
    """The worker's log lines, as they come (the runner logs from its own thread)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


@pytest.fixture
def said() -> Iterator[Said]:
    handler = Said()
    logger = logging.getLogger("captcha_tasks.worker")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@dataclasses.dataclass
class Held:
    """A solve whose ``in.php`` answered while the server was stopped."""

    runtime: Runtime
    solve_id: str
    #: Its deadline, at most (taken just before the solve started).
    deadline: float
    thread: threading.Thread


def start(server: RedisServer, settings: Any, sandbox: Any) -> Held:
    mine = settings.replace(
        redis={"url": server.url, "key_prefix": f"holding-{uuid.uuid4().hex[:8]}"},
        solving={"solve_timeout": DEADLINE_S},
    )
    runtime = Runtime(app, mine, State.build(mine))
    runtime.runner.edges.policy = dataclasses.replace(runtime.runner.policy, hold_grace=GRACE_S)
    sandbox.configure(hang_rate=1.0, hang_s=HANG_S, solve_time=0.3, jitter=0.0)
    solve_id = f"hold-{uuid.uuid4().hex[:8]}"
    kwargs = {"method": "turnstile", "sitekey": "0x4AAAAAAAhold", "pageurl": PAGE}
    deadline = time.time() + DEADLINE_S
    thread = threading.Thread(
        target=runtime.runner.solve, args=(Message(solve_id), kwargs), daemon=True
    )
    thread.start()
    wait_until(lambda: sandbox.stats()["hangs"] >= 1, 10, what="in.php under way")
    sandbox.configure(hang_rate=0.0)
    server.stop()
    assert sandbox.stats()["submits"] == 0  # the premise: in.php answers with Redis away
    return Held(runtime, solve_id, deadline, thread)


def test_redis_back_after_the_deadline_ends_the_solve_in_a_timeout_through_the_completion(
    server: RedisServer, settings: Any, sandbox: Any, said: Said
) -> None:
    held = start(server, settings, sandbox)
    wait_until(lambda: said.has("waits here for it to be registered"), 15, what="the hold")
    # the last try to register is due at the deadline: every try after it ends the solve
    wait_until(lambda: said.has("its deadline passes"), DEADLINE_S + 5, what="the deadline")
    server.start()  # within the grace

    held.thread.join(GRACE_S + 10)
    assert not held.thread.is_alive()
    results = Results(app)
    state = held.runtime.state
    read = results.read(state.redis.get(results.key(held.solve_id)))
    with pytest.raises(errors.SolveTimeout) as ended:
        read.outcome()
    captcha_id = ended.value.captcha_id
    assert captcha_id and captcha_id in ended.value.message
    assert sandbox.stats()["submits"] == 1  # paid once, never again
    assert state.limiter.in_use() == 0  # its thread is free
    assert said.has(f"ended with ERROR_SOLVE_TIMEOUT (captcha {captcha_id} ")


def test_redis_that_never_comes_back_ends_the_wait_and_the_captcha_is_logged_lost(
    server: RedisServer, settings: Any, sandbox: Any, said: Said
) -> None:
    held = start(server, settings, sandbox)
    held.thread.join(DEADLINE_S + GRACE_S + 15)
    assert not held.thread.is_alive()  # the wait is bounded ...
    assert time.time() >= held.deadline + GRACE_S  # ... by the deadline and the grace
    [lost] = [line for line in said.lines if " is lost: " in line]
    provider = held.runtime.settings.providers.primary.name
    found = re.search(rf"captcha (\S+) at {provider} was paid for", lost)
    assert found is not None and found.group(1).isdigit(), lost
    assert sandbox.stats()["submits"] == 1
