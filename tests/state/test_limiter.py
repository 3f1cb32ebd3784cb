"""The thread limiter's Lua scripts against a real Redis server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from captcha_tasks.dev.devstack import free_port, wait_until
from captcha_tasks.errors import StoreUnavailable
from captcha_tasks.keys import Keys
from captcha_tasks.state.limiter import LimiterConfig, ThreadLimiter

#: The solve queue a sweep looks at (empty in these tests unless a test fills it).
QUEUE = "t-limiter-solve-queue"


def make(redis_conn: Any, keys: Keys, **overrides: Any) -> ThreadLimiter:
    config = {"capacity": 3, "reserve": 1, "lease_s": 30.0, **overrides}
    return ThreadLimiter(redis_conn, keys, LimiterConfig(**config))


def server_ms(conn: Any) -> int:
    sec, usec = conn.time()
    return int(sec) * 1000 + int(usec) // 1000


def payload(n: int) -> dict[str, Any]:
    return {"request": {"n": n}, "attempt": 0}


def job_of(lease_id: str, n: int) -> dict[str, Any]:
    return {**payload(n), "solve_id": lease_id}


def test_capacity_never_exceeded_under_contention(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=5)
    granted: list[str] = []
    lock = threading.Lock()

    def grab(i: int) -> None:
        if lim.acquire(f"c{i}", job=payload(i), deadline_in_s=60):
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


def test_release_hands_slot_to_oldest_parked_in_arrival_order(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert lim.acquire("a", job=payload(0), deadline_in_s=60)
    for i in (1, 2, 3):
        assert not lim.acquire(f"p{i}", job=payload(i), deadline_in_s=60)
    order = []
    holder = "a"
    for _ in range(3):
        handout = lim.release(holder)
        assert len(handout.given) == 1
        holder = handout.given[0].lease_id
        order.append(holder)
        assert lim.in_use() == 1
    assert order == ["p1", "p2", "p3"]
    assert handout.given[0].job == job_of("p3", 3)


def test_newcomer_does_not_jump_the_queue(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    lim.acquire("a", job=payload(0), deadline_in_s=60)
    lim.acquire("p1", job=payload(1), deadline_in_s=60)
    # a slot frees by lease loss, not release: the parked one still goes first
    redis_conn.zrem(keys.slots(), "a")
    assert not lim.acquire("late", job=payload(2), deadline_in_s=60)
    handout = lim.release(None)
    assert [p.lease_id for p in handout.given] == ["p1"]


def test_redelivered_acquire_keeps_its_slot(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert lim.acquire("a", job=payload(0), deadline_in_s=60)
    assert lim.acquire("a", job=payload(0), deadline_in_s=60)
    assert lim.in_use() == 1


def test_refills_leave_the_reserve_to_on_demand(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=3, reserve=1)
    assert lim.acquire("r1", job=payload(1), deadline_in_s=60, refill=True)
    assert lim.acquire("r2", job=payload(2), deadline_in_s=60, refill=True)
    assert not lim.acquire("r3", job=payload(3), deadline_in_s=60, refill=True)
    assert lim.free_for_refills() == 0
    # the reserved slot still serves an on-demand solve, ahead of the parked refill
    assert lim.acquire("d1", job=payload(4), deadline_in_s=60)
    assert not lim.acquire("d2", job=payload(5), deadline_in_s=60)
    handout = lim.release("r1")
    assert [p.lease_id for p in handout.given] == ["d2"]


def test_lease_nobody_renews_expires(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=0.3)
    assert lim.acquire("dead-worker", job=payload(0), deadline_in_s=60)
    assert not lim.acquire("waiting", job=payload(1), deadline_in_s=60)
    wait_until(lambda: lim.in_use() == 0, 3, what="the lease to expire")
    handout = lim.release(None)
    assert [p.lease_id for p in handout.given] == ["waiting"]


def test_renew_keeps_a_lease_alive(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=0.4)
    lim.acquire("a", job=payload(0), deadline_in_s=60)
    score_before = redis_conn.zscore(keys.slots(), "a")
    assert lim.renew("a") is True
    assert redis_conn.zscore(keys.slots(), "a") >= score_before


def test_renew_never_brings_back_a_released_lease(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    lim.acquire("a", job=payload(0), deadline_in_s=60)
    lim.release("a")
    assert lim.renew("a") is False
    assert lim.in_use() == 0


def test_parked_past_deadline_is_handed_on_without_a_slot(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    lim.acquire("a", job=payload(0), deadline_in_s=60)
    lim.acquire("late", job=payload(1), deadline_in_s=0.05)
    lim.acquire("fine", job=payload(2), deadline_in_s=60)
    start = server_ms(redis_conn)
    wait_until(lambda: server_ms(redis_conn) > start + 60, 2, what="the server clock")
    handout = lim.release("a")
    assert [p.lease_id for p in handout.expired] == ["late"]
    assert [p.lease_id for p in handout.given] == ["fine"]
    assert redis_conn.zrange(keys.slots(), 0, -1) == ["fine"]
    # both are owed a submit message (the expired one's submit fails it)
    assert sorted(redis_conn.zrange(keys.dispatch(), 0, -1)) == ["fine", "late"]


def test_submit_rate_window(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, in_per_window=5, in_window_s=3.0)
    waits = [lim.submit_wait() for _ in range(6)]
    assert waits[:5] == [0.0] * 5
    assert 0 < waits[5] <= 3.0


def test_poll_budget_grows_with_captchas(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, res_per_captcha=2, res_base=3)
    assert [lim.poll_wait() for _ in range(3)] == [0.0] * 3
    assert lim.poll_wait() > 0
    lim.submit_wait()  # one captcha submitted buys two more polls
    assert [lim.poll_wait() for _ in range(2)] == [0.0] * 2
    assert lim.poll_wait() > 0


def test_redis_down_fails_closed_with_clear_error(keys: Keys) -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    lim = ThreadLimiter(dead, keys, LimiterConfig(capacity=1, reserve=0, lease_s=10))
    with pytest.raises(StoreUnavailable, match="Redis is down"):
        lim.acquire("a", job=payload(0), deadline_in_s=10)
    with pytest.raises(StoreUnavailable, match="Redis is down"):
        lim.submit_wait()


# -- admission of a submit message -----------------------------------------------------


def admit(lim: ThreadLimiter, job: dict[str, Any], **kwargs: Any) -> str:
    return lim.admit(job, deadline_in_s=60, **kwargs).status


def test_admission_claims_the_submit_once(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    job = job_of("s1", 1)
    assert admit(lim, job) == "go"
    assert redis_conn.exists(keys.submit_claim("s1"))
    assert admit(lim, job) == "busy"  # a copy of the message while the first submits
    lim.unclaim("s1")  # the in.php call failed and will be retried
    assert admit(lim, job) == "go"
    # once this attempt's captcha is recorded, copies of its message are duplicates
    redis_conn.hset(keys.submission("s1"), mapping={"attempt": 0, "captcha_id": "7"})
    lim.unclaim("s1")
    assert admit(lim, job) == "done"
    assert admit(lim, {**job, "attempt": 1}) == "go"  # the next attempt goes
    assert lim.in_use() == 1


def test_the_claims_own_message_redelivered_after_a_crash_goes_on(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    job = job_of("s1", 1)
    assert lim.admit(job, deadline_in_s=60, message_id="m1").status == "go"
    # ... its worker dies in in.php; the broker delivers the same message again
    assert lim.admit(job, deadline_in_s=60, message_id="m1").status == "busy"  # a copy
    assert lim.admit(job, deadline_in_s=60, message_id="m2", redelivered=True).status == "busy"
    again = lim.admit(job, deadline_in_s=60, message_id="m1", redelivered=True)
    assert again.status == "go"
    assert lim.in_use() == 1


def test_a_finished_solve_is_never_admitted_again(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=0)
    redis_conn.hset(keys.submission("s1"), "done", "1")
    assert admit(lim, job_of("s1", 1)) == "done"
    assert lim.in_use() == 0


def test_admission_waits_for_the_in_php_budget_holding_the_slot(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=3, reserve=0, in_per_window=1, in_window_s=3.0)
    assert admit(lim, job_of("s1", 1)) == "go"
    waited = lim.admit(job_of("s2", 2), deadline_in_s=60)
    assert waited.status == "wait" and 0 < waited.wait_s <= 3.0
    assert lim.in_use() == 2
    assert not redis_conn.exists(keys.submit_claim("s2"))


def test_a_cancelled_batch_gives_its_slot_back(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    job = job_of("s1", 1)
    assert admit(lim, job, batch_id="b1") == "go"
    lim.unclaim("s1")
    assert admit(lim, job_of("s2", 2)) == "parked"
    redis_conn.set(keys.batch_cancelled("b1"), "1")
    cancelled = lim.admit(job, deadline_in_s=60, batch_id="b1")
    assert cancelled.status == "cancelled"
    # the slot it gave back went to the parked submit at once
    assert cancelled.handout is not None
    assert [p.lease_id for p in cancelled.handout.given] == ["s2"]
    assert redis_conn.zrange(keys.slots(), 0, -1) == ["s2"]


def test_a_parked_submit_is_parked_once(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, job_of("s1", 1)) == "go"
    assert admit(lim, job_of("s2", 2)) == "parked"
    assert admit(lim, job_of("s2", 2)) == "parked"  # a redelivered copy
    assert lim.parked_count() == 1


def sweep_now(lim: ThreadLimiter, redis_conn: Any) -> Any:
    """One sweep, whoever swept last (the lock only spaces sweeps of many workers)."""
    redis_conn.delete(lim.keys.housekeeping_lock())
    swept = lim.sweep(tick_s=5, solve_queue=QUEUE)
    assert swept is not None
    return swept


def test_a_handed_out_submit_whose_message_is_lost_is_handed_out_again(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, dispatch_grace_s=0.2)
    assert lim.acquire("a", job=payload(0), deadline_in_s=60)
    assert not lim.acquire("p1", job=payload(1), deadline_in_s=60)
    handout = lim.release("a")  # ... and the worker dies before it publishes p1's submit
    assert [p.lease_id for p in handout.given] == ["p1"]
    assert sweep_now(lim, redis_conn).lost == []  # not overdue yet
    start = server_ms(redis_conn)
    wait_until(lambda: server_ms(redis_conn) > start + 250, 2, what="the grace period")
    lost = sweep_now(lim, redis_conn).lost
    assert [p.lease_id for p in lost] == ["p1"]
    assert lost[0].job == job_of("p1", 1)
    assert sweep_now(lim, redis_conn).lost == []  # handed out again once per grace period
    # once its message starts, it is not owed any more
    assert admit(lim, job_of("p1", 1)) == "go"
    assert redis_conn.zcard(keys.dispatch()) == 0


def test_the_sweep_reclaims_leases_and_hands_out_without_beat(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=0.2)
    assert lim.acquire("dead-worker", job=payload(0), deadline_in_s=60)
    assert not lim.acquire("waiting", job=payload(1), deadline_in_s=60)
    wait_until(lambda: lim.in_use() == 0, 3, what="the lease to expire")
    handout = sweep_now(lim, redis_conn).handout
    assert [p.lease_id for p in handout.given] == ["waiting"]


def test_one_sweep_per_tick(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys)
    assert lim.sweep(tick_s=5, solve_queue=QUEUE) is not None
    assert lim.sweep(tick_s=5, solve_queue=QUEUE) is None


def test_a_solve_message_lost_before_it_started_is_sent_again(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, message_grace_s=0.2)
    lim.expect("s1", {"method": "turnstile", "_batch": {"id": "b", "index": 3}})
    lim.expect("s2", {"method": "turnstile"})
    assert lim.admit(job_of("s2", 2), deadline_in_s=60).status == "go"  # s2's message ran
    assert sweep_now(lim, redis_conn).unstarted == []  # not overdue yet
    start = server_ms(redis_conn)
    wait_until(lambda: server_ms(redis_conn) > start + 250, 2, what="the grace period")
    redis_conn.rpush(QUEUE, "a message still queued")
    assert sweep_now(lim, redis_conn).unstarted == []  # the queue is backed up: waiting
    redis_conn.delete(QUEUE)
    (lost,) = sweep_now(lim, redis_conn).unstarted
    assert (lost.lease_id, lost.job["_batch"]["index"]) == ("s1", 3)
    assert sweep_now(lim, redis_conn).unstarted == []  # once per grace period


def test_an_owed_retry_is_handed_out_again_if_its_message_is_lost(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, dispatch_grace_s=0.1)
    job = {**job_of("s1", 1), "deadline": 2e9}
    assert lim.admit(job, deadline_in_s=60, message_id="m1").status == "go"
    lim.owe(job, 0.0, unclaim=True)  # in.php failed: the submit goes again at once
    assert not redis_conn.exists(keys.submit_claim("s1"))
    start = server_ms(redis_conn)
    wait_until(lambda: server_ms(redis_conn) > start + 150, 2, what="the grace period")
    assert [p.lease_id for p in sweep_now(lim, redis_conn).lost] == ["s1"]


def test_threads_another_client_holds_take_slots_until_it_stops(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=4)
    assert lim.admit(job_of("mine", 1), deadline_in_s=60).status == "go"
    seen = lim.see_provider(working_threads=3, hold_s=30)  # it counts 2 that are not ours
    assert (seen.before, seen.now, seen.ours) == (0, 2, 1)
    assert (lim.in_use(), lim.external()) == (1, 2)
    assert lim.admit(job_of("a", 2), deadline_in_s=60).status == "go"
    assert lim.admit(job_of("b", 3), deadline_in_s=60).status == "parked"  # 1 + 1 + 2 = 4
    again = lim.see_provider(working_threads=2, hold_s=30)  # the other client stopped
    assert (again.before, again.now) == (2, 0)
    assert lim.external() == 0 and lim.in_use() == 2
    assert [p.lease_id for p in lim.release("mine").given] == ["b"]
    # never all of them: one thread stays usable, to find out when they free
    assert lim.see_provider(working_threads=50, hold_s=30).now == 4 - 1


def test_the_providers_view_expires_with_its_hold(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=4)
    lim.see_provider(working_threads=2, hold_s=0.2)
    assert lim.external() == 2
    wait_until(lambda: lim.external() == 0, 2, what="the view to expire")
    statuses = [lim.admit(job_of(f"s{i}", i), deadline_in_s=60).status for i in range(4)]
    assert statuses == ["go"] * 4
