"""The batch core (captcha_tasks.core.batching) on its own: no Redis, no worker, an injected
clock.  Each test tells a :class:`Batch` what happened and checks what it decides."""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from captcha_tasks import errors
from captcha_tasks.core.batching import (
    MAX_BLOCK_S,
    OUTAGE_WAIT_S,
    SETTLE_S,
    TRACE_EVERY_S,
    Abandon,
    AllAnswered,
    Batch,
    Emit,
    Look,
    ProtocolError,
    Pull,
    Raise,
    ReadStream,
    Resend,
    Send,
    Wait,
    solve_kwargs,
)
from captcha_tasks.core.batching import (
    task_id as batch_task_id,
)

pytestmark = pytest.mark.unit

DOWN = errors.StoreUnavailable("Redis is down or REDIS_URL is wrong (REDIS_URL=redis://:***@h:1/0)")


def task(n: int = 0, method: str = "turnstile") -> dict[str, Any]:
    return {"method": method, "sitekey": f"k{n}", "pageurl": "https://example.com"}


def solved(index: int) -> dict[str, Any]:
    return {"status": "solved", "method": "turnstile", "token": f"t{index}", "index": index}


def entry(n: int, index: int) -> tuple[str, dict[str, Any]]:
    return (f"{n}-0", solved(index))


def tid(index: int) -> str:
    """The task id a driver gave task ``index`` (any string will do)."""
    return f"id-{index}"


def fill(batch: Batch, now: float, tasks: int) -> list[int]:
    """Pull and send until the batch asks for something else; returns the indexes sent."""
    sent = []
    for n in range(tasks):
        action = batch.next_action(now)
        assert action == Pull()
        batch.pulled(task(n))
        action = batch.next_action(now)
        assert isinstance(action, Send)
        batch.sent(tid(action.index), now)
        sent.append(action.index)
    return sent


def test_queues_a_window_then_reads() -> None:
    batch = Batch("b", window=2, timeout_s=60)
    assert fill(batch, 0.0, 2) == [0, 1]
    action = batch.next_action(0.0)
    assert action == ReadStream("0-0", int(MAX_BLOCK_S * 1000) + 1)  # window full: no third task
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
    # it wakes in time for the first look at task 1 (sent at 0)
    assert batch.next_action(1.0) == ReadStream("8-0", int((TRACE_EVERY_S - 1.0) * 1000) + 1)
    batch.read([entry(9, 1)])
    assert batch.next_action(1.5) == Emit((solved(1),))
    assert batch.next_action(1.5) == AllAnswered()
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
    batch.sent(tid(1), 1.0)
    read = batch.next_action(1.5)
    assert read == ReadStream("0-0", 1501)  # wakes for the first deadline (3.0), not later
    batch.read([])
    late = batch.next_action(3.0)
    assert isinstance(late, Emit)
    assert [(o["index"], o["error"]) for o in late.outcomes] == [(0, "ERROR_SOLVE_TIMEOUT")]
    batch.next_action(3.0)  # Pull: room again
    batch.ended()
    assert batch.next_action(3.0) == ReadStream("0-0", 1001)
    batch.read([entry(1, 0), entry(2, 1)])  # 0 came after all: dropped
    assert batch.next_action(3.1) == Emit((solved(1),))
    assert batch.next_action(3.1) == AllAnswered()


def test_redis_down_before_anything_was_queued_fails_at_once() -> None:
    batch = Batch("b", window=4, timeout_s=60)
    batch.next_action(0.0)
    batch.pulled(task())
    batch.next_action(0.0)
    batch.unavailable(DOWN, 0.0)
    assert batch.next_action(0.0) == Raise(DOWN)
    assert batch.close() is None  # nothing to cancel


def test_an_outage_is_ridden_out_with_back_off_and_the_same_task_is_sent_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "captcha_tasks.core.batching")
    batch = Batch("b", window=3, timeout_s=60, trace_every_s=60)  # no look in the way
    fill(batch, 0.0, 1)
    assert batch.next_action(0.0) == Pull()
    batch.pulled(task(1))
    first = batch.next_action(0.0)
    assert first == Send(1, task(1))
    assert isinstance(first, Send) and first.task_id == batch_task_id("b", 1)
    batch.unavailable(DOWN, 0.0)
    now, waits = 0.0, []
    for _ in range(6):
        action = batch.next_action(now)
        assert isinstance(action, Wait)
        waits.append(round(action.seconds, 3))
        now += action.seconds
        again = batch.next_action(now)
        assert again == Send(1, task(1))  # the same task, the same index
        # ... under the same task id: a try that reached Redis before failing is this solve
        assert isinstance(again, Send) and again.task_id == first.task_id
        batch.unavailable(DOWN, now)
    assert waits == [OUTAGE_WAIT_S[0], 0.4, 0.8, 1.6, OUTAGE_WAIT_S[1], OUTAGE_WAIT_S[1]]
    now += batch.next_action(now).seconds  # type: ignore[union-attr]
    assert batch.next_action(now) == Send(1, task(1))
    batch.sent(tid(1), now)
    assert batch.next_action(now) == Pull()  # back to normal: no wait
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # once when it went, once when it came back
    assert "Redis is unavailable" in messages[0] and "REDIS_URL=redis://:***@" in messages[0]
    assert "Redis is back" in messages[1]


def test_each_task_of_each_batch_has_an_id_of_its_own() -> None:
    ids = {batch_task_id(batch_id, index) for batch_id in ("b", "c") for index in range(50)}
    assert len(ids) == 100
    assert batch_task_id("b", 7) == batch_task_id("b", 7)
    assert str(uuid.UUID(batch_task_id("b", 7))) == batch_task_id("b", 7)  # a UUID, as Celery's are


def outage_then_back(batch: Batch, index: int, now: float) -> float:
    """Task ``index`` meets Redis down once, then is sent; returns the time it was sent."""
    assert batch.next_action(now) == Pull()
    batch.pulled(task(index))
    assert batch.next_action(now) == Send(index, task(index))
    batch.unavailable(DOWN, now)
    wait = batch.next_action(now)
    assert wait == Wait(pytest.approx(OUTAGE_WAIT_S[0]))  # type: ignore[arg-type]
    now += OUTAGE_WAIT_S[0]
    assert batch.next_action(now) == Send(index, task(index))
    batch.sent(tid(index), now)
    return now


@pytest.mark.parametrize(
    ("again_after", "lines"),
    [(SETTLE_S / 2, 2), (SETTLE_S + 0.1, 4)],
    ids=["while-it-settles", "later"],
)
def test_a_failure_soon_after_redis_answered_is_the_same_outage(
    caplog: pytest.LogCaptureFixture, again_after: float, lines: int
) -> None:
    """After a restart a driver meets its stale connections one by one: Redis answers on
    one and fails on the next.  That is one outage, said once; a failure later is another."""
    caplog.set_level(logging.INFO, "captcha_tasks.core.batching")
    batch = Batch("b", window=5, timeout_s=60, trace_every_s=60)
    fill(batch, 0.0, 1)
    back = outage_then_back(batch, 1, 0.0)
    outage_then_back(batch, 2, back + again_after)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == lines, messages
    assert ["unavailable" in m for m in messages] == [n % 2 == 0 for n in range(lines)]


def test_a_failed_read_waits_then_reads_from_where_it_was() -> None:
    batch = Batch("b", window=1, timeout_s=60)
    fill(batch, 0.0, 1)
    batch.next_action(0.0)
    batch.read([entry(3, 0)])
    batch.next_action(0.0)  # Emit
    batch.next_action(0.0)  # Pull
    batch.pulled(task(1))
    batch.next_action(0.0)
    batch.sent(tid(1), 0.0)
    assert batch.next_action(0.0) == ReadStream("3-0", int(MAX_BLOCK_S * 1000) + 1)
    batch.unavailable(DOWN, 0.0)
    assert batch.next_action(0.1) == Wait(pytest.approx(0.1))  # type: ignore[arg-type]
    assert batch.next_action(0.2) == ReadStream("3-0", int((TRACE_EVERY_S - 0.2) * 1000) + 1)


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
        elif isinstance(action, Send | ReadStream | Look):
            batch.unavailable(DOWN, now)
        elif isinstance(action, Emit):
            emitted += action.outcomes
        else:
            break
    assert [(o["index"], o["error"]) for o in emitted] == [(0, "ERROR_SOLVE_TIMEOUT")]
    assert isinstance(action, Raise) and isinstance(action.error, errors.StoreUnavailable)
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
        batch.sent(tid(0), 0.0)
    assert batch.next_action(0.0) == Pull()
    with pytest.raises(ProtocolError):
        batch.read([])
    batch.pulled(task())
    batch.next_action(0.0)
    batch.sent(tid(0), 0.0)
    with pytest.raises(ProtocolError):
        batch.sent(tid(0), 0.0)  # reported twice
    with pytest.raises(ProtocolError):
        batch.looked([], 0.0)
    with pytest.raises(ProtocolError):
        batch.resent()


def test_the_batch_defaults_go_to_every_task_that_names_none() -> None:
    batch = Batch("b", window=2, timeout_s=60, defaults={"lane": "background", "tenant": "shop"})
    sent = []
    for own in ({}, {"tenant": "crawler"}):
        assert batch.next_action(0.0) == Pull()
        batch.pulled({**task(), **own})
        action = batch.next_action(0.0)
        assert isinstance(action, Send)
        sent.append(action.task)
        batch.sent(tid(action.index), 0.0)
    assert [(t["lane"], t["tenant"]) for t in sent] == [
        ("background", "shop"),
        ("background", "crawler"),  # a task's own wins
    ]


@pytest.mark.parametrize(
    ("window", "timeout", "message"),
    [(0, 60, "window must be at least 1"), (1, 0, "timeout_per_task must be positive")],
)
def test_bad_arguments(window: int, timeout: float, message: str) -> None:
    with pytest.raises(errors.ValidationError, match=message):
        Batch("b", window=window, timeout_s=timeout)


# -- what a master change lost -----------------------------------------------------------------


def test_pending_tasks_are_looked_at_every_interval_once_they_are_old_enough() -> None:
    batch = Batch("b", window=3, timeout_s=60)
    fill(batch, 0.0, 1)
    assert batch.next_action(3.0) == Pull()
    batch.pulled(task(1))
    batch.next_action(3.0)
    batch.sent(tid(1), 3.0)
    assert batch.next_action(3.0) == Pull()
    batch.ended()
    # the read wakes when task 0 is old enough to be looked at, not at its deadline
    wake = TRACE_EVERY_S - 3.0
    assert batch.next_action(3.0) == ReadStream("0-0", int(wake * 1000) + 1)
    batch.read([])
    assert batch.next_action(TRACE_EVERY_S) == Look((tid(0),))  # task 1 is too young
    batch.looked([], TRACE_EVERY_S)
    assert isinstance(batch.next_action(TRACE_EVERY_S), ReadStream)  # nothing lost: no re-send
    batch.read([])
    assert isinstance(batch.next_action(2 * TRACE_EVERY_S - 0.1), ReadStream)  # not due yet
    batch.read([])
    assert batch.next_action(2 * TRACE_EVERY_S) == Look((tid(0), tid(1)))


def test_a_traceless_task_is_sent_again_under_its_id_with_its_arguments() -> None:
    batch = Batch("b", window=3, timeout_s=30)
    fill(batch, 0.0, 3)
    now = TRACE_EVERY_S
    assert batch.next_action(now) == Look((tid(0), tid(1), tid(2)))
    batch.looked([tid(2), "id-of-another-batch", tid(0)], now)
    # in the batch's order, with what solve() was first given, the index included
    assert batch.next_action(now) == Resend(tid(0), solve_kwargs("b", 0, task(0)))
    assert solve_kwargs("b", 0, task(0)) == {**task(0), "_batch": {"id": "b", "index": 0}}
    batch.resent()
    assert batch.next_action(now) == Resend(tid(2), solve_kwargs("b", 2, task(2)))
    batch.resent()
    assert isinstance(batch.next_action(now), ReadStream)
    batch.read([entry(1, 2)])
    assert batch.next_action(now) == Emit((solved(2),))
    # a re-send does not move the task's deadline: the caller's timeout counts from the
    # first send
    batch.next_action(now)  # Pull
    batch.ended()
    batch.next_action(now)
    batch.read([])
    late = batch.next_action(30.0)
    assert isinstance(late, Emit)
    assert [o["index"] for o in late.outcomes] == [0, 1]


def test_a_task_answered_before_its_turn_to_be_sent_again_is_not() -> None:
    batch = Batch("b", window=2, timeout_s=6)
    fill(batch, 0.0, 2)
    assert batch.next_action(TRACE_EVERY_S) == Look((tid(0), tid(1)))
    batch.looked([tid(0), tid(1)], TRACE_EVERY_S)
    assert batch.next_action(TRACE_EVERY_S) == Resend(tid(0), solve_kwargs("b", 0, task(0)))
    batch.resent()
    # task 1 timed out before its re-send was carried out: it is not sent
    late = batch.next_action(6.0)
    assert isinstance(late, Emit)
    assert batch.next_action(6.0) == Pull()


def test_a_master_move_rereads_the_stream_from_the_start_once_and_looks_at_once() -> None:
    batch = Batch("b", window=2, timeout_s=60, generation=4)
    fill(batch, 0.0, 2)
    batch.next_action(0.0)
    batch.read([entry(7, 1)])
    assert batch.next_action(1.0) == Emit((solved(1),))
    batch.next_action(1.0)
    batch.ended()
    batch.saw_master(4)  # the generation it started with: nothing moved
    assert batch.next_action(1.0) == ReadStream("7-0", 4001)
    batch.read([])
    batch.saw_master(5)
    # pending tasks old enough are looked at at once, whatever the interval
    assert batch.next_action(TRACE_EVERY_S + 0.5) == Look((tid(0),))
    batch.looked([], TRACE_EVERY_S + 0.5)
    # the new master's entries may sort before the old one's: from the start, and what
    # was emitted already is skipped
    assert batch.next_action(TRACE_EVERY_S + 0.5) == ReadStream("0-0", int(MAX_BLOCK_S * 1000) + 1)
    batch.read([entry(3, 0), entry(5, 1)])
    assert batch.next_action(6.0) == Emit((solved(0),))
    batch.saw_master(5)  # seen already: once per move
    assert batch.next_action(6.0) == AllAnswered()


def test_a_move_with_nothing_old_enough_looks_when_the_oldest_is() -> None:
    batch = Batch("b", window=1, timeout_s=60)
    fill(batch, 0.0, 1)
    batch.saw_master(1)
    assert batch.next_action(1.0) == ReadStream("0-0", int((TRACE_EVERY_S - 1.0) * 1000) + 1)
    batch.read([])
    assert batch.next_action(TRACE_EVERY_S) == Look((tid(0),))


def test_an_outage_during_a_look_or_a_resend_looks_again_once_redis_is_back() -> None:
    batch = Batch("b", window=2, timeout_s=60)
    fill(batch, 0.0, 2)
    now = TRACE_EVERY_S
    assert batch.next_action(now) == Look((tid(0), tid(1)))
    batch.unavailable(DOWN, now)
    wait = batch.next_action(now)
    assert isinstance(wait, Wait)
    now += wait.seconds
    assert batch.next_action(now) == Look((tid(0), tid(1)))  # not lost to the outage
    batch.looked([tid(0), tid(1)], now)
    assert batch.next_action(now) == Resend(tid(0), solve_kwargs("b", 0, task(0)))
    batch.unavailable(DOWN, now)
    wait = batch.next_action(now)
    assert isinstance(wait, Wait)
    now += wait.seconds
    # what was traceless before the outage is asked again, not taken on trust
    assert batch.next_action(now) == Look((tid(0), tid(1)))
    batch.looked([tid(1)], now)
    assert batch.next_action(now) == Resend(tid(1), solve_kwargs("b", 1, task(1)))
    batch.resent()
    assert isinstance(batch.next_action(now), ReadStream)


# -- whole batches against a simulated Redis and workers ------------------------------------

#: Seconds of writes a master change loses: what the old master took last.
LAG_S = 0.5


@dataclass
class World:
    """Workers finishing each queued task after a random time; Redis unreachable in the
    given windows of time; master changes (``moves``) that lose the last :data:`LAG_S` of
    writes (solve messages, records, stream entries) and number the new master's stream
    entries on from the last one it kept."""

    rng: random.Random
    outages: list[tuple[float, float]]
    moves: list[float] = field(default_factory=list)
    now: float = 0.0
    generation: int = 0
    hit: set[tuple[float, float]] = field(default_factory=set)
    #: task id -> (index, written at, done at): a message a worker has or will have
    working: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    #: task id -> (index, written at): the solve's record
    records: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: (entry number, index, written at)
    stream: list[tuple[int, int, float]] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    resent: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)

    def down(self) -> bool:
        hit = {(start, end) for start, end in self.outages if start <= self.now < end}
        self.hit |= hit
        return bool(hit)

    def queue(self, index: int, task_id: str) -> None:
        self.working[task_id] = (index, self.now, self.now + self.rng.uniform(0.1, 3.0))

    def advance(self) -> None:
        """Let what happened up to now happen, in order."""
        while True:
            done = min(((at, t) for t, (_, _, at) in self.working.items()), default=None)
            move = self.moves[0] if self.moves else None
            if move is not None and move <= self.now and (done is None or move <= done[0]):
                self._move(self.moves.pop(0))
            elif done is not None and done[0] <= self.now:
                at, task_id = done
                index, _, _ = self.working.pop(task_id)
                self.records[task_id] = (index, at)
                number = self.stream[-1][0] + 1 if self.stream else 1
                self.stream.append((number, index, at))
            else:
                return

    def _move(self, at: float) -> None:
        cut = at - LAG_S
        for task_id, (index, written, _) in list(self.working.items()):
            if written >= cut:
                del self.working[task_id]
                self.lost.append(index)
        for task_id, (index, written) in list(self.records.items()):
            if written >= cut:
                del self.records[task_id]
                self.lost.append(index)
        self.stream = [e for e in self.stream if e[2] < cut]
        self.generation += 1

    def traceless(self, task_ids: tuple[str, ...]) -> list[str]:
        return [t for t in task_ids if t not in self.working and t not in self.records]

    def entries(self, after: str) -> list[tuple[str, dict[str, Any]]]:
        seen = int(after.split("-")[0])
        return [(f"{n}-0", solved(i)) for n, i, _ in self.stream if n > seen]

    def upcoming(self) -> list[float]:
        """When something happens next (a solve ends, Redis goes, the master moves)."""
        ends = [at for _, _, at in self.working.values() if at > self.now]
        starts = [start for start, _ in self.outages if start > self.now]
        return ends + starts + [m for m in self.moves if m > self.now]


def drive(batch: Batch, tasks: list[dict[str, Any]], world: World) -> list[dict[str, Any]]:
    """A driver like stream()'s, on the simulated world and clock."""
    source, out = iter(tasks), []
    while True:
        world.advance()
        batch.saw_master(world.generation)
        action = batch.next_action(world.now)
        if isinstance(action, Emit):
            out += action.outcomes
        elif isinstance(action, Pull):
            nxt = next(source, None)
            batch.ended() if nxt is None else batch.pulled(nxt)
        elif isinstance(action, Send | Look | Resend) and world.down():
            batch.unavailable(DOWN, world.now)
        elif isinstance(action, Send):
            world.sent.append(action.index)
            world.queue(action.index, tid(action.index))
            batch.sent(tid(action.index), world.now)
            world.now += 0.001
        elif isinstance(action, Look):
            batch.looked(world.traceless(action.task_ids), world.now)
        elif isinstance(action, Resend):
            index = action.kwargs["_batch"]["index"]
            world.resent.append(index)
            world.queue(index, action.task_id)
            batch.resent()
        elif isinstance(action, ReadStream):
            read(batch, action, world)
        elif isinstance(action, Wait):
            world.now += action.seconds
        elif isinstance(action, Raise):
            raise action.error
        else:
            return out


def read(batch: Batch, action: ReadStream, world: World) -> None:
    if world.down():
        batch.unavailable(DOWN, world.now)
        return
    found = world.entries(action.after)
    if not found:  # blocks until an entry comes, the block ends, Redis goes or moves
        world.now = min([world.now + action.block_ms / 1000, *world.upcoming()])
        world.advance()
        if world.down():
            batch.unavailable(DOWN, world.now)
            return
        found = world.entries(action.after)
    batch.read(found)


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
    assert world.resent == []  # nothing was lost: nothing sent again
    assert world.hit == set(outages)  # each outage was met, and lived through
    assert [o["index"] for o in out] != list(range(100))  # completion order
    assert batch.close() == Abandon("b", cancel=False, unanswered=0)


@pytest.mark.parametrize("seed", range(5))
def test_every_index_arrives_once_across_master_moves_that_lose_writes(seed: int) -> None:
    moves = [2.0, 9.0, 9.3]  # the last two: a switch, then a kill of the new master
    world = World(random.Random(seed), outages=[(9.0, 10.0)], moves=list(moves))
    tasks = [task(n) for n in range(100)]
    batch = Batch("b", window=8, timeout_s=60)
    out = drive(batch, tasks, world)
    assert world.generation == len(moves)
    assert world.lost, "no write was lost: the test shows nothing"
    assert sorted(o["index"] for o in out) == list(range(100))
    # none timed out: every lost message was sent again, every entry numbered below what
    # the batch had read was read all the same
    assert all(o["status"] == "solved" for o in out), [o for o in out if o["status"] != "solved"]
    assert sorted(world.sent) == list(range(100))
    assert world.resent and set(world.resent) <= set(world.lost)
    assert batch.close() == Abandon("b", cancel=False, unanswered=0)
