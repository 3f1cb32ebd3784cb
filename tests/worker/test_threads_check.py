"""Housekeeping's look at the provider's threads, one check at a time (no worker): a slot
whose submit has not reached the provider when it counts must not hide one of another
client's threads (a CI run saw the provider queue three of our submits that way)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import requests

from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker import housekeeping

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("clean_state")]

OTHER_KEY = "another-client-key"
OTHERS = 3


def submit(sandbox: Any, key: str) -> None:
    """One captcha at the sandbox under ``key``, as a client's ``in.php`` sends it."""
    resp = requests.post(
        f"{sandbox.url}/in.php",
        data={"key": key, "method": "turnstile", "sitekey": "x", "pageurl": "https://e.x"},
        timeout=5,
    )
    assert resp.text.startswith("OK|"), resp.text


def other_client_takes_threads(sandbox: Any) -> None:
    for _ in range(OTHERS):
        submit(sandbox, OTHER_KEY)


def take_slot(limiter: Any, solve_id: str) -> None:
    """A slot taken for ``solve_id`` whose ``in.php`` has not been sent yet."""
    job = json.dumps({"solve_id": solve_id, "request": {}, "attempt": 0})
    assert limiter.admit(solve_id, job, attempt=0, deadline_in_s=60).status == "go"


# Alone first: the sandbox keeps the other client's captchas solving past its test.
def test_alone_a_submit_on_its_way_is_not_another_client(app: Any, sandbox: Any) -> None:
    runtime = app.runtime()
    sandbox.configure(threads=runtime.settings.providers.threads, solve_time=60.0)
    limiter = runtime.state.provider(None).limiter
    take_slot(limiter, "on-its-way")
    drift = housekeeping.check_threads(runtime.runner)
    assert drift is not None and (drift.now, drift.ours) == (0, 1)
    assert limiter.external() == 0


def test_alone_a_submit_made_while_the_provider_counts_is_not_another_client(
    app: Any, sandbox: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = app.runtime()
    # held (the latch) while the check looks, and done soon after: the next test's
    # provider holds nothing of ours
    sandbox.configure(threads=runtime.settings.providers.threads, solve_time=0.2, hold=True)
    limiter = runtime.state.provider(None).limiter
    api = runtime.api(None)
    count = api.threads_info

    def submit_then_count() -> Any:
        # between the check's read of our slots and the provider's count, a submit takes
        # a slot and reaches the provider (as a busy worker's may)
        take_slot(limiter, "during-the-count")
        submit(sandbox, os.environ["CAPTCHAAI_API_KEY"])
        return count()

    monkeypatch.setattr(api, "threads_info", submit_then_count)
    drift = housekeeping.check_threads(runtime.runner)
    assert drift is not None and (drift.now, drift.ours) == (0, 1)
    assert limiter.external() == 0
    sandbox.configure(hold=False)
    wait_until(lambda: sandbox.stats()["in_flight"] == 0, 10, what="the captcha to end")


def test_a_submit_on_its_way_does_not_hide_another_clients_thread(app: Any, sandbox: Any) -> None:
    runtime = app.runtime()
    sandbox.configure(
        threads=runtime.settings.providers.threads,
        api_keys=[os.environ["CAPTCHAAI_API_KEY"], OTHER_KEY],
        solve_time=60.0,
        queue_silently=True,
    )
    other_client_takes_threads(sandbox)
    limiter = runtime.state.provider(None).limiter
    take_slot(limiter, "on-its-way")  # held, but the provider has not seen it
    drift = housekeeping.check_threads(runtime.runner)
    assert drift is not None
    # the provider counts the other client's 3 and nothing of ours: all 3 are its
    assert (drift.now, limiter.external()) == (OTHERS, OTHERS)
