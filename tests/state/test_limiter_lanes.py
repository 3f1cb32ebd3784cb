"""Lanes, tenants and budgets in the thread limiter, against a real Redis server, through
the paths the pipeline takes: admission (``admit``), the completion that frees a slot
and hands it on (``finish``), and the housekeeping sweep."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from test_limiter import (
    QUEUE,
    admit,
    board_of,
    finish,
    job_of,
    make,
    owed_of,
    server_ms,
    sweep_now,
)

from captcha_tasks.core.lanes import Tenant
from captcha_tasks.errors import ValidationError
from captcha_tasks.state.budgets import DAY_MS, TenantBudgets
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.limiter import (
    REFILL_BAND,
    WAIT_BUCKETS_S,
    LaneUse,
    ThreadLimiter,
)
from captcha_tasks.testing.processes import wait_until

pytestmark = pytest.mark.redis

SHOP = Tenant("shop", weight=2)
CRAWLER = Tenant("crawler", weight=1)


def tenants(*found: Tenant) -> dict[str, Tenant]:
    return {t.name: t for t in found}


def run_down(lim: ThreadLimiter, holder: str, count: int) -> list[str]:
    """Finish the holder of the one slot ``count`` times; who got it each time."""
    order = []
    for _ in range(count):
        given = finish(lim, holder).given
        assert len(given) == 1
        holder = given[0].lease_id
        order.append(holder)
    return order


def test_interactive_goes_first_then_bulk_then_background(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a") == "go"
    # parked in the reverse of the order they are served in
    assert admit(lim, "refill", 1, lane="background") == "parked"
    assert admit(lim, "batch-1", 2, lane="bulk") == "parked"
    assert admit(lim, "batch-2", 3, lane="bulk") == "parked"
    assert admit(lim, "view", 4, lane="interactive") == "parked"
    assert run_down(lim, "a", 4) == ["view", "batch-1", "batch-2", "refill"]


def test_a_newcomer_in_a_higher_lane_takes_a_free_slot_a_lower_lane_cannot(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=2, reserve=1)
    assert admit(lim, "r1", 1, lane="background") == "go"
    assert admit(lim, "r2", 2, lane="background") == "parked"  # the reserve is not its
    assert admit(lim, "view", 3) == "go"  # parked background work is not ahead of it


def test_freed_slots_follow_the_tenants_weights(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, tenants=tenants(SHOP, CRAWLER))
    assert admit(lim, "a") == "go"
    for i in range(30):
        assert admit(lim, f"crawler-{i}", i, lane="bulk", tenant="crawler") == "parked"
        assert admit(lim, f"shop-{i}", i, lane="bulk", tenant="shop") == "parked"
    order = run_down(lim, "a", 30)
    shares = Counter(o.split("-")[0] for o in order)
    assert shares == {"shop": 20, "crawler": 10}
    # spread out, not one tenant's turn after the other's: every third slot is the crawler's
    for start in range(0, 30, 3):
        assert Counter(o.split("-")[0] for o in order[start : start + 3])["crawler"] == 1
    # first in, first out within a tenant
    assert [o for o in order if o.startswith("shop")] == [f"shop-{i}" for i in range(20)]


def test_an_idle_tenants_share_goes_to_the_others_and_is_owed_back_one_plan_at_most(
    redis_conn: Any, keys: Keys
) -> None:
    capacity = 3
    lim = make(redis_conn, keys, capacity=capacity, reserve=0, tenants=tenants(SHOP, CRAWLER))
    assert [admit(lim, f"a{i}", i) for i in range(capacity)] == ["go"] * capacity
    for i in range(60):
        admit(lim, f"shop-{i}", i, lane="bulk", tenant="shop")
    # the crawler has nothing parked: every freed slot goes to the shop
    order = run_down(lim, "a0", 20)
    assert all(o.startswith("shop") for o in order)
    for i in range(30):
        admit(lim, f"crawler-{i}", i, lane="bulk", tenant="crawler")
    # back, the crawler gets its share (10 of 30) and catches up on at most one plan's
    # worth of slots: not a burst for all the time it had nothing parked
    after = [o.split("-")[0] for o in run_down(lim, order[-1], 30)]
    assert after[:capacity] == ["crawler"] * capacity
    assert 10 <= after.count("crawler") <= 10 + capacity


def test_the_second_of_two_batches_started_together_catches_up(redis_conn: Any, keys: Keys) -> None:
    # the first batch to ask took every free slot; the other's share holds within a plan
    capacity = 15
    lim = make(redis_conn, keys, capacity=capacity, reserve=0, tenants=tenants(SHOP, CRAWLER))
    first = [admit(lim, f"crawler-{i}", i, lane="bulk", tenant="crawler") for i in range(40)]
    assert first.count("go") == capacity
    for i in range(40):
        assert admit(lim, f"shop-{i}", i, lane="bulk", tenant="shop") == "parked"
    handed = [o.split("-")[0] for o in run_down(lim, "crawler-0", 17 + 30)]
    # the shop catches up on one plan's worth of slots (and its turn on the way) ...
    assert handed[:17] == ["shop"] * 17
    # ... and from then on two of every three are the shop's
    assert Counter(handed[17:]) == {"shop": 20, "crawler": 10}


def test_max_threads_caps_a_tenant(redis_conn: Any, keys: Keys) -> None:
    capped = Tenant("crawler", max_threads=2)
    lim = make(redis_conn, keys, capacity=4, reserve=0, tenants=tenants(capped))
    statuses = [admit(lim, f"c{i}", i, tenant="crawler") for i in range(4)]
    assert statuses == ["go", "go", "parked", "parked"]  # two slots stay free
    assert admit(lim, "s1", 9, tenant="shop") == "go"  # for the others
    assert lim.lanes()[("interactive", "crawler")] == LaneUse(held=2, parked=2)
    assert finish(lim, "s1").given == []  # a slot the crawler may not take
    assert [p.lease_id for p in finish(lim, "c0").given] == ["c2"]  # one of its own


def test_a_spent_budget_fails_submits_and_hands_parked_ones_on(redis_conn: Any, keys: Keys) -> None:
    budgeted = Tenant("crawler", daily_captchas=3)
    lim = make(redis_conn, keys, capacity=2, reserve=0, tenants=tenants(budgeted))
    assert [admit(lim, f"c{i}", i, tenant="crawler") for i in range(4)] == [
        "go",
        "go",
        "parked",
        "parked",
    ]
    (given,) = finish(lim, "c0").given
    assert given.lease_id == "c2"
    assert admit(lim, "c2", 2, tenant="crawler") == "go"  # its submit message: the third
    handout = finish(lim, "c1")
    # spent: c3 is handed on without a slot, and its submit fails it
    assert handout.given == [] and [p.lease_id for p in handout.expired] == ["c3"]
    assert admit(lim, "c3", 3, tenant="crawler") == "over_budget"
    assert admit(lim, "c4", 4, tenant="crawler") == "over_budget"  # at once, not parked
    assert lim.parked_count() == 0
    assert admit(lim, "s1", 5, tenant="shop") == "go"  # other tenants go on
    assert TenantBudgets(lim.db).submitted_today(["crawler", "shop", "idle"]) == {
        "crawler": 3,
        "shop": 1,
        "idle": 0,
    }


def test_a_retry_counts_once_and_a_resubmit_counts_again(redis_conn: Any, keys: Keys) -> None:
    budgeted = tenants(Tenant("t", daily_captchas=2))
    lim = make(redis_conn, keys, capacity=3, reserve=0, tenants=budgeted)
    assert admit(lim, "s1", 1, tenant="t") == "go"
    # in.php failed in transit: the same attempt goes again, and is not paid twice
    lim.owe("s1", job_of("s1", 1), deadline_in_s=60, countdown_s=0, unclaim=True)
    assert admit(lim, "s1", 1, tenant="t") == "go"
    assert TenantBudgets(lim.db).submitted_today(["t"]) == {"t": 1}
    board_of(lim).register("s1", 0, "7", job_of("s1", 1), first_poll_in_s=5)
    # the captcha was unsolvable: a new one is paid again
    again = lim.admit("s1", job_of("s1", 1), attempt=1, deadline_in_s=60, tenant="t")
    assert again.status == "go"
    assert TenantBudgets(lim.db).submitted_today(["t"]) == {"t": 2}
    assert admit(lim, "s2", 2, tenant="t") == "over_budget"


def test_yesterdays_count_does_not_spend_todays_budget(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=3, tenants=tenants(Tenant("t", daily_captchas=1)))
    today = server_ms(redis_conn) // DAY_MS
    redis_conn.hset(keys.tenant_budgets(), f"{today - 1}|t", 1)
    assert admit(lim, "s1", 1, tenant="t") == "go"
    assert admit(lim, "s2", 2, tenant="t") == "over_budget"


def test_waits_and_counts_by_lane_and_tenant(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    asked = server_ms(redis_conn) / 1000 - 1.5
    lim.admit("a", job_of("a", 0), attempt=0, deadline_in_s=60, asked_at=asked, tenant="shop")
    lim.admit("b", job_of("b", 1), attempt=0, deadline_in_s=60, lane="bulk")
    assert lim.lanes() == {
        ("bulk", "default"): LaneUse(held=0, parked=1),
        ("interactive", "shop"): LaneUse(held=1, parked=0),
    }
    waits = lim.wait_times()[("interactive", "shop")]
    assert waits.count == 1 and 1.5 <= waits.sum_s < 2.5
    assert waits.buckets[WAIT_BUCKETS_S.index(2.0)] == 1  # 1.5 s < wait <= 2 s
    finish(lim, "a")
    assert lim.lanes() == {("bulk", "default"): LaneUse(held=1, parked=0)}
    assert lim.wait_times()[("bulk", "default")].count == 1
    finish(lim, "b")
    assert lim.lanes() == {}


def test_counts_follow_an_expired_lease(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0, lease_s=0.3)
    assert admit(lim, "dead-worker") == "go"
    assert admit(lim, "waiting", 1, lane="bulk") == "parked"
    wait_until(lambda: lim.in_use() == 0, 3, what="the lease to expire")
    swept = sweep_now(lim, redis_conn)
    assert [p.lease_id for p in swept.handout.given] == ["waiting"] and not swept.repaired
    assert lim.lanes() == {("bulk", "default"): LaneUse(held=1, parked=0)}


def test_submits_parked_before_lanes_join_a_lane_at_the_next_sweep(
    redis_conn: Any, keys: Keys
) -> None:
    lim = make(redis_conn, keys, capacity=1, reserve=0)
    assert admit(lim, "a") == "go"
    # what a version without lanes left: a parked refill (banded) and an on-demand solve
    deadline = server_ms(redis_conn) + 60_000
    for solve_id, score in (("old-refill", REFILL_BAND + 1), ("old-solve", 2)):
        redis_conn.zadd(keys.parked(), {solve_id: score})
        redis_conn.hset(keys.waiting(), solve_id, f"{deadline}|{job_of(solve_id, score)}")
    redis_conn.zadd(keys.slots(), {"old-holder": deadline})  # and a slot it held
    redis_conn.zrem(keys.slots(), "a")
    assert admit(lim, "new", 3, lane="bulk") == "parked"
    assert sweep_now(lim, redis_conn).repaired
    assert lim.lanes() == {
        ("background", "default"): LaneUse(held=0, parked=1),
        ("bulk", "default"): LaneUse(held=0, parked=1),
        ("interactive", "default"): LaneUse(held=1, parked=1),
    }
    assert not sweep_now(lim, redis_conn).repaired  # once
    assert run_down(lim, "old-holder", 3) == ["old-solve", "new", "old-refill"]


def test_an_unknown_lane_or_a_bad_tenant_name_is_refused(redis_conn: Any, keys: Keys) -> None:
    lim = make(redis_conn, keys)
    with pytest.raises(ValidationError, match="unknown lane 'urgent'"):
        admit(lim, "s1", lane="urgent")
    with pytest.raises(ValidationError, match="cannot name a tenant"):
        admit(lim, "s1", tenant="a|b")
    assert lim.parked_count() == 0 and lim.in_use() == 0


def test_the_sweep_still_waits_for_solve_messages_queued_in_any_lane(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None]
) -> None:
    owed = owed_of(make(redis_conn, keys), message_grace_s=5)
    owed.expect("s1", json.dumps({"method": "turnstile"}))
    move_clock(5.1)  # the grace period
    bulk_queue = QUEUE + ".bulk"
    redis_conn.rpush(bulk_queue, "a bulk message still queued")
    try:
        redis_conn.delete(keys.housekeeping_lock())
        swept = owed.sweep(tick_s=5, solve_queues=[QUEUE, bulk_queue])
        assert swept is not None and swept.unstarted == []
    finally:
        redis_conn.delete(bulk_queue)
