"""Observed solve times, and when to poll a captcha first.

Every finished captcha's solve time is kept per method in Redis (the completion script
records it): from its submit to the midpoint between its last "not ready" and the answer
(to the answer when its first poll or its callback had it).  Once enough samples exist:

* the *first wait* (a captcha polled on its own) aims at a high percentile of them minus
  half a poll interval.  The samples of captchas answered at their first poll are upper
  bounds, so this settles where roughly ``100 - percentile`` % of captchas need a second
  poll;
* the *earliest* time worth asking about a captcha in a bulk poll is their 5th percentile;
* the *typical* time is their median;
* the *spread* is the window most of them finish in: their 95th minus their 5th percentile.

Cold, the first three are the method's default wait (or ``CAPTCHAAI_INITIAL_WAIT``), and
``probe`` says whether that wait is only a method's default guess.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..keys import Keys
from .db import Db
from .lua import text

MIN_WAIT = 0.2
#: Seconds a process reuses the figures it read.
FRESH_FOR_S = 1.0
#: Solve-time samples kept per method (``times.WINDOW`` in ``lib/times.lua``).
SAMPLE_WINDOW = 200


def times_keys(keys: Keys, method: str) -> dict[str, str]:
    """The keys of ``lib/times.lua`` for one method."""
    return {"solve_times": keys.solve_times(method)}


@dataclass(frozen=True)
class Timing:
    """When to poll captchas of one method, in seconds after their submit.  ``warm``:
    figured from observed solve times (else the cold default).  ``probe``: cold, and the
    wait is a method's default, not the operator's (``CAPTCHAAI_INITIAL_WAIT``)."""

    first_wait: float
    earliest: float
    typical: float
    warm: bool = False
    spread: float = 0.0
    probe: bool = False


@dataclass(frozen=True)
class TimingConfig:
    poll_interval: float
    min_samples: int
    percentile: float
    #: Overrides every method's default cold wait (``CAPTCHAAI_INITIAL_WAIT``).
    initial_wait: float | None = None


def percentile(sorted_values: list[float], pct: float) -> float:
    """Linear-interpolated percentile of an ascending list."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * pct / 100
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def figures(samples: list[float], default: float, config: TimingConfig) -> Timing:
    """The timing of a method from its samples (any order) and its default wait."""
    cold = config.initial_wait if config.initial_wait is not None else default
    if len(samples) < config.min_samples:
        return Timing(cold, cold, cold, probe=config.initial_wait is None)
    ordered = sorted(samples)
    aim = percentile(ordered, config.percentile) - config.poll_interval / 2
    early, late = percentile(ordered, 5), percentile(ordered, 95)
    typical = percentile(ordered, 50)
    return Timing(max(MIN_WAIT, aim), early, typical, warm=True, spread=late - early)


class SolveTimes:
    """Reads the samples of a method at most once per :data:`FRESH_FOR_S` per instance."""

    def __init__(
        self, db: Db, config: TimingConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.db = db
        self.keys = db.keys
        self.config = config
        self._clock = clock
        self._cache: dict[tuple[str, float], tuple[float, Timing]] = {}

    def timing(self, method: str, default: float) -> Timing:
        """The method's timing, ``default`` being its cold wait."""
        now = self._clock()
        cached = self._cache.get((method, default))
        if cached is not None and cached[0] > now:
            return cached[1]
        value = figures(self.samples(method), default, self.config)
        self._cache[(method, default)] = (now + FRESH_FOR_S, value)
        return value

    def samples(self, method: str) -> list[float]:
        """The recent solve times of ``method``, newest first."""
        r = self.db.redis
        raw = self.db.guard(lambda: r.lrange(self.keys.solve_times(method), 0, -1))
        return [float(text(x)) for x in raw]
