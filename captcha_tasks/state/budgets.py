"""Tenants' daily budgets: captchas submitted per tenant and UTC day.

A captcha counts when its ``in.php`` request is allowed to go (the limiter's admission,
once per attempt: a resubmit counts again, because it is paid again; a retry of the same
attempt after a transport error does not).  Once a tenant's count reaches its
``daily_captchas``, admission refuses its submits (``over_budget``: the solve fails with
``ERROR_BUDGET_EXCEEDED``, no ``in.php``), and the limiter hands its parked submits on
without a thread so that they fail at once too.  The day is the Redis server's UTC day:
budgets reset at 00:00 UTC.

The counts are kept for every tenant, budget or not (``captcha-tasks tenants``, metrics).
They are account-wide: with several providers, one budget covers them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from .db import Db
from .keys import Keys
from .lua import text

T = TypeVar("T")

#: ms in a day (``budget.DAY_MS`` in ``lib/budget.lua``).
DAY_MS = 86_400_000


def budget_keys(keys: Keys) -> dict[str, str]:
    """The keys of ``lib/budget.lua`` (account-wide, whatever the provider)."""
    return {"budget": keys.tenant_budgets()}


class TenantBudgets:
    """What the tenants submitted today, as the CLI and the exporter read it."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.keys = db.keys

    def submitted_today(self, tenants: Iterable[str]) -> dict[str, int]:
        """Captchas each of ``tenants`` submitted since 00:00 UTC (the Redis server's)."""
        names = list(tenants)
        if not names:
            return {}
        r = self.db.redis

        def read() -> list[object]:
            seconds, _ = r.time()
            day = int(seconds) * 1000 // DAY_MS
            return list(r.hmget(self.keys.tenant_budgets(), [f"{day}|{n}" for n in names]))

        counts = self._guarded(read)
        return {n: int(text(c)) if c is not None else 0 for n, c in zip(names, counts, strict=True)}

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "the budgets are unavailable")
