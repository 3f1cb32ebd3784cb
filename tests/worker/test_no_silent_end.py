"""Once a solve is accepted, nothing ends it in silence.

Workers misbehave at a named step of the adapter (``CAPTCHAAI_FAULTS``, see
``captcha_tasks.faults``):

* an arbitrary exception there (a bug) ends the solve through the one completion path: its
  caller hears ``ERROR_INTERNAL`` within 2 s, its thread is freed, its batch line is there;
* a Redis connection error there (an outage) is waited out: the step runs again and the
  solve completes, paid once (at ``register``, after in.php, it is tried again in place:
  a retry of the task would start from the admission and pay again).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from followups import record, recorded

from captcha_tasks import errors, solve
from captcha_tasks.batch import stream
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

PAGE = "https://example.com/silence"
STEPS = ("solve", "admit", "in_php", "register", "poll")
#: Short HTTP timeouts allow a short visibility timeout: what a crash leaves owed (a round,
#: a follow-up) comes back within seconds.
FAST = {
    "CAPTCHAAI_CONNECT_TIMEOUT": "1",
    "CAPTCHAAI_READ_TIMEOUT": "3",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "8",
}


def task(sitekey: str) -> dict[str, Any]:
    return {"method": "turnstile", "sitekey": sitekey, "pageurl": PAGE}


def no_lease(solve_id: str) -> bool:
    state = app.runtime().state
    return state.redis.zscore(state.keys.slots(), solve_id) is None


@pytest.mark.parametrize("step", STEPS)
def test_a_failure_inside_a_step_ends_the_solve_at_once(
    sandbox: Any, start_worker: Any, step: str
) -> None:
    start_worker({**FAST, "CAPTCHAAI_FAULTS": f"raise@{step}"}, name=f"raise-{step}")
    started = time.monotonic()
    result = solve.delay(**task(f"raise-{step}"))
    with pytest.raises(errors.InternalError) as raised:
        result.get(timeout=30)
    heard = time.monotonic() - started
    assert heard < 2.0, heard
    assert raised.value.code == "ERROR_INTERNAL"
    assert step in raised.value.message and "InjectedFault" in raised.value.message
    wait_until(lambda: no_lease(result.id), 5, what="its thread freed")
    [line] = list(stream([task(f"batch-{step}")], timeout_per_task=10))
    assert (line["status"], line["error"], line["index"]) == ("failed", "ERROR_INTERNAL", 0)


@pytest.mark.parametrize("step", STEPS)
def test_an_outage_inside_a_step_is_waited_out(sandbox: Any, start_worker: Any, step: str) -> None:
    start_worker({**FAST, "CAPTCHAAI_FAULTS": f"redis@{step}*1"}, name=f"outage-{step}")
    result = solve.delay(**task(f"outage-{step}"))
    outcome = result.get(timeout=30)
    assert outcome["status"] == "solved"
    assert sandbox.verify(outcome["token"])["success"] is True
    # waited out, not started again: an outage after in.php (register) must not pay twice
    assert sandbox.stats()["submits"] == 1
    wait_until(lambda: no_lease(result.id), 5, what="its thread freed")


def test_a_solve_retried_after_an_outage_keeps_its_proxy_tenant_lane_and_link(
    sandbox: Any, start_worker: Any, redis_conn: Any
) -> None:
    """The retry of the first step is the same message again: what it carries besides the
    request (its stashed proxy's name, its route, what is linked to it) is sent on as it
    was."""
    import os

    start_worker(
        {**FAST, "CAPTCHAAI_FAULTS": "redis@solve*1", "PYTHONPATH": os.path.dirname(__file__)},
        extra_args=("--include", "followups"),
        name="outage-proxied",
    )
    proxied = {**task("outage-proxied"), "proxy": "user:secret@proxy.test:3128", "lane": "bulk"}
    result = solve.apply_async(kwargs=proxied, link=record.s("retried"))
    outcome = result.get(timeout=30)
    assert outcome["status"] == "solved"
    counted = app.runtime().state.stats.lane_outcomes()
    assert counted.get(("solved", "bulk", "default")) == 1
    [child] = result.children
    assert child.get(timeout=10) == outcome and recorded(redis_conn, "retried") == [outcome]


def test_what_a_failure_after_the_completion_left_undone_is_done_again(
    sandbox: Any, start_worker: Any, env: dict[str, str], redis_conn: Any
) -> None:
    """The completion ran, then the process failed before what follows it: the caller has
    its answer, and the chained task runs once its grace passes (it was owed)."""
    import os

    tests = os.path.dirname(__file__)
    start_worker(
        {**FAST, "CAPTCHAAI_FAULTS": "raise@complete*1", "PYTHONPATH": tests},
        extra_args=("--include", "followups"),
        name="after-complete",
    )
    result = solve.apply_async(kwargs=task("after"), link=record.s("after"))
    outcome = result.get(timeout=30)
    assert outcome["status"] == "solved"
    wait_until(lambda: recorded(redis_conn, "after"), 30, what="the owed follow-up")
    assert recorded(redis_conn, "after") == [outcome]
    del env
