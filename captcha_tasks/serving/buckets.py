"""Token buckets by key (an address, a tenant), bounded and thread-safe: how often a client
may do something, remembered for the most recently seen keys only."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

#: Keys remembered (least recently seen are forgotten first: a forgotten key has a full
#: bucket again).
REMEMBERED = 10_000


class Buckets:
    """One token bucket per key; each call names the bucket's refill ``rate`` (tokens a
    second) and ``burst`` (its size)."""

    def __init__(
        self, remembered: int = REMEMBERED, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.remembered = remembered
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _level(self, key: str, rate: float, burst: float, now: float) -> float:
        tokens, at = self._buckets.get(key, (burst, now))
        return min(burst, tokens + (now - at) * rate)

    def empty(self, key: str, rate: float, burst: float) -> bool:
        """Whether ``key``'s bucket has less than one token."""
        with self._lock:
            return key in self._buckets and self._level(key, rate, burst, self._clock()) < 1.0

    def spend(self, key: str, rate: float, burst: float) -> None:
        """Take one token from ``key``'s bucket (none left: it stays empty)."""
        self._set(key, rate, burst, take=False)

    def take(self, key: str, rate: float, burst: float) -> bool:
        """Take one token from ``key``'s bucket if it has one; False if it had none."""
        return self._set(key, rate, burst, take=True)

    def _set(self, key: str, rate: float, burst: float, take: bool) -> bool:
        with self._lock:
            now = self._clock()
            level = self._level(key, rate, burst, now)
            if take and level < 1.0:
                return False
            self._buckets[key] = (max(0.0, level - 1.0), now)
            self._buckets.move_to_end(key)
            while len(self._buckets) > self.remembered:
                self._buckets.popitem(last=False)
            return True
