"""The thread limiter's Lua scripts against a real Redis server, through the paths the
pipeline takes: a submit is admitted (``admit``), a solve ends through the board's
completion (``finish``: its slot goes to the next parked submit), polls renew leases
(``end_round``), and housekeeping sweeps."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from captcha_tasks.core.admission import Handout, Parked
from captcha_tasks.core.rounds import Again
from captcha_tasks.errors import StoreUnavailable
from captcha_tasks.state.board import Board, BoardConfig, Completion
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.limiter import LimiterConfig, ThreadLimiter, _Ask
from captcha_tasks.state.owed import OwedConfig, OwedMessages
from captcha_tasks.testing.processes import free_port, wait_until

pytestmark = pytest.mark.redis

#: The solve and submit queues a sweep looks at (empty unless a test fills them).
QUEUE = "t-limiter-solve-queue"
SUBMIT_QUEUE = "t-limiter-submit-queue"


def make(redis_conn: Any, keys: Keys, **overrides: Any) -> ThreadLimiter:
    config = {"capacity": 3, "reserve": 1, "lease_s": 30.0, **overrides}
    return ThreadLimiter(Db(redis_conn, keys), LimiterConfig(**config))


def board_of(lim: ThreadLimiter) -> Board:
    return Board(lim.db, lim, BoardConfig(round_gap_s=0.1, round_hold_s=5, record_ttl_s=60))


def server_ms(conn: Any) -> int:
    sec, usec = conn.time()
    return int(sec) * 1000 + int(usec) // 1000


def job_of(solve_id: str, n: int) -> str:
    return json.dumps({"solve_id": solve_id, "request": {"n": n}, "attempt": 0})


def admit(lim: ThreadLimiter, solve_id: str, n: int = 0, **kwargs: Any) -> str:
    """Admit a submit of ``solve_id`` (its first attempt): the admission's status."""
    kwargs.setdefault("deadline_in_s", 60)
    return lim.admit(solve_id, job_of(solve_id, n), attempt=0, **kwargs).status


def finish(lim: ThreadLimiter, solve_id: str) -> Handout:
    """End ``solve_id`` as the pipeline does (the completion frees its slot)."""
    done = board_of(lim).finish(Completion(solve_id=solve_id, method="turnstile"))
    assert done.claimed
    return done.handout


def test_capacity_never_exceeded_under_contention(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=5)
    granted: list[str] = []
    lock = threading.Lock()

    def grab(i: int) -> None:
        if admit(lim, f"c{i}", i) == "go":
            with lock:
                granted.append(f"c{i}")

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == lim.config.capacity
    assert lim.in_use() == lim.config.capacity
    assert lim.parked_count() == 40 - lim.config.capacity


def test_a_finished_solve_hands_its_slot_to_the_oldest_parked(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a") == "go"
    for i in (1, 2, 3):
        assert admit(lim, f"p{i}", i) == "parked"
    order = []
    holder = "a"
    for _ in range(3):
        handout = finish(lim, holder)
        assert len(handout.given) == 1
        holder = handout.given[0].lease_id
        order.append(holder)
        assert lim.in_use() == 1
    assert order == ["p1", "p2", "p3"]
    assert handout.given[0].job == job_of("p3", 3)


def test_newcomer_does_not_jump_the_queue(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=0.3)
    assert admit(lim, "a") == "go"
    assert admit(lim, "p1", 1) == "parked"
    # a slot frees by lease loss, not release: the parked one still goes first
    wait_until(lambda: lim.in_use() == 0, 3, what="the lease to expire")
    late = lim.admit("late", job_of("late", 2), attempt=0, deadline_in_s=60)
    assert late.status == "parked"
    assert [p.lease_id for p in late.handout.given] == ["p1"]


def test_a_redelivered_message_keeps_its_slot(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a", message_id="m1") == "go"
    # its worker died in in.php; the broker delivers the same message again
    assert admit(lim, "a", message_id="m1", redelivered=True) == "go"
    assert lim.in_use() == 1


def test_refills_leave_the_reserve_to_on_demand(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=3, reserve=1)
    assert admit(lim, "r1", 1, lane="background") == "go"
    assert admit(lim, "r2", 2, lane="background") == "go"
    assert admit(lim, "r3", 3, lane="background") == "parked"
    assert lim.free_for_refills() == 0
    # the reserved slot still serves an on-demand solve, ahead of the parked refill
    assert admit(lim, "d1", 4) == "go"
    assert admit(lim, "d2", 5) == "parked"
    handout = finish(lim, "r1")
    assert [p.lease_id for p in handout.given] == ["d2"]


def test_lease_nobody_renews_expires(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=0.3)
    assert admit(lim, "dead-worker") == "go"
    assert admit(lim, "waiting", 1) == "parked"
    wait_until(lambda: lim.in_use() == 0, 3, what="the lease to expire")
    handout = sweep_now(lim, redis_conn).handout
    assert [p.lease_id for p in handout.given] == ["waiting"]


def test_a_poll_renews_the_lease_of_its_solve(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=30)
    board = board_of(lim)
    assert admit(lim, "a") == "go"
    board.register("a", 0, "c1", job_of("a", 0), first_poll_in_s=0.0)
    registered = redis_conn.zscore(keys.slots(), "a")
    move_clock(20)
    polled = server_ms(redis_conn) + 20_000  # the scripts' clock
    board.end_round(polled / 1000, [Again("c1", "a", 1.0)], gap_s=0.1)
    # the lease now runs a whole lease from the poll, well past where it stood
    renewed = redis_conn.zscore(keys.slots(), "a")
    assert renewed >= polled + 30_000 > registered + 15_000
    move_clock(15)  # past the expiry it had before the poll
    assert lim.in_use() == 1  # and it is alive


def test_a_late_poll_never_brings_back_a_released_lease(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    board = board_of(lim)
    assert admit(lim, "a") == "go"
    board.register("a", 0, "c1", job_of("a", 0), first_poll_in_s=0.0)
    finish(lim, "a")
    board.end_round(server_ms(redis_conn) / 1000, [Again("c1", "a", 1.0)], gap_s=0.1)
    assert lim.in_use() == 0
    assert redis_conn.zscore(keys.slots(), "a") is None


def test_parked_past_deadline_is_handed_on_without_a_slot(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a") == "go"
    assert admit(lim, "late", 1, deadline_in_s=0.05) == "parked"
    assert admit(lim, "fine", 2) == "parked"
    start = server_ms(redis_conn)
    wait_until(lambda: server_ms(redis_conn) > start + 60, 2, what="the server clock")
    handout = finish(lim, "a")
    assert [p.lease_id for p in handout.expired] == ["late"]
    assert [p.lease_id for p in handout.given] == ["fine"]
    assert redis_conn.zrange(keys.slots(), 0, -1) == ["fine"]
    # both are owed a submit message (the expired one's submit fails it)
    assert sorted(redis_conn.zrange(keys.dispatch(), 0, -1)) == ["fine", "late"]


def test_submit_rate_window(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=10, in_per_window=5, in_window_s=3.0)
    statuses = [
        lim.admit(f"s{i}", job_of(f"s{i}", i), attempt=0, deadline_in_s=60) for i in range(6)
    ]
    assert [a.status for a in statuses[:5]] == ["go"] * 5
    assert statuses[5].status == "deferred" and 0 < statuses[5].wait_s <= 3.0
    assert statuses[5].budget == "submit_rate" and statuses[5].warn
    assert lim.budget_waits() == {"submit_rate": 1}


def test_a_deferred_submit_is_handed_out_when_the_budget_lets_it_go(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    lim = make(redis_conn, keys, capacity=10, in_per_window=2, in_window_s=5)
    statuses = [admit(lim, f"s{i}", i) for i in range(5)]
    assert statuses == ["go", "go", "deferred", "deferred", "deferred"]
    assert lim.deferred_count() == 3 and lim.in_use() == 2  # they wait without a thread
    # nothing is handed out before the window frees; then as many as it lets go
    assert sweep_now(lim, redis_conn).handout.given == []
    move_clock(10.1)  # two windows
    given = sweep_now(lim, redis_conn).handout.given
    assert [p.lease_id for p in given] == ["s2", "s3"]
    assert given[0].job == job_of("s2", 2)
    # their requests were counted at the handout: their messages go without waiting again
    assert [admit(lim, p.lease_id) for p in given] == ["go", "go"]
    assert admit(lim, "s9") == "deferred"  # while a newcomer waits its turn


def test_poll_budget_grows_with_captchas(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, res_per_captcha=2, res_base=3)
    assert [lim.poll_wait() for _ in range(3)] == [0.0] * 3
    assert lim.poll_wait() > 0
    assert admit(lim, "s1") == "go"  # one captcha submitted buys two more polls
    assert [lim.poll_wait() for _ in range(2)] == [0.0] * 2
    assert lim.poll_wait() > 0


def test_redis_down_fails_closed_with_clear_error(keys: Keys) -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    lim = ThreadLimiter(Db(dead, keys), LimiterConfig(capacity=1, reserve=0, lease_s=10))
    with pytest.raises(StoreUnavailable, match="Redis is down"):
        admit(lim, "a")
    with pytest.raises(StoreUnavailable, match="Redis is down"):
        lim.poll_wait()


# -- admission of a submit message -----------------------------------------------------


def test_admission_claims_the_submit_once(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    assert admit(lim, "s1", 1) == "go"
    assert redis_conn.exists(keys.submit_claim("s1"))
    assert admit(lim, "s1", 1) == "busy"  # a copy of the message while the first submits
    # the in.php call failed and the submit goes again: its claim is given up
    lim.owe("s1", job_of("s1", 1), deadline_in_s=60, countdown_s=0, unclaim=True)
    assert admit(lim, "s1", 1) == "go"
    # once this attempt's captcha is registered, copies of its message are duplicates
    board_of(lim).register("s1", 0, "7", job_of("s1", 1), first_poll_in_s=5)
    assert admit(lim, "s1", 1) == "done"
    nxt = lim.admit("s1", job_of("s1", 1), attempt=1, deadline_in_s=60)
    assert nxt.status == "go"  # the next attempt goes
    assert lim.in_use() == 1


def test_the_claims_own_message_redelivered_after_a_crash_goes_on(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    assert admit(lim, "s1", message_id="m1") == "go"
    # ... its worker dies in in.php; the broker delivers the same message again
    assert admit(lim, "s1", message_id="m1") == "busy"  # a copy
    assert admit(lim, "s1", message_id="m2", redelivered=True) == "busy"
    assert admit(lim, "s1", message_id="m1", redelivered=True) == "go"
    assert lim.in_use() == 1


def admission_steps(lim: ThreadLimiter, solve_id: str, message_id: str) -> list[Any]:
    """The three calls of one admission (gate, slot, charge), to run one at a time."""
    ask = _Ask(solve_id, job_of(solve_id, 0), 0, 60.0, "interactive", "default", None, None)
    return lim._admit_calls(ask, message_id, False, None, None)


def run_step(lim: ThreadLimiter, call: Any) -> Any:
    chain = lim.db.chain()
    chain.add(lambda replies: replies[0], call)
    return lim.db.run_chain(chain)[0][0]


def test_two_copies_admitted_at_the_same_time_let_one_go(redis_conn: Any, keys: Keys) -> None:
    """The steps of two admissions of one submit interleave (they are not one atomic
    script): each step acts only on the mark the step before it left for its own
    admission, so one copy goes, and the other is told to look again."""
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    first = admission_steps(lim, "s1", "m1")
    second = admission_steps(lim, "s1", "m1")  # the same message, delivered twice
    assert run_step(lim, first[0])[0] == "open"
    assert run_step(lim, first[1])[0] == "took"
    assert run_step(lim, second[0])[0] == "open"  # no claim yet: its gate lets it by
    assert run_step(lim, first[2])[0] == "skip"  # the second took over the mark
    assert run_step(lim, second[1])[0] == "held"  # ... and the slot the first took
    assert run_step(lim, second[2])[0] == "go"
    assert lim.in_use() == 1
    assert redis_conn.get(keys.submit_claim("s1")) == "m1"
    assert admit(lim, "s1", message_id="m2") == "busy"


def test_a_submit_handed_a_slot_between_the_steps_goes_on_by_its_new_message(
    redis_conn: Any, keys: Keys
) -> None:
    """Parked by the slot step, handed a freed slot before the charge step: the charge goes
    by what the slot step did (parked), and the message of the handout claims the slot."""
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a") == "go"
    gate, slot, charge = admission_steps(lim, "b", "m1")
    run_step(lim, gate)
    assert run_step(lim, slot)[0] == "parked"
    assert [p.lease_id for p in finish(lim, "a").given] == ["b"]  # between the steps
    assert run_step(lim, charge)[0] == "parked"
    assert not redis_conn.exists(keys.submit_claim("b"))  # nothing claimed, nothing counted
    assert admit(lim, "b", message_id="m2") == "go"


def test_an_admission_cut_short_leaves_nothing_that_only_it_knew(
    redis_conn: Any, keys: Keys
) -> None:
    """A process dies after the gate, or after the slot step (the rest of its chain never
    ran): the message, never acknowledged, comes again and goes on."""
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    gate, _, _ = admission_steps(lim, "s1", "m1")
    assert run_step(lim, gate)[0] == "open"  # ... and the process dies
    assert admit(lim, "s1", message_id="m1", redelivered=True) == "go"
    lim.release("s1")
    gate, slot, _ = admission_steps(lim, "s2", "m2")
    run_step(lim, gate)
    assert run_step(lim, slot)[0] == "took"  # it holds the slot, nobody has the claim
    assert admit(lim, "s3") == "parked"  # the held slot is not lost ...
    assert admit(lim, "s2", message_id="m2", redelivered=True) == "go"  # ... it goes on


def test_a_finished_solve_is_never_admitted_again(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    finish(lim, "s1")
    assert admit(lim, "s1", 1) == "done"
    assert lim.in_use() == 0


def test_admission_waits_for_the_in_php_budget_without_a_slot(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, in_per_window=1, in_window_s=3.0)
    assert admit(lim, "s1", 1) == "go"  # the window's one request
    assert admit(lim, "p", 2) == "parked"
    assert [g.lease_id for g in finish(lim, "s1").given] == ["p"]  # p holds the thread now
    assert admit(lim, "x", 3) == "parked"
    waited = lim.admit("p", job_of("p", 2), attempt=0, deadline_in_s=60)
    assert waited.status == "deferred" and 0 < waited.wait_s <= 3.0
    # it waits for the budget without a thread: the parked one gets it
    assert [g.lease_id for g in waited.handout.given] == ["x"]
    assert lim.in_use() == 1 and lim.deferred_count() == 1
    assert not redis_conn.exists(keys.submit_claim("p"))


def test_a_cancelled_batch_gives_its_slot_back(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "s1", 1, batch_id="b1") == "go"
    lim.owe("s1", job_of("s1", 1), deadline_in_s=60, countdown_s=0, unclaim=True)
    assert admit(lim, "s2", 2) == "parked"
    redis_conn.set(keys.batch_cancelled("b1"), "1")
    cancelled = lim.admit("s1", job_of("s1", 1), attempt=0, deadline_in_s=60, batch_id="b1")
    assert cancelled.status == "cancelled"
    # the slot it gave back went to the parked submit at once
    assert [p.lease_id for p in cancelled.handout.given] == ["s2"]
    assert redis_conn.zrange(keys.slots(), 0, -1) == ["s2"]


def test_a_parked_submit_is_parked_once(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "s1", 1) == "go"
    assert admit(lim, "s2", 2) == "parked"
    assert admit(lim, "s2", 2) == "parked"  # a redelivered copy
    assert lim.parked_count() == 1


def owed_of(lim: ThreadLimiter, message_grace_s: float = 70.0) -> OwedMessages:
    """What the deployment of ``lim`` is owed (the graces as the limiter's)."""
    config = OwedConfig(lim.config.dispatch_grace_s, message_grace_s)
    return OwedMessages(lim.db, config)


@dataclass(frozen=True)
class Housekept:
    """What one housekeeping tick did at the limiter's provider, as the worker's does."""

    handout: Handout
    repaired: bool
    lost: list[Parked]
    unstarted: list[Parked]


def sweep_now(lim: ThreadLimiter, redis_conn: Any, owed: OwedMessages | None = None) -> Housekept:
    """One sweep, whoever swept last (the lock only spaces sweeps of many workers), and the
    provider's housekeeping it wins."""
    redis_conn.delete(lim.keys.housekeeping_lock())
    swept = (owed or owed_of(lim)).sweep(tick_s=5, solve_queues=[QUEUE], submit_queue=SUBMIT_QUEUE)
    assert swept is not None
    ticked = lim.tick()
    return Housekept(ticked.handout, ticked.repaired, swept.lost, swept.unstarted)


def test_a_handed_out_submit_whose_message_is_lost_is_handed_out_again(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, dispatch_grace_s=5)
    assert admit(lim, "a") == "go"
    assert admit(lim, "p1", 1) == "parked"
    handout = finish(lim, "a")  # ... and the worker dies before it publishes p1's submit
    assert [p.lease_id for p in handout.given] == ["p1"]
    assert sweep_now(lim, redis_conn).lost == []  # not overdue yet
    move_clock(5.1)  # the grace period
    lost = sweep_now(lim, redis_conn).lost
    assert [p.lease_id for p in lost] == ["p1"]
    assert lost[0].job == job_of("p1", 1)
    assert sweep_now(lim, redis_conn).lost == []  # handed out again once per grace period
    # once its message starts, it is not owed any more
    assert admit(lim, "p1", 1) == "go"
    assert redis_conn.zcard(keys.dispatch()) == 0


def test_an_owed_submit_behind_a_backed_up_queue_is_only_waiting(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, dispatch_grace_s=5, lease_s=300)
    assert admit(lim, "a") == "go"
    assert admit(lim, "p1", 1, deadline_in_s=300) == "parked"
    finish(lim, "a")
    redis_conn.rpush(SUBMIT_QUEUE, "messages ahead of it")
    try:
        move_clock(5.1)  # the grace period
        assert sweep_now(lim, redis_conn).lost == []  # it waits its turn: no second copy
        move_clock(45)  # ten grace periods in all
        assert [p.lease_id for p in sweep_now(lim, redis_conn).lost] == ["p1"]
    finally:
        redis_conn.delete(SUBMIT_QUEUE)


def test_the_sweep_reclaims_leases_and_hands_out_without_beat(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=0.2)
    assert admit(lim, "dead-worker") == "go"
    assert admit(lim, "waiting", 1) == "parked"
    wait_until(lambda: lim.in_use() == 0, 3, what="the lease to expire")
    handout = sweep_now(lim, redis_conn).handout
    assert [p.lease_id for p in handout.given] == ["waiting"]


def test_one_sweep_per_tick(redis_conn: Any, keys: Keys) -> None:
    owed = owed_of(make(redis_conn, keys))
    assert owed.sweep(tick_s=5, solve_queues=[QUEUE]) is not None
    assert owed.sweep(tick_s=5, solve_queues=[QUEUE]) is None


def test_a_solve_message_lost_before_it_started_is_sent_again(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    lim = make(redis_conn, keys)
    owed = owed_of(lim, message_grace_s=5)
    owed.expect("s1", json.dumps({"method": "turnstile", "_batch": {"id": "b", "index": 3}}))
    owed.expect("s2", json.dumps({"method": "turnstile"}))
    assert admit(lim, "s2", 2) == "go"  # s2's message ran
    assert sweep_now(lim, redis_conn, owed).unstarted == []  # not overdue yet
    move_clock(5.1)  # the grace period
    redis_conn.rpush(QUEUE, "a message still queued")
    assert sweep_now(lim, redis_conn, owed).unstarted == []  # the queue is backed up: waiting
    redis_conn.delete(QUEUE)
    (lost,) = sweep_now(lim, redis_conn, owed).unstarted
    assert (lost.lease_id, json.loads(lost.job)["_batch"]["index"]) == ("s1", 3)
    assert sweep_now(lim, redis_conn, owed).unstarted == []  # once per grace period


def test_an_owed_retry_is_handed_out_again_if_its_message_is_lost(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    lim = make(redis_conn, keys, dispatch_grace_s=5)
    assert admit(lim, "s1", 1, message_id="m1") == "go"
    # in.php failed: the submit goes again at once
    lim.owe("s1", job_of("s1", 1), deadline_in_s=60, countdown_s=0.0, unclaim=True)
    assert not redis_conn.exists(keys.submit_claim("s1"))
    assert sweep_now(lim, redis_conn).lost == []  # not overdue yet
    move_clock(5.1)  # the grace period
    assert [p.lease_id for p in sweep_now(lim, redis_conn).lost] == ["s1"]


def test_threads_another_client_holds_take_slots_until_it_stops(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=4)
    assert admit(lim, "mine", 1) == "go"
    seen = lim.see_provider(working_threads=3, hold_s=30)  # it counts 2 that are not ours
    assert (seen.before, seen.now, seen.ours) == (0, 2, 1)
    assert (lim.in_use(), lim.external()) == (1, 2)
    assert admit(lim, "a", 2) == "go"
    assert admit(lim, "b", 3) == "parked"  # 1 + 1 + 2 = 4
    again = lim.see_provider(working_threads=2, hold_s=30)  # the other client stopped
    assert (again.before, again.now) == (2, 0)
    assert lim.external() == 0 and lim.in_use() == 2
    assert [p.lease_id for p in finish(lim, "mine").given] == ["b"]
    # never all of them: one thread stays usable, to find out when they free
    assert lim.see_provider(working_threads=50, hold_s=30).now == 4 - 1


def test_a_slot_taken_while_the_provider_counts_is_not_counted_as_ours(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=6)
    assert admit(lim, "mine", 1) == "go"
    held = lim.held_slots()
    assert held == ["mine"]
    # the provider counts 3 working: ours, and 2 of another client's; meanwhile we took
    # one more slot, whose captcha it did not count yet
    assert admit(lim, "new", 2) == "go"
    seen = lim.see_provider(working_threads=3, hold_s=30, held_before=held)
    assert (seen.now, seen.ours) == (2, 1)  # without held_before: (1, 2), one too few
    assert lim.external() == 2
    finish(lim, "mine")  # a slot given back meanwhile is not ours either: more left alone
    assert lim.see_provider(working_threads=3, hold_s=30, held_before=held).now == 3


def test_the_providers_view_expires_with_its_hold(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=4)
    lim.see_provider(working_threads=2, hold_s=0.2)
    assert lim.external() == 2
    wait_until(lambda: lim.external() == 0, 2, what="the view to expire")
    statuses = [admit(lim, f"s{i}", i) for i in range(4)]
    assert statuses == ["go"] * 4


# -- several providers ---------------------------------------------------------------------


def test_each_provider_has_its_own_threads_and_budgets(redis_conn: Any, keys: Keys) -> None:
    main = make(redis_conn, keys, capacity=1, reserve=0, in_per_window=1)
    backup = ThreadLimiter(
        Db(redis_conn, keys.scoped("backup")),
        LimiterConfig(capacity=1, reserve=0, lease_s=30.0, in_per_window=1),
        "backup",
    )
    assert admit(main, "a") == "go"
    assert admit(main, "b") == "parked"  # the primary's one thread is taken ...
    assert admit(backup, "c") == "go"  # ... the backup's is not, nor its in.php budget
    assert (main.in_use(), backup.in_use()) == (1, 1)
    assert keys.scoped("backup").slots() != keys.slots()


def test_a_provider_out_of_rotation_admits_nothing(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    assert admit(lim, "a", message_id="m1") == "go"
    redis_conn.hset(keys.circuit(lim.provider), "state", "open")
    # its message again (its in.php failed): its slot there is given up, it goes elsewhere
    assert admit(lim, "a", message_id="m1", redelivered=True) == "down"
    assert admit(lim, "b") == "down"
    assert lim.in_use() == 0 and lim.parked_count() == 0


def test_a_provider_out_of_rotation_hands_its_waiting_submits_on(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, in_per_window=1, in_window_s=30)
    assert admit(lim, "a") == "go"
    assert admit(lim, "b") == "parked"
    lim.defer("a", job_of("a", 0), at_in_s=60, deadline_in_s=60, unclaim=True)
    moved = lim.evacuate()
    assert sorted(p.lease_id for p in moved) == ["a", "b"]
    assert lim.parked_count() == 0 and lim.deferred_count() == 0 and lim.in_use() == 0
    # owed a message each, until it starts (elsewhere)
    assert redis_conn.zcard(keys.dispatch()) == 2


def test_a_solve_moving_on_frees_its_slot_for_the_next(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a") == "go"
    assert admit(lim, "b") == "parked"
    handout = lim.release("a")
    assert [p.lease_id for p in handout.given] == ["b"]
    assert lim.in_use() == 1


def test_a_queue_past_its_limit_turns_the_submit_away(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a") == "go"
    assert admit(lim, "b", park_limit=1) == "parked"
    assert admit(lim, "c", park_limit=1) == "full"  # an overflow provider takes it instead
    assert lim.parked_count() == 1
    assert admit(lim, "c") == "parked"  # without a limit (no overflow free) it waits here


def test_a_back_off_waits_in_redis_not_in_a_message(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    assert admit(lim, "a") == "go"
    lim.defer("a", job_of("a", 0), at_in_s=5, deadline_in_s=60, unclaim=True)
    assert not redis_conn.exists(keys.submit_claim("a"))
    assert lim.in_use() == 1 and lim.deferred_count() == 1  # it keeps its thread
    assert sweep_now(lim, redis_conn).handout.given == []
    move_clock(5.1)  # its time
    given = sweep_now(lim, redis_conn).handout.given
    assert [p.lease_id for p in given] == ["a"] and given[0].job == job_of("a", 0)
    assert admit(lim, "a") == "go"


def test_no_slot_answers_past_their_budget_hold_submits_back(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=50, reserve=0, no_slot_ratio=0.5)
    for i in range(5):  # 5 captchas submitted, then NO_SLOT answers pile up
        assert admit(lim, f"s{i}") == "go"
    for _ in range(5):
        lim.count_no_slot()
    waited = lim.admit("t", job_of("t", 0), attempt=0, deadline_in_s=60)
    assert (waited.status, waited.budget) == ("deferred", "no_slot")
