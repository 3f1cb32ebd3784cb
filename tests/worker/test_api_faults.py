"""An API that misbehaves quietly: HTTP 429 with ``Retry-After``, and requests that hang."""

from __future__ import annotations

import time
from typing import Any

import pytest

from captcha_tasks import errors, solve
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

PAGE = "https://example.com/faults"


def test_a_429_holds_every_request_of_the_account(sandbox: Any, start_worker: Any) -> None:
    sandbox.configure(status_429_rate=1.0, retry_after=3, solve_time=0.2, jitter=0.0)
    start_worker(name="faults-429")
    first = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE)
    wait_until(lambda: sandbox.stats()["status_429"] >= 1, 15, what="the first 429")
    hourly = app.runtime().state.keys.rate("hourly")
    wait_until(lambda: app.runtime().state.redis.hget(hourly, "pause"), 10, what="the account held")
    # other solves, admitted while the account is held: none of them may ask the API
    others = [solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(3)]
    wait_until(lambda: sandbox.stats()["status_429"] >= 3, 20, what="three Retry-After waits")
    sandbox.configure(status_429_rate=0.0)
    outcomes = [r.get(timeout=30) for r in [first, *others]]
    assert all(o["status"] == "solved" for o in outcomes)
    stats = sandbox.stats()
    assert stats["requests_within_retry_after"] == 0, stats


def test_a_hanging_api_costs_its_read_timeout_and_never_outlives_the_deadline(
    sandbox: Any, start_worker: Any
) -> None:
    deadline, read_timeout = 4.0, 1.0
    sandbox.configure(hang_rate=1.0, hang_s=30.0)
    start_worker(
        {
            "CAPTCHAAI_CONNECT_TIMEOUT": "1",
            "CAPTCHAAI_READ_TIMEOUT": str(read_timeout),
            "CAPTCHAAI_VISIBILITY_TIMEOUT": "5",
            "CAPTCHAAI_SOLVE_TIMEOUT": str(deadline),
            "CAPTCHAAI_TRANSPORT_RETRIES": "50",
        },
        name="faults-hang",
    )
    started = time.monotonic()
    pending = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE)
    with pytest.raises(errors.SolveTimeout):
        pending.get(timeout=30)
    took = time.monotonic() - started
    assert took <= deadline + read_timeout + 2.0  # one hung request past the deadline at most
    assert sandbox.stats()["hangs"] >= 2  # it retried, each hang cut at the read timeout
    assert app.runtime().state.limiter.in_use() == 0  # its thread lease did not outlive the solve
