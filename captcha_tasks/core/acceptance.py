"""Acceptance: how often a site takes the tokens of each provider, and where that sends
the site's next captcha.

* A *site* is the page's host and, when the request names one, its sitekey
  (:func:`site_of`): two widgets of one host that accept tokens differently are two sites.
* An :class:`Acceptance` is what the reports said about one provider's tokens for one
  method at one site: decayed counts of good and bad reports (each report's weight halves
  every ``CAPTCHAAI_ACCEPTANCE_HALF_LIFE`` seconds, so a provider that got better or worse
  shows it) and, for reCAPTCHA v3, the decayed mean of the scores the site returned.  Its
  :attr:`~Acceptance.measure` is the share accepted, or the mean score when there are
  scores; its :meth:`~Acceptance.lower_bound` is the Wilson lower confidence bound of it.
* :func:`choose` picks the provider for a submit from those in rotation that take its
  method, in the configured order: the first, unless the site's acceptance there is below
  ``CAPTCHAAI_ACCEPTANCE_MIN`` with enough reports to say so; then the one with the best
  lower bound (a provider with too few reports is tried first), and a share
  ``CAPTCHAAI_ACCEPTANCE_EXPLORE`` to the others so that one that got better is noticed.
  When no other provider does clearly better, the configured order stands.

Pure values; the counts live in Redis (:mod:`captcha_tasks.state.acceptance`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal
from urllib.parse import urlsplit

from .providers import ProviderSpec

#: Why a submit goes where it goes: the configured order, a reroute to the provider with
#: the best lower bound, a try of a provider with too few reports, or an exploring share.
Reason = Literal["order", "acceptance", "untried", "explore"]
REASONS: tuple[Reason, ...] = ("order", "acceptance", "untried", "explore")
#: The z of the lower confidence bound (a one-sided 95% bound).
Z = 1.645
#: Reports short of the minimum that still make it: the last ``min_reports`` reports,
#: decayed by the seconds since, count as enough.
SLACK = 0.05


@dataclass(frozen=True)
class AcceptancePolicy:
    """The router's settings (the ``CAPTCHAAI_ACCEPTANCE_*`` variables)."""

    #: A site's share accepted (or mean v3 score) below which it is routed elsewhere.
    min: float = 0.75
    #: Reports (decayed) at a provider before its acceptance counts.
    min_reports: float = 10.0
    #: The share of a rerouted site's submits that still go to the other providers.
    explore: float = 0.05
    #: Seconds in which a report's weight halves.
    half_life_s: float = 21600.0


def site_of(pageurl: str | None, sitekey: str | None) -> str | None:
    """The site a request's token is used at: the page's host, with the sitekey after a
    ``#`` when there is one (None: no page, nothing to route by)."""
    if not pageurl:
        return None
    host = (urlsplit(pageurl).hostname or "").lower()
    if not host:
        return None
    return f"{host}#{sitekey}" if sitekey else host


@dataclass(frozen=True)
class Acceptance:
    """What the reports said about one provider's tokens for one method at one site, as
    of ``at`` (seconds, the clock the counts were decayed with)."""

    good: float = 0.0
    bad: float = 0.0
    #: Decayed sum and count of the v3 scores reported.
    score_sum: float = 0.0
    scores: float = 0.0
    at: float = 0.0

    def decayed(self, now: float, half_life_s: float) -> Acceptance:
        """The counts as of ``now`` (each halves every ``half_life_s`` seconds)."""
        if now <= self.at:
            return self
        factor = 0.5 ** ((now - self.at) / half_life_s)
        return Acceptance(
            self.good * factor,
            self.bad * factor,
            self.score_sum * factor,
            self.scores * factor,
            now,
        )

    def reported(
        self, good: bool, score: float | None, now: float, half_life_s: float
    ) -> Acceptance:
        """The counts after one more report at ``now``."""
        base = self.decayed(now, half_life_s)
        counted = replace(base, good=base.good + good, bad=base.bad + (not good), at=now)
        if score is None:
            return counted
        return replace(counted, score_sum=counted.score_sum + score, scores=counted.scores + 1)

    @property
    def reports(self) -> float:
        """The (decayed) number of reports the measure rests on."""
        return self.scores if self.scores > 0 else self.good + self.bad

    @property
    def measure(self) -> float | None:
        """The mean v3 score when there are scores, else the share accepted (None: no
        reports)."""
        if self.scores > 0:
            return self.score_sum / self.scores
        total = self.good + self.bad
        return self.good / total if total > 0 else None

    def lower_bound(self, z: float = Z) -> float:
        """The Wilson lower confidence bound of :attr:`measure` (0 with no reports)."""
        n, p = self.reports, self.measure
        if p is None or n <= 0:
            return 0.0
        centre = p + z * z / (2 * n)
        spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return max(0.0, (centre - spread) / (1 + z * z / n))


NONE = Acceptance()


@dataclass(frozen=True)
class Choice:
    """Where a submit goes, and why."""

    provider: str
    reason: Reason


def choose(
    order: Sequence[ProviderSpec],
    method: str,
    acceptance: Mapping[str, Acceptance],
    explore_draw: float,
    policy: AcceptancePolicy,
    proxied: bool = False,
    variant: str = "",
) -> Choice:
    """The provider for a submit of ``method`` (with a proxy when ``proxied``) at a site
    whose acceptance by provider is ``acceptance`` (decayed to now), among ``order``: the
    providers in rotation, in the configured order (see the module docstring).
    ``explore_draw`` is uniform in [0, 1)."""
    taking = [p.name for p in order if p.supports(method, proxied, variant)]
    if not taking:
        raise ValueError(f"no provider in the order takes {method!r}")
    first = taking[0]
    if len(taking) == 1 or not _poor(acceptance.get(first, NONE), policy):
        return Choice(first, "order")
    best = _best(taking, acceptance, policy)
    if best is None:
        return Choice(first, "order")
    others = [name for name in taking if name != best.provider]
    if explore_draw < policy.explore and others:
        index = min(int(explore_draw / policy.explore * len(others)), len(others) - 1)
        return Choice(others[index], "explore")
    return best


def _poor(found: Acceptance, policy: AcceptancePolicy) -> bool:
    measure = found.measure
    enough = found.reports + SLACK >= policy.min_reports
    return enough and measure is not None and measure < policy.min


def _best(
    taking: Sequence[str], acceptance: Mapping[str, Acceptance], policy: AcceptancePolicy
) -> Choice | None:
    """The provider the poor first one's site goes to: one with too few reports to judge
    (tried first, in order), else the best lower bound when it beats the first's measure
    (None: nobody clearly does better, the order stands)."""
    counted = {name: acceptance.get(name, NONE) for name in taking}
    for name in taking[1:]:
        if counted[name].reports + SLACK < policy.min_reports:
            return Choice(name, "untried")
    first = counted[taking[0]].measure or 0.0
    # max() keeps the first of equals: the configured order breaks ties
    name = max(taking[1:], key=lambda n: counted[n].lower_bound())
    if counted[name].lower_bound() <= first:
        return None
    return Choice(name, "acceptance")
