"""When to poll a captcha first, figured from its method's observed solve times.

Every finished captcha's solve time is kept per method in Redis
(:mod:`captcha_tasks.state.timing`): from its submit to the midpoint between its last "not
ready" and the answer (to the answer when its first poll or its callback had it).  Once
enough samples exist:

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

from dataclasses import dataclass

MIN_WAIT = 0.2


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
