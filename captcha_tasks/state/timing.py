"""Adaptive first poll: when to ask for a captcha's answer the first time.

Workers record each captcha's observed solve time (submit to answer seen) per method in
Redis.  Once enough samples exist, the first poll is aimed at a high percentile of them
minus half a poll interval.  The observed times are upper bounds (an answer is seen only
when polled), so this lowers the aim while nearly every captcha is caught by the first
poll and raises it when too many need a second one: it settles where roughly
``100 - percentile`` % of captchas need one more poll.
"""

from __future__ import annotations

import redis

from ..keys import Keys
from ..settings import Settings

SAMPLE_WINDOW = 200
MIN_WAIT = 0.2


def record_solve_time(r: redis.Redis, keys: Keys, method: str, seconds: float) -> None:
    key = keys.solve_times(method)
    pipe = r.pipeline(transaction=False)
    pipe.lpush(key, f"{seconds:.3f}")
    pipe.ltrim(key, 0, SAMPLE_WINDOW - 1)
    pipe.execute()


def first_wait(
    r: redis.Redis, keys: Keys, settings: Settings, method: str, default: float
) -> float:
    """Seconds from submit to the first poll for ``method``."""
    cold = settings.initial_wait if settings.initial_wait is not None else default
    samples = sorted(float(x) for x in r.lrange(keys.solve_times(method), 0, -1))
    if len(samples) < settings.adaptive_min_samples:
        return cold
    aim = percentile(samples, settings.adaptive_percentile) - settings.poll_interval / 2
    return max(MIN_WAIT, aim)


def percentile(sorted_values: list[float], pct: float) -> float:
    """Linear-interpolated percentile of an ascending list."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * pct / 100
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def typical_solve_time(
    r: redis.Redis, keys: Keys, settings: Settings, method: str, default: float
) -> float:
    """The median observed solve time of ``method`` (cold: its first wait)."""
    samples = sorted(float(x) for x in r.lrange(keys.solve_times(method), 0, -1))
    if len(samples) < settings.adaptive_min_samples:
        return first_wait(r, keys, settings, method, default)
    return percentile(samples, 50)


def earliest_ready(
    r: redis.Redis, keys: Keys, settings: Settings, method: str, default: float
) -> float:
    """Seconds after submit before which a captcha of ``method`` is rarely solved (the 5th
    percentile of observed times; cold: the first wait).  Bulk polls skip younger ones."""
    samples = sorted(float(x) for x in r.lrange(keys.solve_times(method), 0, -1))
    if len(samples) < settings.adaptive_min_samples:
        return first_wait(r, keys, settings, method, default)
    return percentile(samples, 5)
