"""Acceptance in Redis: the decayed counts of the reports on each provider's tokens, by
method and site, shared by every host (see :mod:`captcha_tasks.core.acceptance`).

A report is counted by one script (``acceptance/report``) that decays the counts so far
to the Redis server's clock and keeps the table bounded: at most ``sites`` sites, the
most reported (a new site takes the place of the least reported one).  The router reads a
site's counts decayed to that clock (:meth:`AcceptanceStore.read`), and records where it
sends the site when that changes (:meth:`AcceptanceStore.routed`): the one process whose
call changed it logs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.acceptance import Acceptance
from .db import Db
from .lua import Script, ms, text

REPORT = Script("acceptance/report")
READ = Script("acceptance/read")
ROUTE = Script("acceptance/route")


@dataclass(frozen=True)
class SiteView:
    """A site's acceptance by provider (decayed to ``now``, seconds on the Redis server's
    clock) and where it is routed now (None: in the configured order)."""

    acceptance: dict[str, Acceptance] = field(default_factory=dict)
    route: str | None = None
    why: str | None = None
    now: float = 0.0


class AcceptanceStore:
    """Every site's acceptance, at most ``sites`` of them, decayed by ``half_life_s``."""

    def __init__(self, db: Db, sites: int, half_life_s: float) -> None:
        self.db = db
        self.keys = db.keys
        self.max_sites = sites
        self.half_life_s = half_life_s
        self._report = db.bind(REPORT)
        self._read = db.bind(READ)
        self._route = db.bind(ROUTE)

    def _keys(self, method: str, site: str) -> dict[str, str]:
        return {
            "site": self.keys.acceptance(method, site),
            "sites": self.keys.acceptance_sites(),
            "counts": self.keys.acceptance_reports(),
            "reroutes": self.keys.acceptance_reroutes(),
        }

    def report(
        self, provider: str, method: str, site: str, good: bool, score: float | None = None
    ) -> int:
        """Count a report on a token ``provider`` solved for ``method`` at ``site``; the
        number of other sites trimmed to make room for it."""
        args: dict[str, object] = {
            "provider": provider,
            "method": method,
            "good": bool(good),
            "half_life_ms": ms(self.half_life_s),
            "sites": self.max_sites,
        }
        if score is not None:
            args["score"] = float(score)
        keys = self._keys(method, site)
        return int(self.db.guard(lambda: self._report(keys, args), "the report was not counted"))

    def read(self, method: str, site: str) -> SiteView:
        """The site's acceptance by provider, decayed to now."""
        now_ms, flat = self.db.guard(lambda: self._read(self._keys(method, site)))
        now = int(now_ms) / 1000
        values = {text(k): text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
        return SiteView(self._parse(values, now), values.get("route"), values.get("why"), now)

    def _parse(self, values: dict[str, str], now: float) -> dict[str, Acceptance]:
        providers = {name.rpartition(":")[0] for name in values if name.endswith(":at")}
        found = {}
        for provider in sorted(providers):
            p = f"{provider}:"
            counted = Acceptance(
                good=float(values.get(p + "good", 0)),
                bad=float(values.get(p + "bad", 0)),
                score_sum=float(values.get(p + "score_sum", 0)),
                scores=float(values.get(p + "scores", 0)),
                at=int(values[p + "at"]) / 1000,
            )
            found[provider] = counted.decayed(now, self.half_life_s)
        return found

    def routed(self, method: str, site: str, provider: str, why: str) -> bool:
        """Record where a submit of the site went (counted unless in ``order``, the site's
        route unless it ``explore``-d): whether this call changed the site's route."""
        keys = self._keys(method, site)
        args = {"route": provider, "why": why}
        return bool(self.db.guard(lambda: self._route(keys, args)))

    def busiest(self, limit: int) -> list[tuple[str, float]]:
        """The names of the most reported sites' hashes, with their reports."""
        found: list[Any] = self.db.guard(
            lambda: self.db.redis.zrevrange(self.keys.acceptance_sites(), 0, limit - 1, True)
        )
        return [(text(pair[0]), float(pair[1])) for pair in found]

    def sites(self, limit: int) -> list[tuple[str, str, SiteView]]:
        """The most reported sites: (method, site, what was said of each provider)."""
        found = []
        for name, _ in self.busiest(limit):
            method, site = self.keys.acceptance_site(name)
            found.append((method, site, self.read(method, site)))
        return found

    def reports(self) -> dict[tuple[str, str, bool], int]:
        """Reports ever counted by (provider, method, good)."""
        found = self.db.guard(lambda: self.db.redis.hgetall(self.keys.acceptance_reports()))
        counted = {}
        for name, count in found.items():
            provider, method, verdict = text(name).split("|")
            counted[(provider, method, verdict == "good")] = int(count)
        return counted

    def reroutes(self) -> dict[str, int]:
        """Submits sent elsewhere than the configured order's first, by reason."""
        found = self.db.guard(lambda: self.db.redis.hgetall(self.keys.acceptance_reroutes()))
        return {text(reason): int(count) for reason, count in found.items()}
