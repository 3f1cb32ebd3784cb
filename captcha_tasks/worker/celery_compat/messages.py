"""What a task message is to the worker, where the package needs more than public API.

A solve's message ends long before the solve does (``captcha_tasks.worker.tasks``): the
worker must neither store a result nor announce a success when its ``solve`` task
returns.  Each class and function here names the Celery behaviour it depends on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Task
from celery.app.control import Control as CeleryControl
from celery.exceptions import Reject
from celery.worker.request import Request

#: What a solve message returns (the worker's log line says so): the outcome comes later.
HANDED_OVER = "handed over: the outcome is stored when the solve ends"
#: The worker bootstep that owns the worker's timer (a bootstep's ``requires``).
TIMER_STEP = "celery.worker.components:Timer"


class HandedOverRequest(Request):
    """The worker's request of a solve message.  A solve message's end is not the solve's
    end: the completion announces that (``task-succeeded``, ``task-failed`` or
    ``task-revoked``).  The worker's own success event at the message's end would show
    Flower a solve that has only begun as succeeded, so it is not sent; every other event
    is."""

    # Celery: a task's ``Request`` class (``Task.Request``) sends the task's events through
    # ``send_event``; the worker sends task-succeeded from ``Request.on_success``.
    def send_event(self, type: str, **fields: Any) -> None:
        if type != "task-succeeded":
            super().send_event(type, **fields)


def hand_over(request: Any) -> str:
    """End a solve message without ending the solve: Celery stores no result at the task's
    return (the completion stores the outcome).  What runs after the solve never reaches
    Celery's tracer: it travels in the solve's own arguments (:mod:`.records`).  Celery's
    ``Ignore`` would do the same at a third of the worker's CPU: it formats two tracebacks
    per message."""
    # Celery: the tracer computes whether to store the result before the task runs, but
    # the backend's mark_as_done reads the request's ignore_result again at the return.
    request.ignore_result = True
    return HANDED_OVER


class OutageTask(Task):
    """A task that waits out a Redis outage by retrying (``autoretry_for=OUTAGES``), and
    never loses its message doing so.

    Celery's ``Task.retry`` publishes the retry first and, when that fails, rejects the
    message without requeueing it (``Reject(requeue=False)``): during an outage of the
    Redis that is also the broker, a solve past its admission would be gone.  Here the
    message is rejected *with* requeue instead: put back at once if the broker answers
    again, else left unacknowledged in the broker, which hands it out again after the
    visibility timeout (the same message: its admission knows it)."""

    # Celery: Task.retry raises Reject(exc, requeue=False) when publishing the retry fails.
    def retry(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().retry(*args, **kwargs)
        except Reject as exc:
            if exc.requeue:
                raise
            raise Reject(exc.reason, requeue=True) from exc


class Control(CeleryControl):
    """Celery's remote control, and one thing more: a revoked task id is handed to the
    app's ``remember_revoked`` (when it has one) before the broadcast, so that no worker
    submits a revoked solve, whether or not it heard the broadcast (a parked solve's
    message ran long ago; a worker started after the revoke never hears it)."""

    # Celery: AsyncResult.revoke() and `celery control revoke` call app.control.revoke;
    # an app's control class is its ``control_cls``.
    def revoke(self, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        remember = getattr(self.app, "remember_revoked", None)
        if remember is not None:
            remember([task_id] if isinstance(task_id, str) else [str(i) for i in task_id])
        return super().revoke(task_id, *args, **kwargs)


def send_task_event(worker: Any, type_: str, task_id: str, **fields: Any) -> None:
    """Send a task event for ``task_id`` from ``worker`` (None: no worker in this process),
    when a monitor (Flower) turned its events on: a solve ends in another task than its
    own, so its end is announced by hand."""
    # Celery: the worker's consumer holds the event dispatcher that `celery control
    # enable_events` (Flower) turns on; task events carry the task id as ``uuid``.
    consumer = getattr(worker, "consumer", None)
    dispatcher = getattr(consumer, "event_dispatcher", None)
    if dispatcher is not None and dispatcher.enabled:
        dispatcher.send(type_, uuid=task_id, **fields)


def keep_repeating(
    worker: Any, entry: Any, seconds: float, fun: Callable[..., Any], args: tuple[Any, ...]
) -> Any:
    """Call ``fun(*args)`` every ``seconds`` on ``worker``'s timer, unless ``entry`` (what
    this returned before) is on it still; returns the timer's entry."""
    # Celery: the worker's timer is kombu's Timer (``worker.timer``, from TIMER_STEP); its
    # ``queue`` lists the scheduled items, each with its ``entry``.  Celery 5.6 empties the
    # whole timer when the broker connection drops (5.7 only what its consumer put there).
    timer = worker.timer
    if entry is not None:
        if any(scheduled.entry is entry for scheduled in timer.queue):
            return entry
        entry.cancel()
    return timer.call_repeatedly(seconds, fun, args, priority=10)
