"""Counters of the deployment, kept in Redis for the metrics exporter: solves by method and
source, solves that ended by lane and tenant, API errors by code, provider callbacks by
verdict, what answers cost by tenant (where the provider says), and whether the API honours
``res.php?ids=``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from .db import Db
from .keys import Keys
from .lua import text

T = TypeVar("T")

BULK_SUPPORT_TTL = 3600


def stats_keys(keys: Keys, method: str) -> dict[str, str]:
    """The keys of ``lib/stats.lua`` for solves of ``method``."""
    return {
        "solved": keys.solved_counter(method),
        "api_errors": keys.api_errors(),
        "lane_outcomes": keys.lane_outcomes(),
    }


class Stats:
    """The deployment's counters."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.keys = db.keys

    def count_errors(self, codes: Sequence[str]) -> None:
        """Count API error answers that did not end a solve (retried, resubmitted)."""
        if not codes:
            return
        pipe = self.db.pipeline()
        for code in codes:
            pipe.hincrby(self.keys.api_errors(), code, 1)
        self._guarded(pipe.execute)

    def api_errors(self) -> dict[str, int]:
        """Error answers and failures so far, by code."""
        return self._counts(self.keys.api_errors())

    def solved(self, method: str) -> dict[str, int]:
        """Solves of ``method`` so far, by source."""
        return self._counts(self.keys.solved_counter(method))

    def add_cost(self, tenant: str, cost: float) -> None:
        """Add what one answer cost (as the provider said) to ``tenant``'s sum."""
        r = self.db.redis
        self._guarded(lambda: r.hincrbyfloat(self.keys.costs(), tenant, cost))

    def costs(self) -> dict[str, float]:
        """What answers cost so far, by tenant."""
        r = self.db.redis
        raw = self._guarded(lambda: r.hgetall(self.keys.costs()))
        return {text(k): float(v) for k, v in raw.items()}

    def count_resubmit(self, reason: str) -> None:
        """Count a new captcha submitted for a solve whose captcha failed, by reason."""
        r = self.db.redis
        self._guarded(lambda: r.hincrby(self.keys.resubmits(), reason, 1))

    def resubmits(self) -> dict[str, int]:
        """New captchas submitted for solves whose captcha failed, by reason."""
        return self._counts(self.keys.resubmits())

    def lane_outcomes(self) -> dict[tuple[str, str, str], int]:
        """Solves that ended so far, by (ending, lane, tenant); ending is ``solved`` or
        ``failed``."""
        found = self._counts(self.keys.lane_outcomes())
        return {tuple(name.split("|", 2)): n for name, n in found.items()}  # type: ignore[misc]

    def count_callback(self, verdict: str) -> None:
        """Count one provider callback by verdict."""
        r = self.db.redis
        self._guarded(lambda: r.hincrby(self.keys.pingback_callbacks(), verdict, 1))

    def callback_counts(self) -> dict[str, int]:
        """Provider callbacks so far, by verdict."""
        return self._counts(self.keys.pingback_callbacks())

    def bulk_supported(self) -> bool | None:
        """Whether the API honours ``res.php?ids=`` (None: not known yet)."""
        r = self.db.redis
        value = self._guarded(lambda: r.get(self.keys.bulk_support()))
        return None if value is None else text(value) == "1"

    def set_bulk_supported(self, supported: bool) -> None:
        key, value, r = self.keys.bulk_support(), "1" if supported else "0", self.db.redis
        self._guarded(lambda: r.set(key, value, ex=BULK_SUPPORT_TTL))

    def _counts(self, key: str) -> dict[str, int]:
        r = self.db.redis
        raw = self._guarded(lambda: r.hgetall(key))
        return {text(k): int(v) for k, v in raw.items()}

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "the counters are unavailable")
