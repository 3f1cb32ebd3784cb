"""Streaming batch results: each outcome as soon as whichever worker finished it.

:func:`stream` queues ``solve`` tasks a window at a time and yields one outcome dict per
task, in completion order, each with its ``index`` in the input.  Workers append every
outcome of a batch to one Redis stream (in the completion path); the caller blocks on
``XREAD`` of that stream, so results arrive through Redis from any worker without polling
each ``AsyncResult``.  An abandoned stream (the caller stops iterating, or Ctrl-C) marks
the batch cancelled: its queued solves and queued or parked submits then end without
calling the API (and without taking pooled tokens), while captchas already at the
provider are still polled to the end so their threads are given back.  Celery's own
``revoke`` is not used for this: it would also drop the polls of captchas already paid
for.

A Redis outage once the batch has started (a restart, a failover) is ridden out: the
stream waits, with back-off, and goes on where it was when Redis is back; only tasks whose
result is overdue meanwhile fail (``ERROR_SOLVE_TIMEOUT``).  Redis down at the very first
task raises :class:`~captcha_tasks.errors.StoreUnavailable` at once.

Writes can be lost with a master (a failover; a restart without ``appendfsync always``),
so the stream recovers what only it still knows: when the master changed, it reads the
batch's stream from its start again (entries it has are skipped), and every
:data:`TRACE_EVERY_S` it sends again, under the same task id, each pending task of which
Redis has no trace left (no queued message noted, no claim, no record, not parked): its
message was lost before any worker took it.  A copy that was not lost after all is
stopped by the solve's record.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kombu.exceptions import OperationalError

from . import errors
from .connections import FAILOVERS
from .outcome import Failed
from .state.batches import BatchStreams
from .state.records import Records
from .worker.app import app
from .worker.tasks import solve

log = logging.getLogger(__name__)

READ_BLOCK_MS = 500
#: Seconds between looks for pending tasks of which Redis lost every trace (and the age a
#: task must have to be looked at).
TRACE_EVERY_S = 5.0
#: Seconds between looks while Redis is unreachable: from the first, doubling to the last.
OUTAGE_WAIT_S = (0.2, 2.0)


class Outage:
    """Waits out a Redis outage with back-off, saying so once per outage."""

    def __init__(self) -> None:
        self.wait_s: float | None = None

    def wait(self, exc: Exception) -> None:
        time.sleep(self.next_wait(exc))  # back-off between attempts while Redis is away

    def next_wait(self, exc: Exception) -> float:
        """Seconds to wait before the next attempt (said once per outage)."""
        if self.wait_s is None:
            log.warning("Redis is unavailable (%s); the batch waits for it", exc)
            self.wait_s = OUTAGE_WAIT_S[0]
        wait_s = self.wait_s
        self.wait_s = min(OUTAGE_WAIT_S[1], self.wait_s * 2)
        return wait_s

    def over(self) -> None:
        if self.wait_s is not None:
            log.warning("Redis is back; the batch goes on")
            self.wait_s = None


@dataclass
class Pending:
    task_id: str
    method: str | None
    sent_at: float
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    """A batch's bookkeeping, without I/O (shared with :func:`captcha_tasks.aio.stream`)."""

    batch_id: str
    timeout: float
    pending: dict[int, Pending] = field(default_factory=dict)
    last_id: str = "0-0"
    queued: int = 0
    #: :data:`FAILOVERS`' generation when the stream was last read from the start.
    generation: int = 0
    looked_at: float = field(default_factory=time.monotonic)

    def sent(
        self, index: int, task_id: str, method: str | None, kwargs: Mapping[str, Any] = {}
    ) -> None:
        self.pending[index] = Pending(task_id, method, time.monotonic(), kwargs)
        self.queued += 1

    def master_moved(self, generation: int) -> bool:
        """Whether the master moved since the last call: then the stream is read from its
        start again (the new master's entries may sort before the old one's)."""
        if generation == self.generation:
            return False
        self.generation, self.last_id = generation, "0-0"
        return True

    def look_due(self, every_s: float) -> bool:
        """Whether ``every_s`` passed since pending tasks were last looked at."""
        return time.monotonic() - self.looked_at >= every_s

    def to_look_at(self, age_s: float) -> list[Pending]:
        """Pending tasks at least ``age_s`` old (noting that they were looked at now)."""
        now = self.looked_at = time.monotonic()
        return [p for p in self.pending.values() if now - p.sent_at >= age_s]

    def arrived(self, found: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """The outcomes among stream entries ``found`` that this batch still waits for."""
        out = []
        for entry_id, outcome in found:
            self.last_id = entry_id
            if self.pending.pop(outcome["index"], None) is not None:
                out.append(outcome)
        return out

    def timed_out(self) -> list[dict[str, Any]]:
        """Failed outcomes for the tasks whose results are overdue (forgotten here)."""
        now = time.monotonic()
        late = [i for i, p in self.pending.items() if now - p.sent_at > self.timeout]
        out = []
        for index in late:
            pending = self.pending.pop(index)
            exc = errors.SolveTimeout(f"no result within {self.timeout:.0f}s")
            out.append({**Failed.from_exception(exc, pending.method).to_dict(), "index": index})
        return out

    def next_deadline(self) -> float | None:
        """Seconds until the first pending task times out (None when nothing is pending)."""
        if not self.pending:
            return None
        first = min(p.sent_at for p in self.pending.values())
        return first + self.timeout - time.monotonic()


def rejected(index: int, task: Mapping[str, Any], exc: errors.ValidationError) -> dict[str, Any]:
    """The failed outcome of a task that ``solve`` refused at the call site."""
    return {**Failed.from_exception(exc, task.get("method")).to_dict(), "index": index}


def stream(
    tasks: Iterable[Mapping[str, Any]],
    *,
    timeout_per_task: float | None = None,
    window: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Solve ``tasks`` (dicts of ``solve`` keyword arguments) and yield each outcome dict,
    with its input ``index``, in completion order.

    A failed task yields ``{"status": "failed", "error": CODE, ...}`` and the stream goes
    on.  ``window`` bounds the tasks queued at once (default: twice the usable threads —
    one set in flight at the provider, one parked and ready to take a freed thread).
    ``timeout_per_task`` (default: the solve timeout plus a minute) fails a task whose
    result never arrives.
    """
    runtime = app.runtime()
    settings, streams = runtime.settings, runtime.state.batches
    failovers = runtime.state.failovers
    size = window or 2 * settings.capacity
    if size < 1:
        raise errors.ValidationError("window must be at least 1")
    batch = Batch(uuid.uuid4().hex, timeout_per_task or settings.solve_timeout + 60)
    batch.generation = FAILOVERS.generation
    records = runtime.state.records
    source = enumerate(tasks)
    backlog: deque[tuple[int, Mapping[str, Any]]] = deque()  # not queued for an outage
    outage = Outage()
    exhausted = False
    try:
        while True:
            while len(batch.pending) < size:
                item = backlog.popleft() if backlog else None
                if item is None and not exhausted:
                    item = next(source, None)
                    exhausted = item is None
                if item is None:
                    break
                try:
                    failure = _queue(batch, *item)
                except errors.StoreUnavailable as exc:
                    if not batch.queued:
                        raise  # down from the start: the caller hears it at once
                    backlog.appendleft(item)
                    outage.wait(exc)
                    break
                if failure is not None:
                    yield failure
            if exhausted and not backlog and not batch.pending:
                return
            try:
                moved = batch.master_moved(FAILOVERS.generation)
                found = _read(streams, batch)
                recover_lost(records, batch, moved)
            except errors.StoreUnavailable as exc:
                outage.wait(exc)
            else:
                outage.over()
                failovers.report("app")
                yield from found
            yield from batch.timed_out()
    finally:
        _abandon(streams, batch)


def _queue(batch: Batch, index: int, task: Mapping[str, Any]) -> dict[str, Any] | None:
    task_id = str(uuid.uuid4())
    kwargs = {**task, "_batch": {"id": batch.batch_id, "index": index}}
    try:
        solve.apply_async(kwargs=kwargs, task_id=task_id)
    except errors.ValidationError as exc:
        return rejected(index, task, exc)
    except OperationalError:
        # The broker refused the message after Redis took note of it: housekeeping sends
        # it again, under this id (see SolveTask.apply_async).
        log.warning("task %d: the broker is unavailable; its message will be sent again", index)
    batch.sent(index, task_id, task.get("method"), kwargs)
    return None


def recover_lost(records: Records, batch: Batch, moved: bool) -> None:
    """Send again the pending tasks of which Redis has no trace (see the module's doc):
    every :data:`TRACE_EVERY_S`, and at once after a master move."""
    if not (moved or batch.look_due(TRACE_EVERY_S)):
        return
    candidates = batch.to_look_at(TRACE_EVERY_S)
    if not candidates:
        return
    lost = set(records.traceless([p.task_id for p in candidates]))
    for pending in candidates:
        if pending.task_id in lost:
            log.warning("task %s: Redis lost its every trace; sending it again", pending.task_id)
            try:
                solve.apply_async(kwargs=dict(pending.kwargs), task_id=pending.task_id)
            except OperationalError:
                log.warning("task %s: the broker is unavailable; later", pending.task_id)


def _read(streams: BatchStreams, batch: Batch) -> list[dict[str, Any]]:
    """The outcomes that arrived (waiting up to :data:`READ_BLOCK_MS` for the first)."""
    found = streams.read(batch.batch_id, batch.last_id, block_ms=READ_BLOCK_MS)
    outcomes = batch.arrived(found)
    if found:
        try:
            streams.trim(batch.batch_id, batch.last_id)
        except errors.StoreUnavailable:  # read already: trimmed with the next ones
            log.debug("could not trim batch %s", batch.batch_id)
    return outcomes


def _abandon(streams: BatchStreams, batch: Batch) -> None:
    if not batch.queued:
        return  # nothing was sent (Redis down at the first task, say): nothing to cancel
    try:
        streams.abandon(batch.batch_id, cancel=bool(batch.pending))
        if batch.pending:
            log.info("batch %s abandoned: %d tasks cancelled", batch.batch_id, len(batch.pending))
    except errors.StoreUnavailable as exc:  # the caller sees the outage itself, once
        log.warning("could not cancel batch %s: %s", batch.batch_id, exc)
    except Exception:  # never hide the caller's own exception (Ctrl-C) behind ours
        log.warning("could not cancel batch %s", batch.batch_id, exc_info=True)
