"""The board's scripts against a real Redis server: the poll schedule, poll rounds, and the
one completion of every solve."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from captcha_tasks.core.rounds import Again
from captcha_tasks.errors import StoreUnavailable
from captcha_tasks.state.board import Board, BoardConfig, Completion
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.limiter import LimiterConfig, ThreadLimiter
from captcha_tasks.testing.processes import wait_until

pytestmark = pytest.mark.redis


@pytest.fixture
def limiter(redis_conn: Any, keys: Keys) -> ThreadLimiter:
    config = LimiterConfig(capacity=2, reserve=0, lease_s=30.0, dispatch_grace_s=0.2)
    return ThreadLimiter(Db(redis_conn, keys), config)


@pytest.fixture
def board(limiter: ThreadLimiter) -> Board:
    config = BoardConfig(round_gap_s=0.05, round_hold_s=5.0, record_ttl_s=60)
    return Board(limiter.db, limiter, config)


def job(solve_id: str, captcha_id: str | None = None, **extra: Any) -> str:
    request = {"method": "turnstile", "sitekey": "k", "pageurl": "https://x", "params": {}}
    found = {"solve_id": solve_id, "request": request, "attempt": 0, "started": 0.0, **extra}
    if captcha_id is not None:
        found["captcha_id"] = captcha_id
    return json.dumps(found)


def admit(limiter: ThreadLimiter, solve_id: str, attempt: int = 0) -> str:
    return limiter.admit(solve_id, job(solve_id), attempt=attempt, deadline_in_s=60).status


def register(board: Board, solve_id: str, captcha_id: str, first_poll_in_s: float) -> Any:
    return board.register(solve_id, 0, captcha_id, job(solve_id, captcha_id), first_poll_in_s).round


def on_board(board: Board, limiter: ThreadLimiter, solve_id: str, captcha_id: str) -> None:
    assert admit(limiter, solve_id) == "go"
    register(board, solve_id, captcha_id, 0)


def finish(board: Board, solve_id: str, captcha_id: str | None = None, **extra: Any) -> Any:
    return board.finish(Completion(solve_id, "turnstile", captcha_id, **extra))


# -- the poll schedule ----------------------------------------------------------------------


def test_registering_schedules_a_round_only_when_none_is_due_in_time(
    board: Board, limiter: ThreadLimiter
) -> None:
    admit(limiter, "s1")
    first = register(board, "s1", "c1", 10)
    assert first is not None and 9.9 <= first.countdown_s <= 10
    admit(limiter, "s2")
    assert register(board, "s2", "c2", 10.02) is None  # the pending round serves it
    admit(limiter, "s3")
    sooner = register(board, "s3", "c3", 1)
    assert sooner is not None and sooner.countdown_s <= 1 and sooner.at_ms < first.at_ms


def test_a_round_takes_what_is_due_once(board: Board, limiter: ThreadLimiter) -> None:
    on_board(board, limiter, "s1", "c1")
    admit(limiter, "s2")
    register(board, "s2", "c2", 30)  # not due yet
    taken = board.take_due(None, most=10)
    assert [e.captcha_id for e in taken] == ["c1"]
    assert json.loads(taken[0].job)["solve_id"] == "s1" and taken[0].polled_at is None
    assert board.take_due(None, most=10) == []  # a concurrent round does not get it too


def test_a_round_takes_what_is_due_within_its_look_ahead(limiter: ThreadLimiter) -> None:
    config = BoardConfig(round_gap_s=0.05, round_hold_s=5.0, record_ttl_s=60, round_ahead_s=2)
    board = Board(limiter.db, limiter, config)
    on_board(board, limiter, "s1", "c1")
    admit(limiter, "s2")
    register(board, "s2", "c2", 1)  # due within the look-ahead: asked about a little early
    admit(limiter, "s3")
    register(board, "s3", "c3", 30)  # not
    assert sorted(e.captcha_id for e in board.take_due(None, most=10)) == ["c1", "c2"]


def test_a_round_puts_back_what_is_not_ready(
    board: Board, limiter: ThreadLimiter, redis_conn: Any, keys: Keys
) -> None:
    admit(limiter, "s1")
    first = register(board, "s1", "c1", 0)
    assert first is not None
    board.take_due(first.at_ms, most=10)  # the pending round runs: none is pending now
    nxt = board.end_round(1234.5, [Again("c1", "s1", 0.0, errors=2)], gap_s=0.0)
    assert nxt is not None  # c1 is due again: a round must come
    (again,) = board.take_due(nxt.at_ms, most=10)
    assert (again.polled_at, again.errors, again.polls) == (1234.5, 2, 0)
    assert not redis_conn.exists(keys.poll_round())  # that round was the pending one


def test_a_round_keeps_each_captchas_polls_and_last_poll_for_the_next(
    redis_conn: Any, keys: Keys
) -> None:
    """Whichever host polls a captcha next reads how often and when it was polled (a JSON
    provider's per-task budget counts both)."""
    config = LimiterConfig(capacity=3, reserve=0, lease_s=30.0, dispatch_grace_s=0.2)
    limiter = ThreadLimiter(Db(redis_conn, keys), config)
    board = Board(
        limiter.db, limiter, BoardConfig(round_gap_s=0.05, round_hold_s=5.0, record_ttl_s=60)
    )
    for n in (1, 2, 3):
        on_board(board, limiter, f"s{n}", f"c{n}")
    assert len(board.take_due(None, most=10)) == 3
    put_back = [
        Again("c1", "s1", 0.0, polls=3, asked=True, polled_at=1500.25),  # its reply time
        Again("c2", "s2", 0.0, polls=3, asked=True),  # the round's ask time
        Again("c3", "s3", 0.0, polls=0, asked=False),  # held back, never polled
    ]
    board.end_round(1400.0, put_back, gap_s=0.0)
    taken = {e.captcha_id: e for e in board.take_due(None, most=10)}
    assert {cid: (e.polls, e.polled_at) for cid, e in taken.items()} == {
        "c1": (3, 1500.25),
        "c2": (3, 1400.0),
        "c3": (0, None),
    }


def test_a_finished_captcha_is_never_put_back(board: Board, limiter: ThreadLimiter) -> None:
    on_board(board, limiter, "s1", "c1")
    board.take_due(None, most=10)
    assert finish(board, "s1", "c1").claimed
    assert board.end_round(0.0, [Again("c1", "s1", 0.0)], gap_s=0.0) is None
    assert board.in_flight_count() == 0


def test_a_round_lost_with_its_worker_is_scheduled_again(
    board: Board, limiter: ThreadLimiter, redis_conn: Any, keys: Keys
) -> None:
    on_board(board, limiter, "s1", "c1")
    redis_conn.delete(keys.poll_round())  # the round message died with its worker
    due = board.ensure_round()
    assert due is not None
    assert board.ensure_round() is None  # one pending round at a time


# -- the one completion ---------------------------------------------------------------------


def test_finish_claims_a_solve_exactly_once_under_contention(
    board: Board, limiter: ThreadLimiter
) -> None:
    on_board(board, limiter, "s1", "c1")
    claims: list[bool] = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        claims.append(finish(board, "s1", "c1").claimed)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claims) == [False] * 7 + [True]


def test_finish_frees_the_thread_stores_and_emits_the_outcome(
    board: Board, limiter: ThreadLimiter, redis_conn: Any, keys: Keys
) -> None:
    on_board(board, limiter, "s1", "c1")
    on_board(board, limiter, "s2", "c2")
    assert admit(limiter, "s3") == "parked"
    pubsub = redis_conn.pubsub()
    pubsub.subscribe("result-of-s1")
    wait_until(lambda: pubsub.get_message(timeout=0.1), 2, what="the subscription")
    done = finish(
        board,
        "s1",
        "c1",
        result_key="result-of-s1",
        result_value='{"status": "SUCCESS"}',
        batch_id="b1",
        batch_entry='{"index": 4}',
        solve_time_s=12.5,
        source="api",
    )
    assert done.claimed
    assert [p.lease_id for p in done.handout.given] == ["s3"]  # the freed thread, at once
    assert redis_conn.zrange(keys.slots(), 0, -1) == sorted(["s2", "s3"])
    assert redis_conn.get("result-of-s1") == '{"status": "SUCCESS"}'
    message = wait_until(lambda: pubsub.get_message(timeout=0.1), 2, what="the publish")
    assert message["data"] == '{"status": "SUCCESS"}'  # type: ignore[index]
    entries = redis_conn.xrange(keys.batch_results("b1"))
    assert [json.loads(fields["outcome"]) for _, fields in entries] == [{"index": 4}]
    assert redis_conn.lrange(keys.solve_times("turnstile"), 0, -1) == ["12.500"]
    assert redis_conn.hget(keys.solved_counter("turnstile"), "api") == "1"
    assert redis_conn.hget(keys.submission("s1"), "done") == "1"
    pubsub.close()


def test_finish_without_a_captcha_claims_by_the_solve(board: Board) -> None:
    # a pool hit, or a failure before anything was submitted
    assert finish(board, "s9", source="pool", solve_time_s=None).claimed
    assert not finish(board, "s9").claimed


def test_a_cancelled_batch_gets_no_more_entries(
    board: Board, limiter: ThreadLimiter, redis_conn: Any, keys: Keys
) -> None:
    on_board(board, limiter, "s1", "c1")
    redis_conn.set(keys.batch_cancelled("b1"), "1")
    assert finish(board, "s1", "c1", batch_id="b1", batch_entry="{}").claimed
    assert not redis_conn.exists(keys.batch_results("b1"))
    assert limiter.in_use() == 0  # its thread is still given back


def test_a_retired_captcha_keeps_its_thread_and_is_owed_a_submit(
    board: Board, limiter: ThreadLimiter, redis_conn: Any, keys: Keys
) -> None:
    on_board(board, limiter, "s1", "c1")
    nxt = job("s1", attempt=1)
    assert board.retire("c1", "s1", nxt, 60, "ERROR_CAPTCHA_UNSOLVABLE")
    assert not board.retire("c1", "s1", nxt, 60, "ERROR_CAPTCHA_UNSOLVABLE")  # once
    assert board.in_flight_count() == 0
    assert limiter.in_use() == 1
    assert redis_conn.zrange(keys.dispatch(), 0, -1) == ["s1"]
    assert redis_conn.hget(keys.api_errors(), "ERROR_CAPTCHA_UNSOLVABLE") == "1"
    # its submit message starts: the next attempt goes, and nothing is owed any more
    assert limiter.admit("s1", nxt, attempt=1, deadline_in_s=60).status == "go"
    assert redis_conn.zcard(keys.dispatch()) == 0
    # a late answer for the retired captcha changes nothing
    assert not finish(board, "s1", "c1").claimed


# -- a registration no replica acknowledged ------------------------------------------------


class NoReplicaAnswers:
    """A fence that says a replica could take over (behind Sentinel, before a switch).  On
    this lone Redis server, ``WAIT 1`` is answered by no replica: the real reply a worker
    gets when its master was just demoted and its write will be lost."""

    @staticmethod
    def needed() -> bool:
        return True

    @staticmethod
    def wait_command() -> tuple[str, int, int]:
        return ("WAIT", 1, 50)


def test_a_registration_made_again_changes_nothing(
    board: Board, limiter: ThreadLimiter, redis_conn: Any
) -> None:
    admit(limiter, "s1")
    assert register(board, "s1", "c1", 10) is not None
    due_key = board.keys.poll_due()
    first = redis_conn.zrange(due_key, 0, -1, withscores=True)
    assert register(board, "s1", "c1", 0) is None  # no round: nothing registered again
    assert redis_conn.zrange(due_key, 0, -1, withscores=True) == first  # its poll not moved


def test_a_registration_no_replica_holds_is_refused_and_made_again_once(
    board: Board, limiter: ThreadLimiter, redis_conn: Any
) -> None:
    admit(limiter, "s1")
    fenced = Board(Db(redis_conn, limiter.db.keys, NoReplicaAnswers()), limiter, board.config)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable, match="captcha c1 has not reached a replica"):
        fenced.register("s1", 0, "c1", job("s1", "c1"), 10)
    due_key = board.keys.poll_due()
    first = redis_conn.zrange(due_key, 0, -1, withscores=True)
    assert [cid for cid, _ in first] == ["c1"]  # it landed here: a lost master would lose it
    # made again once a replica acknowledges: the one that landed stays as it was
    assert register(board, "s1", "c1", 0) is None
    assert redis_conn.zrange(due_key, 0, -1, withscores=True) == first
