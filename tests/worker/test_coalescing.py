"""Poll coalescing: one ``res.php?ids=`` request answers many in-flight captchas."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from captcha_tasks import solve
from captcha_tasks.worker.app import app

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/coalesce"


@pytest.fixture
def fresh_detection(redis_conn: Any, clean_state: None) -> Iterator[None]:
    redis_conn.delete(app.runtime().state.keys.bulk_support())
    yield
    redis_conn.delete(app.runtime().state.keys.bulk_support())


def solve_many(n: int) -> list[dict[str, Any]]:
    pending = [solve.delay(method="turnstile", sitekey=f"k{i}", pageurl=PAGE) for i in range(n)]
    return [r.get(timeout=60) for r in pending]


def test_bulk_requests_answer_many_captchas(
    sandbox: Any, start_worker: Any, fresh_detection: None, redis_conn: Any
) -> None:
    start_worker(name="bulk-on")
    sandbox.configure(solve_time=0.8, jitter=0.3)
    results = solve_many(14)
    stats = sandbox.stats()
    assert all(sandbox.verify(r["token"])["success"] for r in results)
    # several ids travelled in each request
    assert stats["res_php_ids"] >= 2 * stats["res_php_get_requests"]
    assert redis_conn.get(app.runtime().state.keys.bulk_support()) == "1"


def test_falls_back_to_one_id_per_request_without_bulk(
    sandbox: Any, start_worker: Any, fresh_detection: None, redis_conn: Any
) -> None:
    start_worker(name="bulk-missing")
    sandbox.configure(bulk=False, solve_time=0.5, jitter=0.2)
    results = solve_many(10)
    assert all(sandbox.verify(r["token"])["success"] for r in results)
    assert redis_conn.get(app.runtime().state.keys.bulk_support()) == "0"


def test_bulk_off_setting_polls_each_id(
    sandbox: Any, start_worker: Any, fresh_detection: None
) -> None:
    start_worker({"CAPTCHAAI_BULK_POLL": "off"}, name="bulk-off")
    sandbox.configure(solve_time=0.5, jitter=0.2)
    results = solve_many(10)
    stats = sandbox.stats()
    assert all(sandbox.verify(r["token"])["success"] for r in results)
    assert stats["res_php_ids"] == stats["res_php_get_requests"] >= len(results)
