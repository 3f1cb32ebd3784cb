"""A token whose life ran out before delivery is discarded and the captcha solved again."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from captcha_tasks import solve
from captcha_tasks.core.outcome import parse_iso
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = pytest.mark.e2e

LIFE = 1.5


def test_expired_answer_is_never_delivered(sandbox: Any, start_worker: Any) -> None:
    sandbox.configure(token_ttl={"turnstile": LIFE}, solve_time=0.1, jitter=0.0)
    env = {"CAPTCHAAI_TOKEN_LIFETIMES": json.dumps({"turnstile": LIFE})}
    # Only submits run at first: the poll waits in its queue until the token has expired.
    queue = app.runtime().settings.celery.queue
    start_worker(env, queues=(queue("solve"), queue("submit")), name="submit-only")
    res = solve.delay(method="turnstile", sitekey="k", pageurl="https://example.com/")
    wait_until(lambda: sandbox.stats()["submits"] == 1, 15, what="the first submit")
    first_submit = time.time()
    wait_until(lambda: time.time() > first_submit + LIFE, LIFE + 1, what="token expiry")
    start_worker(env, queues=(queue("poll"),), name="poll-late")
    result = res.get(timeout=30)
    assert sandbox.stats()["submits"] == 2
    assert parse_iso(result["expires_at"]) > time.time()
    assert sandbox.verify(result["token"])["success"] is True
