"""A batch sends again what a lost write took with it (docs/operations/failover.md), through
each real driver, ``stream()`` and ``aio.stream``: a real Redis, a real worker, the sandbox.

A master change (a Sentinel switch, a kill; a restart that lost writes) can take a batch's
solve messages with it before any worker took them, and with them every trace Redis kept.
Here that loss is made by hand, as such a master would leave it: no worker consumes the
module's queues until the batch's messages, and everything Redis noted of them, are gone.
Only the batch still knows them.  A real master change is tests/ha/test_failover_batch.py's;
what the batch decides when (the looks, the re-sends, the re-read after a move) is
tests/core/test_batching.py's, with an injected clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from captcha_tasks import aio
from captcha_tasks.batch import stream
from captcha_tasks.core.batching import TRACE_EVERY_S
from captcha_tasks.testing.processes import queue_names, wait_until

pytestmark = pytest.mark.e2e

PAGE = "https://example.com/recovery"
COUNT = 4


def tasks() -> list[dict[str, Any]]:
    return [{"method": "turnstile", "sitekey": f"k{i}", "pageurl": PAGE} for i in range(COUNT)]


def run_sync(options: dict[str, Any]) -> list[dict[str, Any]]:
    return list(stream(tasks(), **options))


def run_aio(options: dict[str, Any]) -> list[dict[str, Any]]:
    async def consume() -> list[dict[str, Any]]:
        async with contextlib.aclosing(aio.stream(tasks(), **options)) as results:
            return [result async for result in results]

    return asyncio.run(consume())


DRIVERS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "sync": run_sync,
    "aio": run_aio,
}


@pytest.mark.parametrize("mode", sorted(DRIVERS))
def test_messages_lost_with_every_trace_are_sent_again_under_their_ids(
    mode: str,
    start_worker: Callable[..., Any],
    clean_state: None,
    sandbox: Any,
    state: Any,
    env: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "captcha_tasks.core.batching")
    outcomes: list[dict[str, Any]] = []
    raised: list[BaseException] = []

    def caller() -> None:
        try:
            outcomes.extend(DRIVERS[mode]({"timeout_per_task": 60}))
        except BaseException as exc:  # the test thread says it
            raised.append(exc)

    thread = threading.Thread(target=caller, name=f"batch-{mode}", daemon=True)
    thread.start()
    r, keys = state.redis, state.keys

    def queued() -> int:
        return sum(r.llen(q) for q in queue_names(env))

    # Redis takes note of a message before the broker queues it: wait for both, or the
    # last message could be queued after the "loss" below, and never be lost at all.
    wait_until(
        lambda: r.zcard(keys.requested()) == COUNT and queued() == COUNT,
        15,
        what="every message noted and queued",
    )
    sent = sorted(r.zrange(keys.requested(), 0, -1))
    # The master that took them is gone: so are the messages and every note of them.
    r.delete(*queue_names(env), keys.requested(), keys.requested_messages())
    assert queued() == 0
    assert sorted(state.records.traceless(sent)) == sent  # nothing left to go by
    start_worker()

    thread.join(TRACE_EVERY_S + 45)
    assert not thread.is_alive(), "the batch did not end"
    assert not raised, raised
    assert sorted(o["index"] for o in outcomes) == list(range(COUNT))
    assert [o["status"] for o in outcomes] == ["solved"] * COUNT, outcomes
    tokens = [o["token"] for o in outcomes]
    assert len(set(tokens)) == COUNT
    assert sandbox.stats()["submits"] == COUNT  # each paid once: sent again, not twice
    resent = [rec.getMessage() for rec in caplog.records if "lost every trace" in rec.getMessage()]
    assert sorted(line.rsplit("(", 1)[1].split(")")[0] for line in resent) == sent, resent
