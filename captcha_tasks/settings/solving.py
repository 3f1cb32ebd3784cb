"""How one solve is timed: its polls, its deadline, its resubmits and its thread slot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .declare import check, lifetimes, lower, setting

#: Bulk polls a captcha past its likely finish gets per poll interval, by default: every
#: 0.33 s with the default 5 s interval (an answer waits about half of that for its poll).
BULK_WINDOWS_PER_POLL = 15


@dataclass(frozen=True)
class SolvingSettings:
    """The timing of one solve (``settings.solving``)."""

    poll_interval: float = setting(
        "CAPTCHAAI_POLL_INTERVAL", "seconds between polls of one captcha.", 5.0, parse=float
    )
    initial_wait: float | None = setting(
        "CAPTCHAAI_INITIAL_WAIT",
        "cold-start wait before the first poll for every method (unset: per-method defaults).",
        None,
        parse=float,
    )
    solve_timeout: float = setting(
        "CAPTCHAAI_SOLVE_TIMEOUT",
        "overall deadline of one solve, resubmits included.",
        300.0,
        parse=float,
    )
    max_resubmits: int = setting(
        "CAPTCHAAI_MAX_RESUBMITS",
        "new captchas after unsolvable / expired answers.",
        2,
        parse=int,
    )
    token_lifetimes: Mapping[str, float] = setting(
        "CAPTCHAAI_TOKEN_LIFETIMES",
        "JSON object overriding token life per method (seconds).",
        factory=dict,
        parse=lifetimes,
    )
    adaptive_min_samples: int = setting(
        "CAPTCHAAI_ADAPTIVE_SAMPLES",
        "solve-time samples needed before the adaptive first poll.",
        10,
        parse=int,
    )
    adaptive_percentile: float = setting(
        "CAPTCHAAI_ADAPTIVE_PERCENTILE",
        "percentile of observed solve time to first poll at.",
        90.0,
        parse=float,
    )
    slot_lease: float = setting(
        "CAPTCHAAI_SLOT_LEASE",
        "seconds a thread slot stays held without a renewing poll.",
        120.0,
        parse=float,
    )
    bulk_poll: str = setting(
        "CAPTCHAAI_BULK_POLL",
        """"auto" (ask for many captchas in one ``ids=`` request where the API supports it)
        or "off" (one id per request).""",
        "auto",
        parse=lower,
    )
    bulk_window: float | None = setting(
        "CAPTCHAAI_BULK_WINDOW",
        """at most one bulk request per this many seconds (unset: a fifteenth of the poll
        interval).""",
        None,
        parse=float,
    )

    def __post_init__(self) -> None:
        check("CAPTCHAAI_POLL_INTERVAL", self.poll_interval > 0, "must be > 0")
        check(
            "CAPTCHAAI_INITIAL_WAIT",
            self.initial_wait is None or self.initial_wait >= 0,
            "must be >= 0",
        )
        check("CAPTCHAAI_SOLVE_TIMEOUT", self.solve_timeout > 0, "must be > 0")
        check("CAPTCHAAI_MAX_RESUBMITS", self.max_resubmits >= 0, "must be >= 0")
        check("CAPTCHAAI_ADAPTIVE_SAMPLES", self.adaptive_min_samples >= 1, "must be >= 1")
        check(
            "CAPTCHAAI_ADAPTIVE_PERCENTILE",
            0 < self.adaptive_percentile < 100,
            "must be between 0 and 100",
        )
        check("CAPTCHAAI_SLOT_LEASE", self.slot_lease > 0, "must be > 0")
        check("CAPTCHAAI_BULK_POLL", self.bulk_poll in ("auto", "off"), 'must be "auto" or "off"')
        check(
            "CAPTCHAAI_BULK_WINDOW",
            self.bulk_window is None or self.bulk_window > 0,
            "must be > 0",
        )
        for method, life in self.token_lifetimes.items():
            check("CAPTCHAAI_TOKEN_LIFETIMES", life > 0, f"life of {method!r} must be > 0")

    @property
    def bulk_window_s(self) -> float:
        """Seconds between two bulk polls: CAPTCHAAI_BULK_WINDOW or its default."""
        if self.bulk_window is not None:
            return self.bulk_window
        return self.poll_interval / BULK_WINDOWS_PER_POLL
