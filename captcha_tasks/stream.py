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
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import errors
from .outcome import Failed
from .settings import get_settings
from .state import store
from .worker.tasks import solve

log = logging.getLogger(__name__)

READ_BLOCK_MS = 500


@dataclass
class Pending:
    task_id: str
    method: str | None
    sent_at: float


@dataclass
class Batch:
    """A batch's bookkeeping, without I/O (shared with :func:`captcha_tasks.aio.stream`)."""

    batch_id: str
    timeout: float
    pending: dict[int, Pending] = field(default_factory=dict)
    last_id: str = "0-0"
    queued: int = 0

    def sent(self, index: int, task_id: str, method: str | None) -> None:
        self.pending[index] = Pending(task_id, method, time.monotonic())
        self.queued += 1

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
    settings = get_settings()
    size = window or 2 * settings.capacity
    if size < 1:
        raise errors.ValidationError("window must be at least 1")
    batch = Batch(uuid.uuid4().hex, timeout_per_task or settings.solve_timeout + 60)
    source = enumerate(tasks)
    exhausted = False
    try:
        while True:
            while not exhausted and len(batch.pending) < size:
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                failure = _queue(batch, *item)
                if failure is not None:
                    yield failure
            if exhausted and not batch.pending:
                return
            yield from _arrived(batch)
            yield from batch.timed_out()
    finally:
        _abandon(batch)


def _queue(batch: Batch, index: int, task: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        result = solve.apply_async(
            kwargs={**task, "_batch": {"id": batch.batch_id, "index": index}}
        )
    except errors.ValidationError as exc:
        return rejected(index, task, exc)
    batch.sent(index, result.id, task.get("method"))
    return None


def _arrived(batch: Batch) -> Iterator[dict[str, Any]]:
    streams = store.batches()
    found = streams.read(batch.batch_id, batch.last_id, block_ms=READ_BLOCK_MS)
    yield from batch.arrived(found)
    if found:
        streams.trim(batch.batch_id, batch.last_id)


def _abandon(batch: Batch) -> None:
    if not batch.queued:
        return  # nothing was sent (Redis down at the first task, say): nothing to cancel
    try:
        store.batches().abandon(batch.batch_id, cancel=bool(batch.pending))
        if batch.pending:
            log.info("batch %s abandoned: %d tasks cancelled", batch.batch_id, len(batch.pending))
    except errors.StoreUnavailable as exc:  # the caller sees the outage itself, once
        log.warning("could not cancel batch %s: %s", batch.batch_id, exc)
    except Exception:  # never hide the caller's own exception (Ctrl-C) behind ours
        log.warning("could not cancel batch %s", batch.batch_id, exc_info=True)
