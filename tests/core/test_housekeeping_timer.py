"""Housekeeping's tick stays on the worker's timer: Celery 5.6 empties the whole timer when
the broker connection drops, and the consumer, reconnected, puts the tick back (once).
On kombu's own timer; the restart itself: tests/worker/test_get_outage.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kombu.asynchronous.timer import Timer

from captcha_tasks.worker.housekeeping import Housekeeping, KeepTicking

pytestmark = pytest.mark.unit


def ticks(timer: Timer, step: Housekeeping) -> int:
    return sum(1 for scheduled in timer.queue if scheduled.entry is step.tref)


def test_a_cleared_timer_gets_the_tick_back_once() -> None:
    timer = Timer()
    worker: Any = SimpleNamespace(timer=timer)
    step = Housekeeping.__new__(Housekeeping)  # a step outside a worker's blueprint
    step.tref = None
    step.worker, step.runner = worker, object()
    runtime = SimpleNamespace(housekeeping=step)
    consumer: Any = SimpleNamespace(app=SimpleNamespace(runtime=lambda: runtime))

    step.arm()
    first = step.tref
    assert ticks(timer, step) == 1
    KeepTicking.start(KeepTicking.__new__(KeepTicking), consumer)  # a reconnect: still there
    assert step.tref is first and ticks(timer, step) == 1
    timer.clear()  # what Celery 5.6 does when the broker connection drops
    assert ticks(timer, step) == 0
    KeepTicking.start(KeepTicking.__new__(KeepTicking), consumer)
    assert ticks(timer, step) == 1 and step.tref is not first and first.canceled
    assert len(timer.queue) == 1  # the old entry is gone, not scheduled twice
    timer.stop()
