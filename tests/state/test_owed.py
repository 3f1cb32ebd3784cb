"""What the deployment is owed (``captcha_tasks.state.owed``), against a real Redis server:
one sweep finds the lost messages of every provider, the primary's and the others' alike,
and a message that started is owed no more."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from captcha_tasks.state.board import Board, BoardConfig, Completion
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.limiter import LimiterConfig, ThreadLimiter
from captcha_tasks.state.owed import OwedConfig, OwedMessages

pytestmark = pytest.mark.redis

QUEUE = "t-owed-solve-queue"


def provider(redis_conn: Any, keys: Keys, name: str | None) -> tuple[ThreadLimiter, Board]:
    """One provider's limiter and board (None: the primary, whose keys are unscoped).  A
    submit it hands out is owed its message for 5 s (``dispatch_grace_s``), as the sweep's."""
    db = replace(Db(redis_conn, keys), keys=keys.scoped(name))
    config = LimiterConfig(capacity=1, reserve=0, lease_s=30.0, dispatch_grace_s=5)
    limiter = ThreadLimiter(db, config, name or "main")
    return limiter, Board(
        db, limiter, BoardConfig(round_gap_s=0.1, round_hold_s=5, record_ttl_s=60)
    )


def job_of(solve_id: str, provider: str) -> str:
    return json.dumps({"solve_id": solve_id, "provider": provider, "attempt": 0})


def sweep(owed: OwedMessages, redis_conn: Any) -> Any:
    redis_conn.delete(owed.keys.housekeeping_lock())
    swept = owed.sweep(tick_s=5, solve_queues=[QUEUE])
    assert swept is not None
    return swept


def test_one_sweep_sends_again_what_any_provider_handed_out(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    owed = OwedMessages(Db(redis_conn, keys), OwedConfig(dispatch_grace_s=5))
    handed: dict[str, str] = {}
    for name in (None, "backup"):
        limiter, board = provider(redis_conn, keys, name)
        label = name or "main"
        first, parked = f"{label}-first", f"{label}-parked"
        assert (
            limiter.admit(first, job_of(first, label), attempt=0, deadline_in_s=60).status == "go"
        )
        admitted = limiter.admit(parked, job_of(parked, label), attempt=0, deadline_in_s=60)
        assert admitted.status == "parked"
        done = board.finish(Completion(solve_id=first, method="turnstile"))
        # ... and the worker dies before it publishes the parked submit's message
        assert [p.lease_id for p in done.handout.given] == [parked]
        handed[parked] = label
    assert sweep(owed, redis_conn).lost == []  # not overdue yet
    move_clock(5.1)  # the grace period
    lost = sweep(owed, redis_conn).lost
    assert {p.lease_id: json.loads(p.job)["provider"] for p in lost} == handed

    # the backup's message starts at last: it is owed no more, the primary's still is
    backup, _ = provider(redis_conn, keys, "backup")
    job = job_of("backup-parked", "backup")
    assert backup.admit("backup-parked", job, attempt=0, deadline_in_s=60).status == "go"
    move_clock(5.1)  # another grace period
    assert [p.lease_id for p in sweep(owed, redis_conn).lost] == ["main-parked"]


def test_a_solve_message_on_its_way_is_owed_until_it_starts(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    owed = OwedMessages(Db(redis_conn, keys), OwedConfig(message_grace_s=5))
    owed.expect("s1", json.dumps({"method": "turnstile"}))
    owed.expect("s2", json.dumps({"method": "turnstile"}))
    backup, _ = provider(redis_conn, keys, "backup")
    assert backup.admit("s2", job_of("s2", "backup"), attempt=0, deadline_in_s=60).status == "go"
    assert sweep(owed, redis_conn).unstarted == []  # not overdue yet
    move_clock(5.1)  # the grace period
    assert [p.lease_id for p in sweep(owed, redis_conn).unstarted] == ["s1"]
