"""Token pools end to end: beat pre-warms, workers refill, consumers on many threads and
processes take — each token handed out once and never expired (checked by siteverify)."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from captcha_tasks import solve
from captcha_tasks.state.pools import PoolNotFound
from captcha_tasks.testing.processes import CeleryProcess, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.tasks import take_token

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/pool"
LIFE = 4.0
POOL = {
    "name": "login",
    "method": "turnstile",
    "sitekey": "pool-key",
    "pageurl": PAGE,
    "size": 6,
    "ttl": LIFE,
    "min_remaining": 1.0,
}


@pytest.fixture
def pooled_stack(
    sandbox: Any,
    start_worker: Any,
    output_dir: Path,
    clean_state: None,
    env: dict[str, str],
) -> Iterator[dict[str, str]]:
    sandbox.configure(token_ttl={"turnstile": LIFE}, solve_time=0.3, jitter=0.1)
    pooled = {
        "CAPTCHAAI_POOLS": json.dumps([POOL]),
        "CAPTCHAAI_PREWARM_EVERY": "0.5",
        "CAPTCHAAI_TOKEN_LIFETIMES": json.dumps({"turnstile": LIFE}),
    }
    start_worker(pooled, name="pool-worker")
    beat_env = {**env, **pooled}
    beat = CeleryProcess("beat", env=beat_env, log_dir=output_dir, name="pool-beat").start()
    yield beat_env
    beat.stop()


def _take_in_process(env: dict[str, str], count: int, out: Any) -> None:
    # A process of its own (spawned): it configures itself from the module's settings.
    from captcha_tasks.settings import Settings
    from captcha_tasks.worker.app import app as child_app
    from captcha_tasks.worker.tasks import take_token as take

    child_app.use(Settings.from_env(env))

    got = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        record = take("login")
        if record is None:
            time.sleep(0.05)  # an empty pool: the take triggered a refill
            continue
        got.append((record["token"], _verify(record["token"])))
    out.put(got)


def _verify(token: str) -> bool:
    """Use the token at once, as a caller would: the sandbox's siteverify."""
    import requests

    url = app.runtime().settings.providers.base_url + "/siteverify"
    return bool(requests.post(url, data={"response": token}, timeout=5).json()["success"])


def test_prewarmed_tokens_each_handed_out_once(sandbox: Any, pooled_stack: dict[str, str]) -> None:
    pools = app.runtime().state.pools
    wait_until(lambda: pools.live("login") >= POOL["size"], 20, what="beat to fill the pool")
    hit = solve.delay(method="turnstile", sitekey="pool-key", pageurl=PAGE).get(timeout=20)
    assert hit["source"] == "pool"
    used: list[tuple[str, bool]] = [(hit["token"], _verify(hit["token"]))]
    lock = threading.Lock()

    def consume(n: int) -> None:
        for _ in range(n):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                record = take_token("login")
                if record is not None:
                    assert record["source"] == "pool" and record["method"] == "turnstile"
                    ok = _verify(record["token"])
                    with lock:
                        used.append((record["token"], ok))
                    break
                time.sleep(0.05)  # a poll of a condition with a deadline

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    env = {k: v for k, v in pooled_stack.items() if k.startswith(("CAPTCHAAI", "REDIS"))}
    procs = [ctx.Process(target=_take_in_process, args=(env, 4, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    threads = [threading.Thread(target=consume, args=(4,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in procs:
        used.extend(queue.get(timeout=30))
    for p in procs:
        p.join(10)
    tokens = [t for t, _ in used]
    assert len(tokens) == 1 + 6 * 4 + 3 * 4
    assert len(set(tokens)) == len(tokens)  # no token handed out twice
    # every token was accepted by siteverify when used: none expired, none used before
    assert [t for t, ok in used if not ok] == []
    status = pools.status("login")
    assert status["taken"] >= len(tokens)


def test_request_with_own_proxy_bypasses_the_pool(pooled_stack: dict[str, str]) -> None:
    wait_until(lambda: app.runtime().state.pools.live("login") >= 1, 20, what="a pooled token")
    result = solve.delay(
        method="turnstile", sitekey="pool-key", pageurl=PAGE, proxy="u:p@1.2.3.4:3128"
    ).get(timeout=20)
    assert result["source"] == "api"


def test_undeclared_pool_is_a_clear_error(redis_conn: Any) -> None:
    with pytest.raises(PoolNotFound, match="no-such-pool"):
        take_token("no-such-pool")
