"""Solve-time figures: pure arithmetic over samples."""

from __future__ import annotations

import pytest

from captcha_tasks.core.timing import TimingConfig, figures, percentile

pytestmark = pytest.mark.redis

CONFIG = TimingConfig(poll_interval=1.0, min_samples=10, percentile=90.0)


def test_cold_figures_say_whether_the_wait_is_only_a_default() -> None:
    guessed = figures([1.0] * 9, default=15.0, config=CONFIG)
    assert (guessed.warm, guessed.probe, guessed.first_wait) == (False, True, 15.0)
    told = figures([], default=15.0, config=TimingConfig(1.0, 10, 90.0, initial_wait=30.0))
    assert (told.warm, told.probe, told.first_wait) == (False, False, 30.0)


def test_warm_figures_follow_the_samples() -> None:
    samples = [1.2 + i * 0.01 for i in range(61)]  # 1.2 .. 1.8 s
    timing = figures(samples, default=15.0, config=CONFIG)
    ordered = sorted(samples)
    assert timing.warm and not timing.probe
    assert timing.earliest == percentile(ordered, 5)
    assert timing.typical == percentile(ordered, 50)
    assert timing.spread == percentile(ordered, 95) - percentile(ordered, 5)
    assert timing.first_wait == percentile(ordered, 90) - CONFIG.poll_interval / 2
