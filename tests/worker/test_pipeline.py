"""End to end: ``solve.delay`` → real worker process → sandbox over HTTP → Redis result."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import pytest
from celery.result import AsyncResult
from image_files import png_b64

from captcha_tasks import errors, solve
from captcha_tasks.core.outcome import parse_iso
from captcha_tasks.methods import build_request
from captcha_tasks.worker.app import app
from captcha_tasks.worker.edges import policy
from captcha_tasks.worker.tasks import solve as solve_task

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("worker", "clean_state")]

PAGE = "https://example.com/form"
GET_TIMEOUT = 30

CASES: list[tuple[str, dict[str, Any]]] = [
    ("userrecaptcha", {"sitekey": "6Le-v2-key", "pageurl": PAGE}),
    (
        "userrecaptcha",
        {
            "sitekey": "6Le-v2-key",
            "pageurl": PAGE,
            "invisible": 1,
            "data-s": "abc",
            "enterprise": 0,
        },
    ),
    (
        "userrecaptcha",
        {
            "sitekey": "6Le-v3-key",
            "pageurl": PAGE,
            "version": "v3",
            "action": "login",
            "min_score": 0.7,
        },
    ),
    ("turnstile", {"sitekey": "0x4AAAAAAA", "pageurl": PAGE, "action": "signup"}),
    (
        "turnstile",
        {
            "sitekey": "0x4AAAAAAA",
            "pageurl": PAGE,
            "proxy": "user:pw@10.0.0.1:3128",
            "proxytype": "HTTP",
            "userAgent": "Mozilla/5.0",
        },
    ),
]


@pytest.mark.parametrize(("method", "kwargs"), CASES)
def test_token_methods_happy_path(sandbox: Any, method: str, kwargs: dict[str, Any]) -> None:
    result = solve.delay(method=method, **kwargs).get(timeout=GET_TIMEOUT)
    assert result["status"] == "solved"
    assert result["method"] == method
    assert result["source"] == "api"
    assert result["captcha_id"]
    solved_at, expires_at = parse_iso(result["solved_at"]), parse_iso(result["expires_at"])
    life = policy(app.runtime().settings).token_life(build_request(method, **kwargs))
    assert expires_at - solved_at <= life + 0.01
    assert expires_at > time.time()
    verdict = sandbox.verify(result["token"])
    assert verdict["success"] is True, verdict
    assert verdict["sitekey"] == kwargs["sitekey"]
    # single-use: a second verify fails
    assert sandbox.verify(result["token"])["success"] is False


def test_geetest_answer_is_an_object(sandbox: Any) -> None:
    result = solve.delay(
        method="geetest", sitekey="gt-value", pageurl=PAGE, challenge="ch-1", api_server="api.x"
    ).get(timeout=GET_TIMEOUT)
    token = result["token"]
    assert isinstance(token, dict)
    assert {"geetest_challenge", "geetest_validate", "geetest_seccode"} <= set(token)
    assert sandbox.verify(token["geetest_validate"])["success"] is True


def test_image_answer_text_kept_whole(sandbox: Any) -> None:
    body = png_b64()
    answers = [
        solve.delay(method="base64", body=body, numeric=0, min_len=4, max_len=8).get(
            timeout=GET_TIMEOUT
        )["token"]
        for _ in range(6)
    ]
    assert all(isinstance(a, str) and 4 <= len(a) <= 8 for a in answers), answers


def test_polls_per_solve_with_adaptive_first_poll(sandbox: Any, redis_conn: Any) -> None:
    settings = app.runtime().settings
    for _ in range(2):
        results = [
            solve.delay(method="turnstile", sitekey="k", pageurl=PAGE)
            for _ in range(settings.solving.adaptive_min_samples)
        ]
        for r in results:
            r.get(timeout=GET_TIMEOUT)
    samples = redis_conn.llen(app.runtime().state.keys.solve_times("turnstile"))
    assert samples >= 2 * settings.solving.adaptive_min_samples
    sandbox.reset()
    warm = [solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(10)]
    for r in warm:
        r.get(timeout=GET_TIMEOUT)
    stats = sandbox.stats()
    per_solve = stats["res_php_requests"] / stats["submits"]
    # With warm samples, most captchas are fetched on the first or second poll.
    assert stats["submits"] == len(warm)
    assert per_solve <= 2.0, stats


def test_thread_limit_backs_off_and_completes(sandbox: Any) -> None:
    sandbox.configure(threads=2, solve_time=0.3, jitter=0.05)
    results = [solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(6)]
    tokens = [r.get(timeout=GET_TIMEOUT)["token"] for r in results]
    stats = sandbox.stats()
    assert stats["thread_rejections"] > 0
    assert stats["peak_in_flight"] <= 2
    assert len(set(tokens)) == len(tokens)


def test_unsolvable_is_resubmitted_within_budget(sandbox: Any) -> None:
    sandbox.configure(unsolvable_rate=1.0)
    with pytest.raises(errors.UnsolvableError) as info:
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE).get(timeout=GET_TIMEOUT)
    assert info.value.code == "ERROR_CAPTCHA_UNSOLVABLE"
    # the first captcha plus the bounded resubmits
    assert sandbox.stats()["submits"] == 1 + app.runtime().settings.solving.max_resubmits


def test_fatal_key_error_after_one_request(sandbox: Any) -> None:
    sandbox.configure(api_keys=["somebody-elses-key"])
    started = time.monotonic()
    with pytest.raises(errors.AuthError) as info:
        solve.delay(method="turnstile", sitekey="k", pageurl=PAGE).get(timeout=GET_TIMEOUT)
    elapsed = time.monotonic() - started
    assert info.value.code == "ERROR_WRONG_USER_KEY"
    stats = sandbox.stats()
    assert stats["in_php_requests"] == 1
    # no poll (the worker's own balance or threads checks may come at any time)
    assert stats["res_php_get_requests"] == 0
    assert elapsed < app.runtime().settings.solving.solve_timeout


def test_api_key_not_in_failure(sandbox: Any) -> None:
    sandbox.configure(api_keys=["somebody-elses-key"])
    res = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE)
    with pytest.raises(errors.AuthError):
        res.get(timeout=GET_TIMEOUT)
    assert app.runtime().settings.providers.api_key not in repr(res.backend.get_task_meta(res.id))


def solve_keys(redis_conn: Any) -> set[str]:
    """Every key of a solve's own (records, secrets, results): what a call leaves behind
    (housekeeping's short-lived locks come and go on their own)."""
    prefix = app.runtime().state.keys.prefix
    return set(redis_conn.scan_iter(f"{prefix}:solve:*")) | set(
        redis_conn.scan_iter("celery-task-meta-*")
    )


def test_validation_error_before_anything_is_queued(redis_conn: Any) -> None:
    before = {q: redis_conn.llen(q) for q in app.runtime().settings.celery.queues}
    keys_before = solve_keys(redis_conn)
    requested_before = redis_conn.zcard(app.runtime().state.keys.requested())
    sent: list[str] = []

    def delay(*args: Any, **kwargs: Any) -> None:
        # solve.delay, under an id of its own: a result record of an earlier test's solve
        # may land meanwhile (this Redis is the module's), one of these may not
        sent.append(str(uuid.uuid4()))
        solve.apply_async(args, kwargs, task_id=sent[-1])

    with pytest.raises(errors.ValidationError, match="pageurl"):
        delay(method="turnstile", sitekey="k", pageurl="javascript:alert(1)")
    with pytest.raises(errors.ValidationError, match="unknown method"):
        delay(method="nope", sitekey="k", pageurl=PAGE)
    with pytest.raises(errors.ValidationError, match="sitekey"):
        delay("userrecaptcha", pageurl=PAGE)
    with pytest.raises(errors.ValidationError, match="method is required"):
        delay(sitekey="k", pageurl=PAGE)  # once a TypeError from build_request
    with pytest.raises(errors.ValidationError, match="method is required"):
        delay(**{"sitekey": "k", "pageurl": PAGE})
    assert {q: redis_conn.llen(q) for q in before} == before
    # no record, secret or result of theirs
    assert [k for k in solve_keys(redis_conn) - keys_before if any(i in k for i in sent)] == []
    assert redis_conn.zcard(app.runtime().state.keys.requested()) == requested_before


def test_redelivered_solve_is_not_submitted_again(sandbox: Any) -> None:
    # The same message delivered twice (as after a worker died before acking it): same
    # task id, same arguments.
    kwargs = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE}
    first = solve.apply_async(kwargs=kwargs)
    second = solve_task.apply_async(kwargs=kwargs, task_id=first.id)
    result = first.get(timeout=GET_TIMEOUT)
    assert second.get(timeout=GET_TIMEOUT) == result
    assert sandbox.stats()["submits"] == 1
    assert sandbox.verify(result["token"])["success"] is True


def test_transient_errors_are_retried(sandbox: Any) -> None:
    # Seeded: the sandbox's first draw (the error check of the first request) is 0.13,
    # so at least that request gets an HTTP 500, an HTML page, an empty body or
    # ERROR_SERVER_ERROR, whatever the timing of the others.
    sandbox.configure(error_rate=0.3, seed=1)
    results = [solve.delay(method="turnstile", sitekey="k", pageurl=PAGE) for _ in range(5)]
    for r in results:
        assert r.get(timeout=GET_TIMEOUT)["status"] == "solved"
    stats = sandbox.stats()
    assert stats["injected_errors"] >= 1, stats
    assert stats["submits"] == len(results)


def test_async_result_state_is_success(sandbox: Any) -> None:
    res = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE)
    res.get(timeout=GET_TIMEOUT)
    assert AsyncResult(res.id).state == "SUCCESS"


def test_account_command_shows_balance_and_threads(sandbox: Any, env: dict[str, str]) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "captcha_tasks.cli", "account"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config = sandbox.stats()["config"]
    assert f"balance: {config['balance']:.4f}" in done.stdout
    # the sandbox may still be finishing an earlier test's captcha: any count, its plan
    assert re.search(rf"threads \(API\): \d+/{config['threads']} in use", done.stdout)
    assert f"/{app.runtime().settings.providers.capacity} in use" in done.stdout
