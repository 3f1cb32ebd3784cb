"""CaptchaAI's methods end to end: ``solve.delay`` → a real worker process → the sandbox
over HTTP → the outcome, with the answer's shape and its user agent."""

from __future__ import annotations

from typing import Any

import pytest
from image_files import png, png_b64

from captcha_tasks import create_pool, errors, solve
from captcha_tasks.methods import MAX_IMAGE_BYTES
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.tasks import prewarm

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("worker", "clean_state")]

PAGE = "https://example.com/checkout"
PROXY = "user:pw@10.0.0.1:3128"
GET_TIMEOUT = 30

TOKENS: list[tuple[str, dict[str, Any], bool]] = [
    # method, solve's arguments, whether the outcome carries a user agent
    ("userrecaptcha", {"sitekey": "6Le-ent", "pageurl": PAGE, "enterprise": 1}, True),
    (
        "userrecaptcha",
        {"sitekey": "6Le-v3e", "pageurl": PAGE, "version": "v3", "action": "pay", "enterprise": 1},
        True,
    ),
    ("cloudflare_challenge", {"pageurl": PAGE, "proxy": PROXY}, True),
    ("captchafox", {"sitekey": "sk-fox", "pageurl": PAGE, "proxy": PROXY}, True),
    ("friendly_captcha", {"sitekey": "FCMG", "pageurl": PAGE, "version": "v2"}, False),
]


@pytest.mark.parametrize(("method", "kwargs", "agent"), TOKENS)
def test_token_methods(sandbox: Any, method: str, kwargs: dict[str, Any], agent: bool) -> None:
    result = solve.delay(method=method, **kwargs).get(timeout=GET_TIMEOUT)
    assert (result["status"], result["method"], result["source"]) == ("solved", method, "api")
    assert sandbox.verify(result["token"])["success"] is True
    assert ("user_agent" in result) is agent
    if agent:
        assert result["user_agent"].startswith("Mozilla/5.0")
    assert list(result)[-1] == "token"


def test_the_callers_user_agent_comes_back_with_the_token(sandbox: Any) -> None:
    mine = "Mozilla/5.0 (X11; Linux x86_64) e2e"
    for name in ("user_agent", "userAgent"):
        result = solve.delay(
            method="cloudflare_challenge", pageurl=PAGE, proxy=PROXY, **{name: mine}
        ).get(timeout=GET_TIMEOUT)
        assert result["user_agent"] == mine


def test_lemin_answer_is_an_object(sandbox: Any) -> None:
    result = solve.delay(
        method="lemin", sitekey="CROPPED_3dfdd5c", pageurl=PAGE, div_id="lemin-box"
    ).get(timeout=GET_TIMEOUT)
    token = result["token"]
    assert isinstance(token, dict) and set(token) == {"answer", "challenge_uuid"}
    assert sandbox.verify(token["answer"])["sitekey"] == "CROPPED_3dfdd5c"


@pytest.mark.parametrize(("grid_size", "cells"), [("3x3", 9), ("4x4", 16)])
def test_grid_answer_is_a_list_of_cells(sandbox: Any, grid_size: str, cells: int) -> None:
    result = solve.delay(
        method="grid", body=png_b64(), instructions="buses", grid_size=grid_size
    ).get(timeout=GET_TIMEOUT)
    assert isinstance(result["token"], list) and result["token"]
    assert set(result["token"]) <= set(range(1, cells + 1))
    assert sandbox.stats()["submits_by_method"]["base64"] == 1


def test_bls_answer_is_a_list_of_cells(sandbox: Any) -> None:
    images: list[Any] = [png() for _ in range(4)] + [png_b64() for _ in range(5)]
    result = solve.delay(method="bls", images=images, instructions="cars").get(timeout=GET_TIMEOUT)
    assert isinstance(result["token"], list) and result["token"]
    assert set(result["token"]) <= set(range(1, 10))
    assert sandbox.stats()["submits_by_method"]["bls"] == 1


def test_a_1000_kb_image_is_solved(sandbox: Any) -> None:
    body = png_b64(1000 * 1024)
    result = solve.delay(method="base64", body=body).get(timeout=GET_TIMEOUT)
    assert result["status"] == "solved" and isinstance(result["token"], str)


def test_structured_and_user_agent_answers_are_never_polled_in_bulk(sandbox: Any) -> None:
    pending = [
        solve.delay(method="grid", body=png_b64(), instructions="bus", grid_size="3x3")
        for _ in range(4)
    ]
    pending += [
        solve.delay(method="cloudflare_challenge", pageurl=PAGE, proxy=PROXY) for _ in range(4)
    ]
    pending += [
        solve.delay(method="lemin", sitekey="C", pageurl=PAGE, div_id="d") for _ in range(4)
    ]
    results = [p.get(timeout=GET_TIMEOUT) for p in pending]
    assert all(isinstance(r["token"], list) for r in results[:4])
    assert all(r["user_agent"] for r in results[4:8])
    stats = sandbox.stats()
    # every res.php get asked for one id
    assert stats["res_php_ids"] == stats["res_php_get_requests"] >= len(results)


def test_friendly_captcha_tokens_are_polled_in_bulk(sandbox: Any) -> None:
    sandbox.configure(solve_time=0.8, jitter=0.3)
    pending = [
        solve.delay(method="friendly_captcha", sitekey=f"k{i}", pageurl=PAGE) for i in range(12)
    ]
    results = [p.get(timeout=GET_TIMEOUT) for p in pending]
    assert all(sandbox.verify(r["token"])["success"] for r in results)
    stats = sandbox.stats()
    assert stats["res_php_ids"] > stats["res_php_get_requests"]


BAD: list[tuple[dict[str, Any], str]] = [
    ({"method": "grid", "body": png_b64(), "grid_size": "3x3"}, "instructions"),
    ({"method": "grid", "body": png_b64(), "instructions": "x", "grid_size": "2x2"}, "grid_size"),
    ({"method": "bls", "images": [png()] * 3, "instructions": "x"}, "9 images"),
    ({"method": "cloudflare_challenge", "pageurl": PAGE}, "proxy"),
    ({"method": "captchafox", "sitekey": "k", "pageurl": PAGE}, "proxy"),
    ({"method": "friendly_captcha", "sitekey": "k", "pageurl": PAGE, "version": "v5"}, "version"),
    ({"method": "lemin", "sitekey": "k", "pageurl": PAGE}, "div_id"),
    ({"method": "base64", "body": png_b64(1100 * 1024)}, f"at most {MAX_IMAGE_BYTES} bytes"),
    ({"method": "base64", "body": png_b64()[:-1]}, "base64"),
    ({"method": "base64", "body": b"BM" + bytes(4096)}, "not a jpg, jpeg, png or gif"),
]


@pytest.mark.parametrize(("kwargs", "needle"), BAD)
def test_bad_requests_are_refused_before_anything_is_queued(
    redis_conn: Any, kwargs: dict[str, Any], needle: str
) -> None:
    before = {q: redis_conn.llen(q) for q in app.runtime().settings.celery.queues}
    keys_before = stored(redis_conn)
    with pytest.raises(errors.ValidationError) as info:
        solve.delay(**kwargs)
    assert needle in str(info.value)
    assert {q: redis_conn.llen(q) for q in before} == before
    assert stored(redis_conn) == keys_before


def stored(redis_conn: Any) -> set[str]:
    """Every key, but those the module's worker writes on its own meanwhile: its
    housekeeping (checks of the providers and the master, its sweep lock) and kombu's
    bookkeeping of the messages it takes."""
    keys = app.runtime().state.keys
    own = {keys.redis_master(), keys.housekeeping_lock(), "unacked_index", "unacked"}
    return {
        k
        for k in redis_conn.scan_iter(count=1000)
        if ":providers:" not in k and not k.endswith(":threads-check") and k not in own
    }


@pytest.mark.parametrize(
    ("method", "extra", "agent"),
    [("friendly_captcha", {"version": "v2"}, False), ("userrecaptcha", {"enterprise": 1}, True)],
)
def test_pooled_tokens_keep_their_user_agent(
    sandbox: Any, method: str, extra: dict[str, Any], agent: bool
) -> None:
    name = f"pool-{method}"
    sitekey = f"pool-{method}-key"
    create_pool(name, method, sitekey, PAGE, size=2, ttl=60, min_remaining=5, **extra)
    pools = app.runtime().state.pools
    hits: list[dict[str, Any]] = []

    def pooled() -> bool:
        # The worker reads pool definitions at most once a second: until it has seen this
        # one, a solve goes to the API.
        result = solve.delay(method=method, sitekey=sitekey, pageurl=PAGE, **extra)
        hits.append(result.get(timeout=GET_TIMEOUT))
        return hits[-1]["source"] == "pool"

    try:
        prewarm.delay(name)
        wait_until(lambda: pools.live(name) >= 1, 20, what="a pooled token")
        wait_until(pooled, 20, what="a solve answered from the pool")
        for result in hits:
            assert sandbox.verify(result["token"])["success"] is True
            assert ("user_agent" in result) is agent
    finally:
        pools.unregister(name)
