"""A provider callback that comes before its captcha is registered: kept (bounded, MAC
checked), and applied when the worker registers the captcha.  The sandbox over HTTP and
Redis are real; the worker's steps run in this process, so the test decides when the
captcha is registered: after ``in.php`` answered and the callback came."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery.result import AsyncResult

from captcha_tasks.core import pingback, steps
from captcha_tasks.core.answers import NOT_READY
from captcha_tasks.core.channel import UP
from captcha_tasks.core.job import Job
from captcha_tasks.methods import build_request
from captcha_tasks.receiver.callbacks import Receiver, Verdict
from captcha_tasks.state.channel import EARLY_POLL_S
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.runtime import Runtime

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

SECRET = "early-callback-secret-" + "x" * 8
PAGE = "https://example.com/early"


@pytest.fixture
def receiver(settings: Any, state: Any) -> Receiver:
    url = "http://127.0.0.1:9/captcha/pingback"  # the test calls the receiver itself
    mine = settings.replace(pingback={"secret": SECRET, "url": url})
    return Receiver(Runtime(app, mine, state).runner)


def submitted(receiver: Receiver, solve_id: str) -> tuple[Job, str, str]:
    """A solve's captcha at the provider (``in.php`` answered), not registered yet; its
    answer, once the provider has it."""
    request = build_request("turnstile", "0x4A", PAGE)
    job = Job.new(solve_id, request, time.time(), 300.0)
    api = receiver.runner.api()
    captcha_id = api.submit(request)

    def answer() -> str | None:
        found = api.get(captcha_id)
        return None if found is NOT_READY else str(found.value)  # type: ignore[union-attr]

    code = wait_until(answer, 10, what="the provider's answer")
    return job, captcha_id, str(code)


def register(receiver: Receiver, job: Job, captcha_id: str) -> None:
    """What the worker does once ``in.php`` answered: decide, and register the captcha."""
    runner = receiver.runner
    timing = runner.edges.timing(job)
    decision = steps.on_submitted(
        job, captcha_id, time.time(), timing, runner.policy, True, channel=UP
    )
    runner.act_on_submit(job, decision)


def test_an_early_callback_completes_its_captcha_when_it_is_registered(
    sandbox: Any, receiver: Receiver, state: Any
) -> None:
    job, captcha_id, code = submitted(receiver, "early-1")
    ticket = pingback.read_ticket(SECRET, pingback.ticket(SECRET, job.solve_id, 0))
    assert receiver.handle(ticket, captcha_id, code) == Verdict(202, "early")
    assert not AsyncResult(job.solve_id, app=app).ready()  # nothing to complete yet

    register(receiver, job, captcha_id)
    result = AsyncResult(job.solve_id, app=app).get(timeout=10)
    assert (result["token"], result["captcha_id"]) == (code, captcha_id)
    assert sandbox.verify(code)["success"]
    assert state.stats.solved("turnstile") == {"pingback": 1}
    assert receiver.handle(ticket, captcha_id, code).reason == "replay"  # once only
    assert state.channel.read().hits == 1  # heard as an answer by callback


def test_an_early_callback_for_another_captcha_changes_nothing(
    sandbox: Any, receiver: Receiver, state: Any
) -> None:
    job, captcha_id, code = submitted(receiver, "early-2")
    ticket = pingback.read_ticket(SECRET, pingback.ticket(SECRET, job.solve_id, 0))
    other = str(int(captcha_id) + 1000)  # its ticket, with an id that is not its captcha's
    assert receiver.handle(ticket, other, "0.FORGED") == Verdict(202, "early")
    register(receiver, job, captcha_id)
    assert not AsyncResult(job.solve_id, app=app).ready()  # left to polls
    entry, _ = state.board.lookup(captcha_id, job.solve_id)
    assert entry is not None and Job.from_json(entry.job).captcha_id == captcha_id
    # its real callback still counts
    assert receiver.handle(ticket, captcha_id, code) == Verdict(200, "accepted")
    assert AsyncResult(job.solve_id, app=app).get(timeout=10)["token"] == code


def test_only_a_callback_with_a_right_mac_and_an_ending_code_is_kept(
    sandbox: Any, receiver: Receiver, state: Any
) -> None:
    job, captcha_id, _ = submitted(receiver, "early-3")
    segment = pingback.ticket("another-secret-abcdef", job.solve_id, 0)
    fields = {"id": captcha_id, "code": "0.FORGED"}
    assert receiver.handle_request("GET", segment, fields, "127.0.0.1").reason == "bad_mac"
    segment = pingback.ticket(SECRET, job.solve_id, 0)
    not_ready = {"id": captcha_id, "code": "CAPCHA_NOT_READY"}
    assert receiver.handle_request("GET", segment, not_ready, "127.0.0.1").reason == "bad_code"
    assert state.redis.hlen(state.keys.pingback_early()) == 0


def test_a_worker_that_dies_with_an_early_callback_in_hand_loses_nothing(
    sandbox: Any, receiver: Receiver, state: Any, start_worker: Any
) -> None:
    job, captcha_id, code = submitted(receiver, "early-4")
    ticket = pingback.read_ticket(SECRET, pingback.ticket(SECRET, job.solve_id, 0))
    assert receiver.handle(ticket, captcha_id, code) == Verdict(202, "early")
    # what a worker does up to applying it (it registers the captcha, first polled in 30 s,
    # takes the early callback and publishes the round), and then it is SIGKILLed
    at_provider = job.submitted(captcha_id, time.time())
    registered = state.board.register(job.solve_id, 0, captcha_id, at_provider.to_json(), 30.0)
    assert registered.early == code
    receiver.runner.publish_round(registered.round)

    start_worker()  # the surviving workers: a poll reads the answer the provider has
    result = AsyncResult(job.solve_id, app=app).get(timeout=EARLY_POLL_S + 10)
    assert (result["token"], result["captcha_id"]) == (code, captcha_id)
    assert sum(state.stats.solved("turnstile").values()) == 1
