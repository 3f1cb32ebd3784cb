"""The batch core (captcha_tasks.batching) on its own: no Redis, no worker, an injected
clock.  Each test tells a :class:`Batch` what happened and checks what it decides."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from captcha_tasks import errors
from captcha_tasks.batching import (
    MAX_BLOCK_S,
    OUTAGE_WAIT_S,
    Abandon,
    Batch,
    Done,
    Emit,
    Fail,
    ProtocolError,
    Pull,
    Read,
    Send,
    Wait,
)

DOWN = errors.StoreUnavailable("Redis is down or REDIS_URL is wrong (REDIS_URL=redis://:***@h:1/0)")


def task(n: int = 0, method: str = "turnstile") -> dict[str, Any]:
    return {"method": method, "sitekey": f"k{n}", "pageurl": "https://example.com"}


def solved(index: int) -> dict[str, Any]:
    return {"status": "solved", "method": "turnstile", "token": f"t{index}", "index": index}


def entry(n: int, index: int) -> tuple[str, dict[str, Any]]:
    return (f"{n}-0", solved(index))


def fill(batch: Batch, now: float, tasks: int) -> list[int]:
    """Pull and send until the batch asks for something else; returns the indexes sent."""
    sent = []
    for n in range(tasks):
        action = batch.next_action(now)
        assert action == Pull()
        batch.pulled(task(n))
        action = batch.next_action(now)
        assert isinstance(action, Send)
        batch.sent(now)
        sent.append(action.index)
    return sent


def test_queues_a_window_then_reads() -> None:
    batch = Batch("b", window=2, timeout_s=60)
    assert fill(batch, 0.0, 2) == [0, 1]
    action = batch.next_action(0.0)
    assert action == Read("0-0", int(MAX_BLOCK_S * 1000) + 1)  # window full: no third task
    batch.read([entry(1, 1)])
    assert batch.next_action(0.1) == Emit((solved(1),))
    assert batch.next_action(0.1) == Pull()  # a place in the window: the next task


def test_outcomes_in_arrival_order_once_each_and_the_read_goes_on_after_the_last() -> None:
    batch = Batch("b", window=3, timeout_s=60)
    fill(batch, 0.0, 3)
    batch.next_action(0.0)
    # 2 arrives, then 0; 0 again (a duplicate entry) and 7 (not ours) are dropped
    batch.read([entry(5, 2), entry(6, 0), entry(7, 0), (f"{8}-0", solved(7))])
    assert batch.next_action(1.0) == Emit((solved(2), solved(0)))
    assert batch.next_action(1.0) == Pull()
    batch.ended()
    assert batch.next_action(1.0) == Read("8-0", int(MAX_BLOCK_S * 1000) + 1)
    batch.read([entry(9, 1)])
    assert batch.next_action(1.5) == Emit((solved(1),))
    assert batch.next_action(1.5) == Done()
    assert batch.close() == Abandon("b", cancel=False, unanswered=0)


def test_a_refused_task_fails_in_place_and_takes_no_room_in_the_window() -> None:
    batch = Batch("b", window=1, timeout_s=60)
    assert batch.next_action(0.0) == Pull()
    batch.pulled({"method": "turnstile", "pageurl": "nope"})
    assert batch.next_action(0.0) == Send(0, {"method": "turnstile", "pageurl": "nope"})
    batch.refused(errors.ValidationError("pageurl must be http(s)"))
    emitted = batch.next_action(0.0)
    assert isinstance(emitted, Emit)
    (failure,) = emitted.outcomes
    assert failure["index"] == 0 and failure["status"] == "failed"
    assert (failure["error"], failure["method"]) == ("ERROR_VALIDATION", "turnstile")
    assert batch.next_action(0.0) == Pull()  # the window is still free
    batch.pulled(task(1))
    assert batch.next_action(0.0) == Send(1, task(1))


def test_a_task_whose_outcome_is_late_fails_and_its_late_outcome_is_dropped() -> None:
    batch = Batch("b", window=2, timeout_s=3.0)
    fill(batch, 0.0, 1)
    assert batch.next_action(1.0) == Pull()
    batch.pulled(task(1))
    batch.next_action(1.0)
    batch.sent(1.0)
    read = batch.next_action(1.5)
    assert read == Read("0-0", 1501)  # wakes for the first deadline (3.0), not later
    batch.read([])
    late = batch.next_action(3.0)
    assert isinstance(late, Emit)
    assert [(o["index"], o["error"]) for o in late.outcomes] == [(0, "ERROR_SOLVE_TIMEOUT")]
    batch.next_action(3.0)  # Pull: room again
    batch.ended()
    assert batch.next_action(3.0) == Read("0-0", 1001)
    batch.read([entry(1, 0), entry(2, 1)])  # 0 came after all: dropped
    assert batch.next_action(3.1) == Emit((solved(1),))
    assert batch.next_action(3.1) == Done()


def test_redis_down_before_anything_was_queued_fails_at_once() -> None:
    batch = Batch("b", window=4, timeout_s=60)
    batch.next_action(0.0)
    batch.pulled(task())
    batch.next_action(0.0)
    batch.unavailable(DOWN, 0.0)
    assert batch.next_action(0.0) == Fail(DOWN)
    assert batch.close() is None  # nothing to cancel


def test_an_outage_is_ridden_out_with_back_off_and_the_same_task_is_sent_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "captcha_tasks.batching")
    batch = Batch("b", window=3, timeout_s=60)
    fill(batch, 0.0, 1)
    assert batch.next_action(0.0) == Pull()
    batch.pulled(task(1))
    assert batch.next_action(0.0) == Send(1, task(1))
    batch.unavailable(DOWN, 0.0)
    now, waits = 0.0, []
    for _ in range(6):
        action = batch.next_action(now)
        assert isinstance(action, Wait)
        waits.append(round(action.seconds, 3))
        now += action.seconds
        assert batch.next_action(now) == Send(1, task(1))  # the same task, the same index
        batch.unavailable(DOWN, now)
    assert waits == [OUTAGE_WAIT_S[0], 0.4, 0.8, 1.6, OUTAGE_WAIT_S[1], OUTAGE_WAIT_S[1]]
    now += batch.next_action(now).seconds  # type: ignore[union-attr]
    assert batch.next_action(now) == Send(1, task(1))
    batch.sent(now)
    assert batch.next_action(now) == Pull()  # back to normal: no wait
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # once when it went, once when it came back
    assert "Redis is unavailable" in messages[0] and "REDIS_URL=redis://:***@" in messages[0]
    assert "Redis is back" in messages[1]


def test_a_failed_read_waits_then_reads_from_where_it_was() -> None:
    batch = Batch("b", window=1, timeout_s=60)
    fill(batch, 0.0, 1)
    batch.next_action(0.0)
    batch.read([entry(3, 0)])
    batch.next_action(0.0)  # Emit
    batch.next_action(0.0)  # Pull
    batch.pulled(task(1))
    batch.next_action(0.0)
    batch.sent(0.0)
    assert batch.next_action(0.0) == Read("3-0", int(MAX_BLOCK_S * 1000) + 1)
    batch.unavailable(DOWN, 0.0)
    assert batch.next_action(0.1) == Wait(pytest.approx(0.1))  # type: ignore[arg-type]
    assert batch.next_action(0.2) == Read("3-0", int(MAX_BLOCK_S * 1000) + 1)


def test_an_outage_longer_than_the_task_timeout_ends_the_batch() -> None:
    batch = Batch("b", window=2, timeout_s=10)
    fill(batch, 0.0, 1)
    batch.next_action(0.0)
    batch.pulled(task(1))
    batch.next_action(0.0)
    batch.unavailable(DOWN, 0.0)  # sending task 1 failed
    now, emitted = 0.0, []
    while True:
        action = batch.next_action(now)
        if isinstance(action, Wait):
            now += action.seconds
        elif isinstance(action, Send | Read):
            batch.unavailable(DOWN, now)
        elif isinstance(action, Emit):
            emitted += action.outcomes
        else:
            break
    assert [(o["index"], o["error"]) for o in emitted] == [(0, "ERROR_SOLVE_TIMEOUT")]
    assert isinstance(action, Fail) and isinstance(action.error, errors.StoreUnavailable)
    assert 10 <= now <= 10 + OUTAGE_WAIT_S[1]
    assert "REDIS_URL=redis://:***@" in str(action.error)
    assert str(action.error).endswith(
        "without Redis: 1 task(s) were not queued; the rest of the input was not read"
    )
    assert batch.next_action(now) == action  # it stays failed
    assert batch.close() == Abandon("b", cancel=False, unanswered=0)


def test_leaving_cancels_what_is_unanswered() -> None:
    batch = Batch("b", window=3, timeout_s=60)
    fill(batch, 0.0, 3)
    batch.next_action(0.0)
    batch.read([entry(1, 1)])
    assert batch.close() == Abandon("b", cancel=True, unanswered=2)
    assert batch.close() is None  # once
    with pytest.raises(ProtocolError):
        batch.next_action(1.0)


def test_events_that_were_not_asked_for_are_refused() -> None:
    batch = Batch("b", window=1, timeout_s=60)
    with pytest.raises(ProtocolError):
        batch.sent(0.0)
    assert batch.next_action(0.0) == Pull()
    with pytest.raises(ProtocolError):
        batch.read([])
    batch.pulled(task())
    batch.next_action(0.0)
    batch.sent(0.0)
    with pytest.raises(ProtocolError):
        batch.sent(0.0)  # reported twice


@pytest.mark.parametrize(
    ("window", "timeout", "message"),
    [(0, 60, "window must be at least 1"), (1, 0, "timeout_per_task must be positive")],
)
def test_bad_arguments(window: int, timeout: float, message: str) -> None:
    with pytest.raises(errors.ValidationError, match=message):
        Batch("b", window=window, timeout_s=timeout)


# -- whole batches against a simulated Redis and workers ------------------------------------


@dataclass
class World:
    """Workers finishing each queued task after a random time, and Redis unreachable in
    the given windows of time."""

    rng: random.Random
    outages: list[tuple[float, float]]
    now: float = 0.0
    hit: set[tuple[float, float]] = field(default_factory=set)
    done_at: dict[int, float] = field(default_factory=dict)
    stream: list[tuple[float, int]] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)

    def down(self) -> bool:
        hit = {(start, end) for start, end in self.outages if start <= self.now < end}
        self.hit |= hit
        return bool(hit)

    def queue(self, index: int) -> None:
        self.sent.append(index)
        self.done_at[index] = self.now + self.rng.uniform(0.1, 3.0)

    def entries(self, after: str) -> list[tuple[str, dict[str, Any]]]:
        for index, at in list(self.done_at.items()):
            if at <= self.now:
                self.stream.append((at, index))
                del self.done_at[index]
        self.stream.sort()
        seen = int(after.split("-")[0])
        return [(f"{n + 1}-0", solved(i)) for n, (_, i) in enumerate(self.stream) if n + 1 > seen]


def drive(batch: Batch, tasks: list[dict[str, Any]], world: World) -> list[dict[str, Any]]:
    """A driver like stream()'s, on the simulated world and clock."""
    source, out = iter(tasks), []
    while True:
        action = batch.next_action(world.now)
        if isinstance(action, Emit):
            out += action.outcomes
        elif isinstance(action, Pull):
            nxt = next(source, None)
            batch.ended() if nxt is None else batch.pulled(nxt)
        elif isinstance(action, Send):
            if world.down():
                batch.unavailable(DOWN, world.now)
            else:
                world.queue(action.index)
                batch.sent(world.now)
            world.now += 0.001
        elif isinstance(action, Read):
            if world.down():
                batch.unavailable(DOWN, world.now)
                continue
            found = world.entries(action.after)
            if not found:  # blocks until an entry comes, the block ends or Redis goes
                upcoming = [at for at in world.done_at.values() if at > world.now]
                upcoming += [start for start, _ in world.outages if start > world.now]
                world.now = min([world.now + action.block_ms / 1000, *upcoming])
                if world.down():
                    batch.unavailable(DOWN, world.now)
                    continue
                found = world.entries(action.after)
            batch.read(found)
        elif isinstance(action, Wait):
            world.now += action.seconds
        elif isinstance(action, Fail):
            raise action.error
        else:
            return out


@pytest.mark.parametrize("seed", range(5))
def test_every_index_arrives_once_across_outages(seed: int) -> None:
    outages = [(1.0, 3.5), (6.0, 6.3), (8.0, 12.0)]
    world = World(random.Random(seed), outages)
    tasks = [task(n) for n in range(100)]
    batch = Batch("b", window=8, timeout_s=60)
    out = drive(batch, tasks, world)
    assert sorted(o["index"] for o in out) == list(range(100))
    assert all(o["status"] == "solved" for o in out)
    assert sorted(world.sent) == list(range(100))  # each queued once
    assert world.hit == set(outages)  # each outage was met, and lived through
    assert [o["index"] for o in out] != list(range(100))  # completion order
    assert batch.close() == Abandon("b", cancel=False, unanswered=0)
