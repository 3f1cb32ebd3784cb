"""Nothing Redis hands to a process lives only in that process's memory: a worker killed
between "Redis says it is yours" and "the message exists" loses no captcha.

The worker kills itself at a fault point (``CAPTCHAAI_FAULTS``, see
``captcha_tasks.faults``): after the completion script handed a freed thread to a parked
submit, before that submit's message is published; or after the admission told a submit to
wait for a budget, before it gave its thread back."""

from __future__ import annotations

from typing import Any

import pytest

from captcha_tasks import solve
from captcha_tasks.state import owed_config
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

PAGE = "https://example.com/crash"
THREADS = 3
#: Short HTTP timeouts allow a short visibility timeout: the dead worker's unacknowledged
#: messages come back within seconds.  This process's settings too: a solve message that
#: never starts is sent again after the visibility timeout of the process that sent it.
MODULE_ENV = FAST = {
    "CAPTCHAAI_THREADS": str(THREADS),
    "CAPTCHAAI_CONNECT_TIMEOUT": "2",
    "CAPTCHAAI_READ_TIMEOUT": "5",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "10",
}


def test_a_solve_message_a_worker_took_and_died_with_before_noting_it_is_sent_again(
    sandbox: Any, start_worker: Any
) -> None:
    """kombu takes a message off its queue (BRPOP) and only then notes it as unacknowledged
    (a second command): a worker SIGKILLed between the two takes the message with it, and
    kombu's visibility timeout cannot bring back what it never noted.  The test is that
    worker for the first half (its BRPOP; killing a real one inside kombu's two commands
    cannot be aimed), then housekeeping must send the message again, once."""
    sandbox.configure(solve_time=0.2)
    settings = app.runtime().settings
    result = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE)
    redis = app.runtime().state.redis
    taken = [m for m in (redis.rpop(q) for q in settings.celery.solve_queues) if m is not None]
    assert len(taken) == 1  # the message, gone from the broker and noted nowhere but owed

    start_worker(FAST, name="crash-after-brpop")
    outcome = result.get(timeout=owed_config(settings).message_grace_s + 30)
    assert outcome["status"] == "solved", outcome
    assert sandbox.stats()["submits"] == 1


def test_a_worker_killed_between_handout_and_publish_loses_nothing(
    sandbox: Any, start_worker: Any
) -> None:
    sandbox.configure(solve_time=0.5, jitter=0.1)
    # One task at a time: when it dies at the point, no other task of it is half-way
    # through an in.php call (a captcha paid for that nobody learnt the id of).
    doomed = start_worker(
        {**FAST, "CAPTCHAAI_FAULTS": "handout"}, concurrency=1, name="crash-doomed"
    )
    results = [
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(4 * THREADS)
    ]
    wait_until(lambda: not doomed.alive(), 30, what="the worker to reach the fault point")
    assert doomed.proc.returncode == -9  # it died at the point, not of something else
    owed = app.runtime().state.redis.zcard(app.runtime().state.keys.dispatch())
    assert owed >= 1  # Redis handed a thread to a parked submit whose message never left

    start_worker(FAST, name="crash-survivor")
    outcomes = [r.get(timeout=60) for r in results]
    assert all(o["status"] == "solved" for o in outcomes)
    tokens = [o["token"] for o in outcomes]
    assert len(set(tokens)) == len(tokens)
    stats = sandbox.stats()
    assert stats["submits"] == len(results)  # none paid twice
    assert stats["peak_in_flight"] <= THREADS
    wait_until(lambda: app.runtime().state.limiter.in_use() == 0, 10, what="every thread freed")


def test_a_worker_killed_between_a_budget_wait_and_giving_its_thread_back_loses_nothing(
    sandbox: Any, start_worker: Any
) -> None:
    """The admission said "wait for the submit budget" (its slot still held, its job only
    in the unacknowledged message) and the worker died before giving the slot back: the
    message comes again, finds the slot it holds, and goes on."""
    sandbox.configure(solve_time=0.5, jitter=0.1)
    budget = {**FAST, "CAPTCHAAI_SUBMIT_RATE": "2"}  # two in.php requests per 3 s
    doomed = start_worker(
        {**budget, "CAPTCHAAI_FAULTS": "budget_wait"}, concurrency=1, name="crash-budget"
    )
    results = [solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(6)]
    wait_until(lambda: not doomed.alive(), 30, what="the worker to reach the fault point")
    assert doomed.proc.returncode == -9

    start_worker(budget, name="crash-budget-survivor")
    outcomes = [r.get(timeout=60) for r in results]
    assert all(o["status"] == "solved" for o in outcomes)
    tokens = [o["token"] for o in outcomes]
    assert len(set(tokens)) == len(tokens)
    stats = sandbox.stats()
    assert stats["submits"] == len(results)  # none paid twice
    assert stats["peak_in_flight"] <= THREADS
    wait_until(lambda: app.runtime().state.limiter.in_use() == 0, 10, what="every thread freed")
