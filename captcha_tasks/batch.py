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
:data:`~captcha_tasks.core.batching.TRACE_EVERY_S` it sends again, under the same task id, each
pending task of which Redis has no trace left (no queued message noted, no claim, no
record, not parked): its message was lost before any worker took it.  A copy that was not
lost after all is stopped by the solve's record.  After a good read it adds the
reconnects this process counted to the deployment's (``redis_reconnects_total``).

What to do when is decided by :class:`captcha_tasks.core.batching.Batch` (no I/O); this module
is its driver on redis-py, and :func:`captcha_tasks.aio.stream` its driver on asyncio.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kombu.exceptions import OperationalError

from . import errors
from .core.batching import (
    Abandon,
    AllAnswered,
    Batch,
    Emit,
    Look,
    Pull,
    Raise,
    ReadStream,
    Resend,
    Send,
    Wait,
    solve_kwargs,
)
from .core.lanes import check_lane, check_tenant
from .settings import Settings
from .state import State
from .state.batches import BatchStreams
from .state.connections import MASTER_CHANGES
from .worker.app import app
from .worker.tasks import solve

log = logging.getLogger(__name__)


def stream(
    tasks: Iterable[Mapping[str, Any]],
    *,
    timeout_per_task: float | None = None,
    window: int | None = None,
    lane: str | None = None,
    tenant: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Solve ``tasks`` (dicts of ``solve`` keyword arguments) and yield each outcome dict,
    with its input ``index``, in completion order.

    A failed task yields ``{"status": "failed", "error": CODE, ...}`` and the stream goes
    on.  ``window`` bounds the tasks queued at once (default: twice the usable threads —
    one set in flight at the provider, one parked and ready to take a freed thread).
    ``timeout_per_task`` (default: the solve timeout plus a minute) fails a task whose
    result never arrives.  ``lane`` (default ``bulk``) and ``tenant`` (default
    ``default``) apply to every task that does not name its own; an unknown one is a
    :class:`~captcha_tasks.errors.ValidationError` here, before anything is sent.
    """
    runtime = app.runtime()
    batch = new_batch(runtime.settings, window, timeout_per_task, lane=lane, tenant=tenant)
    return _drive(runtime.state, batch, iter(tasks))


def _drive(
    state: State, batch: Batch, source: Iterator[Mapping[str, Any]]
) -> Iterator[dict[str, Any]]:
    """Carry out ``batch``'s decisions until it is done (the generator :func:`stream`
    returns, once its arguments are checked)."""
    streams = state.batches
    try:
        while True:
            batch.saw_master(MASTER_CHANGES.generation)
            action = batch.next_action(time.monotonic())
            if isinstance(action, Emit):
                yield from action.outcomes
            elif isinstance(action, Pull):
                _pull(source, batch)
            elif isinstance(action, Send):
                _send(batch, action)
            elif isinstance(action, ReadStream):
                _read(state, batch, action)
            elif isinstance(action, Look):
                _look(state, batch, action)
            elif isinstance(action, Resend):
                _resend(batch, action)
            elif isinstance(action, Wait):
                time.sleep(action.seconds)  # back-off while Redis is away
            elif isinstance(action, Raise):
                raise action.error
            else:
                assert isinstance(action, AllAnswered)
                return
    finally:
        _abandon(streams, batch.close())


def new_batch(
    settings: Settings,
    window: int | None,
    timeout_per_task: float | None,
    *,
    lane: str | None = None,
    tenant: str | None = None,
) -> Batch:
    """A batch with the defaults of ``settings`` (shared with :func:`captcha_tasks.aio.stream`);
    ``lane`` and ``tenant``, checked here, go to every task that names none."""
    defaults: dict[str, Any] = {}
    if lane is not None:
        defaults["lane"] = check_lane(lane)
    if tenant is not None:
        defaults["tenant"] = check_tenant(tenant, settings.tenants.declared)
    return Batch(
        uuid.uuid4().hex,
        defaults=defaults,
        window=2 * settings.providers.capacity if window is None else window,
        timeout_s=settings.solving.solve_timeout + 60
        if timeout_per_task is None
        else timeout_per_task,
        # A move before the batch started lost none of its writes.
        generation=MASTER_CHANGES.generation,
    )


def send_task(batch_id: str, action: Send) -> str:
    """Queue the task of ``action`` (task ``index`` of batch ``batch_id``) under its task id
    (the same on every try: see :func:`captcha_tasks.core.batching.task_id`) and return it
    (validated by ``solve``: :class:`~captcha_tasks.errors.ValidationError`; Redis down:
    :class:`~captcha_tasks.errors.StoreUnavailable`).  Blocking: the asyncio driver runs
    it on its publisher thread."""
    publish(action.task_id, solve_kwargs(batch_id, action.index, action.task))
    return action.task_id


def publish(task_id: str, kwargs: Mapping[str, Any]) -> None:
    """Send the solve message of ``task_id`` (a first time, or again, under the same id).
    Its outcome is read from the batch's stream, so Celery does not subscribe to it."""
    try:
        with app.backend.unwatched():
            solve.apply_async(kwargs=dict(kwargs), task_id=task_id)
    except OperationalError:
        # The broker refused the message after Redis took note of it: housekeeping sends
        # it again, under its id (see SolveTask.apply_async).
        log.warning("task %s: the broker is unavailable; its message will be sent again", task_id)


def report_reconnects(state: State) -> None:
    """Add this process's reconnects to the deployment's count; kept for the next time
    when Redis is away again (the caller's read went through: it is not told)."""
    try:
        state.master_changes.report("app")
    except errors.StoreUnavailable as exc:
        log.debug("reconnects not reported yet: %s", exc)


def _pull(source: Iterator[Mapping[str, Any]], batch: Batch) -> None:
    try:
        task = next(source)
    except StopIteration:
        batch.ended()
    else:
        batch.pulled(task)


def _send(batch: Batch, action: Send) -> None:
    try:
        task_id = send_task(batch.batch_id, action)
    except errors.ValidationError as exc:
        batch.refused(exc)
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.sent(task_id, time.monotonic())


def _read(state: State, batch: Batch, action: ReadStream) -> None:
    try:
        found = state.batches.read(batch.batch_id, action.after, block_ms=action.block_ms)
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.read(found)
        report_reconnects(state)


def _look(state: State, batch: Batch, action: Look) -> None:
    try:
        lost = state.records.traceless(action.task_ids)
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.looked(lost, time.monotonic())


def _resend(batch: Batch, action: Resend) -> None:
    try:
        publish(action.task_id, action.kwargs)
    except errors.StoreUnavailable as exc:
        batch.unavailable(exc, time.monotonic())
    else:
        batch.resent()


def _abandon(streams: BatchStreams, abandon: Abandon | None) -> None:
    if abandon is None:
        return  # nothing was queued (Redis down at the first task, say): nothing to cancel
    try:
        streams.abandon(abandon.batch_id, cancel=abandon.cancel)
    except Exception as exc:  # never hide the caller's own exception (Ctrl-C) behind ours
        abandon_failed(abandon, exc)
    else:
        abandoned(abandon)


def abandoned(abandon: Abandon) -> None:
    """Log a batch cancelled by its caller (shared by both drivers)."""
    if abandon.cancel:
        log.info("batch %s abandoned: %d tasks cancelled", abandon.batch_id, abandon.unanswered)


def abandon_failed(abandon: Abandon, exc: Exception) -> None:
    """Log, in one line, a batch that could not be cleaned up: the caller sees the cause
    itself (an outage) or is leaving with an exception of its own.  Only an unexpected
    error keeps its traceback."""
    expected = isinstance(exc, errors.CaptchaTasksError)
    log.warning(
        "could not %s batch %s: %s",
        "cancel" if abandon.cancel else "drop the stream of",
        abandon.batch_id,
        exc,
        exc_info=not expected,
    )
