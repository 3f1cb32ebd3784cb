"""The callback channel's figures and early callbacks, against a real Redis server: what
answers say of the callbacks is kept once for every worker and receiver, switched once,
and a callback that came before its captcha was registered waits for it, bounded."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from captcha_tasks.core.channel import DEGRADED, DOWN, UP, Channel, Heard
from captcha_tasks.state import channel as channel_module
from captcha_tasks.state.board import Board, BoardConfig, Completion
from captcha_tasks.state.channel import (
    EARLY_POLL_S,
    LATE_BUCKETS,
    CallbackChannel,
    late_bucket,
)
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.limiter import LimiterConfig, ThreadLimiter
from captcha_tasks.testing.processes import wait_until

pytestmark = pytest.mark.redis

WEIGHT = 0.1


@pytest.fixture
def channel(redis_conn: Any, keys: Keys) -> CallbackChannel:
    return CallbackChannel(Db(redis_conn, keys))


@pytest.fixture
def board(redis_conn: Any, keys: Keys) -> Board:
    config = LimiterConfig(capacity=4, reserve=0, lease_s=30.0)
    limiter = ThreadLimiter(Db(redis_conn, keys), config)
    return Board(
        limiter.db, limiter, BoardConfig(round_gap_s=0.05, round_hold_s=5.0, record_ttl_s=60)
    )


# -- the channel's figures ------------------------------------------------------------------


def test_before_any_answer_the_channel_is_up(channel: CallbackChannel) -> None:
    assert channel.read() == Channel(UP, 1.0, 0, 0, 0)


def test_answers_move_the_share_and_count_what_came_in_a_row(channel: CallbackChannel) -> None:
    after = channel.observe([Heard("poll", "1"), Heard("poll", "2")], WEIGHT)
    assert after.share == pytest.approx((1 - WEIGHT) ** 2)
    assert (after.misses, after.hits, after.since) == (2, 0, 2)
    after = channel.observe([Heard("callback", "3")], WEIGHT)
    assert after.share == pytest.approx((1 - WEIGHT) ** 2 + WEIGHT * (1 - (1 - WEIGHT) ** 2))
    assert (after.misses, after.hits, after.since) == (0, 1, 3)
    assert channel.read() == after  # shared: what another process reads


def test_a_late_callback_counts_once_and_only_for_an_answer_a_poll_found(
    channel: CallbackChannel,
) -> None:
    missed = channel.observe([Heard("poll", "70")], WEIGHT)
    late = channel.observe([Heard("late", "70")], WEIGHT)
    assert late.share == pytest.approx(min(1.0, missed.share + WEIGHT))
    assert (late.misses, late.hits) == (0, 1)
    again = channel.observe([Heard("late", "70"), Heard("late", "never-polled")], WEIGHT)
    assert again == late  # a duplicate, or a forged id, changes nothing


def test_the_state_switches_once_whoever_sees_it_first(channel: CallbackChannel) -> None:
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        results.append(channel.switch(UP, DOWN))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 1  # one warning, not eight
    assert channel.read().state == DOWN
    assert not channel.switch(UP, DEGRADED)  # it is not up any more
    channel.observe([Heard("callback", "1")], WEIGHT)
    assert channel.switch(DOWN, DEGRADED, share=0.9)
    back = channel.read()
    assert (back.state, back.share, back.since) == (DEGRADED, 0.9, 0)


def test_the_lateness_histogram_and_overdue_answers(channel: CallbackChannel) -> None:
    channel.observe(
        [
            Heard("callback", "1"),
            Heard("poll", "2", late_s=0.3),
            Heard("poll", "3", late_s=4.0, overdue=True),
            Heard("poll", "4", late_s=LATE_BUCKETS[-1] + 1, overdue=True),
        ],
        WEIGHT,
    )
    channel.observe([Heard("late", "2")], WEIGHT)  # not an answer: not in the histogram
    found = channel.lateness()
    counts = dict(found.buckets)
    assert counts[0.1] == 1 and counts[0.5] == 2 and counts[5.0] == 3
    assert counts[LATE_BUCKETS[-1]] == 3 and counts[float("inf")] == 4
    assert found.sum_s == pytest.approx(0.3 + 4.0 + LATE_BUCKETS[-1] + 1)
    assert found.overdue == 2
    assert [late_bucket(b) for b in LATE_BUCKETS] == list(range(len(LATE_BUCKETS)))


def test_captchas_a_poll_answered_are_remembered_for_a_while_only(
    channel: CallbackChannel, redis_conn: Any, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_module, "POLLED_MOST", 3)
    channel.observe([Heard("poll", str(n)) for n in range(5)], WEIGHT)
    assert sorted(redis_conn.zrange(keys.pingback_polled(), 0, -1)) == ["2", "3", "4"]


# -- early callbacks ------------------------------------------------------------------------


def job(solve_id: str, captcha_id: str) -> str:
    request = {"method": "turnstile", "sitekey": "k", "pageurl": "https://x", "params": {}}
    return json.dumps({"solve_id": solve_id, "request": request, "captcha_id": captcha_id})


def register(board: Board, solve_id: str, captcha_id: str, attempt: int = 0) -> Any:
    assert board.limiter.admit(solve_id, job(solve_id, ""), attempt=attempt, deadline_in_s=60)
    return board.register(solve_id, attempt, captcha_id, job(solve_id, captcha_id), 30)


def test_a_callback_before_its_captcha_is_registered_is_applied_at_registration(
    board: Board,
) -> None:
    assert board.keep_early("s1", 0, "7001", "0.token") == "kept"
    assert board.keep_early("s1", 0, "7001", "0.other") == "again"  # the first word stands
    registered = register(board, "s1", "7001")
    assert registered.early == "0.token"
    assert registered.round is not None  # registered as any other
    assert board.keep_early("s1", 0, "7001", "0.token") == "registered"  # on the board now


def test_an_early_callback_for_another_captcha_is_dropped_at_registration(board: Board) -> None:
    assert board.keep_early("s1", 0, "9999", "0.forged") == "kept"
    assert register(board, "s1", "7001").early is None
    assert register(board, "s2", "7002").early is None  # nothing kept for that one


def test_a_callback_for_an_attempt_already_registered_or_over_is_not_kept(board: Board) -> None:
    register(board, "s1", "7001")
    assert board.keep_early("s1", 0, "7000", "0.old") == "passed"  # another captcha of it
    assert board.keep_early("s1", 1, "7005", "0.next") == "kept"  # its next attempt: maybe
    board.finish(Completion("s1", "turnstile", "7001"))
    assert board.keep_early("s1", 2, "7009", "0.late") == "passed"  # the solve is over


def test_early_callbacks_are_bounded_in_number_and_time(
    board: Board, redis_conn: Any, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("captcha_tasks.state.board.EARLY_MOST", 2)
    assert board.keep_early("s1", 0, "1", "0.a") == "kept"
    assert board.keep_early("s2", 0, "2", "0.b") == "kept"
    assert board.keep_early("s3", 0, "3", "0.c") == "full"
    monkeypatch.setattr("captcha_tasks.state.board.EARLY_MOST", 3)
    monkeypatch.setattr("captcha_tasks.state.board.EARLY_KEEP_S", 0.005)
    assert board.keep_early("s4", 0, "4", "0.d") == "kept"
    until_ms = redis_conn.zscore(keys.pingback_early_due(), "s4.0")

    def redis_ms() -> float:
        seconds, micros = redis_conn.time()
        return seconds * 1000 + micros // 1000

    wait_until(lambda: redis_ms() > until_ms, 5, what="the Redis clock past its time")
    assert register(board, "s4", "4").early is None  # gone by the time its captcha came
    assert board.keep_early("s5", 0, "5", "0.e") == "kept"  # and no longer takes room


def test_a_captcha_whose_early_callback_was_taken_is_polled_soon_all_the_same(
    board: Board, redis_conn: Any, keys: Keys
) -> None:
    # the worker that took it may die before applying it: a poll reads the answer then
    assert board.keep_early("s1", 0, "7001", "0.token") == "kept"
    assert register(board, "s1", "7001").early == "0.token"  # first poll asked in 30 s
    register(board, "s2", "7002")  # no early callback: polled when it asked
    seconds, micros = redis_conn.time()
    now_ms = seconds * 1000 + micros // 1000
    soon = redis_conn.zscore(keys.poll_due(), "7001") - now_ms
    later = redis_conn.zscore(keys.poll_due(), "7002") - now_ms
    assert soon <= EARLY_POLL_S * 1000 < later


def test_each_provider_has_a_channel_of_its_own(
    channel: CallbackChannel, redis_conn: Any, keys: Keys
) -> None:
    backup = CallbackChannel(Db(redis_conn, keys.scoped("backup")))
    backup.observe([Heard("poll", "1")] * 8, WEIGHT)
    assert backup.switch(UP, DOWN)
    assert (backup.read().state, backup.read().misses) == (DOWN, 8)
    assert channel.read() == Channel()  # the primary's callbacks are not the backup's
