"""How long a view of another client's threads holds: past the checks that may come late
(one per housekeeping tick at most), never a lapse between two on a busy worker."""

from __future__ import annotations

import pytest

from captcha_tasks.worker.housekeeping import (
    TICK_S,
    VIEW_HOLD_MIN_S,
    VIEW_HOLDS_CHECKS,
    view_hold_s,
)

pytestmark = pytest.mark.unit


def test_checks_faster_than_the_tick_hold_by_the_tick() -> None:
    # CAPTCHAAI_THREADS_CHECK_EVERY=0.5: a check comes once a tick (1 s); the view held
    # 1.5 s before, and lapsed when one check was half a second late.
    assert view_hold_s(0.5) >= VIEW_HOLDS_CHECKS * TICK_S
    assert view_hold_s(0.5) == VIEW_HOLD_MIN_S


def test_slow_checks_hold_three_of_them() -> None:
    assert view_hold_s(30.0) == 90.0
