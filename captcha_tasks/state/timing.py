"""Observed solve times, kept per method in Redis.

Every finished captcha's solve time is recorded by the completion script (:data:`TIMES`:
the last :data:`SAMPLE_WINDOW` per method); :class:`SolveTimes` reads a method's samples at
most once per :data:`FRESH_FOR_S` and hands them to :func:`captcha_tasks.core.timing.figures`,
which says when its captchas are worth polling.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..core.timing import Timing, TimingConfig, figures
from .db import Db
from .keys import Keys
from .lua import text

#: Seconds a process reuses the figures it read.
FRESH_FOR_S = 1.0
#: Solve-time samples kept per method (``times.WINDOW`` in ``lib/times.lua``).
SAMPLE_WINDOW = 200


def times_keys(keys: Keys, method: str) -> dict[str, str]:
    """The keys of ``lib/times.lua`` for one method."""
    return {"solve_times": keys.solve_times(method)}


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
