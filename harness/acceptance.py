"""The acceptance measurement: two providers, a site that rejects most of the primary's
tokens and one that takes them all, and an app that checks each token and reports it.

Shared by the end-to-end test (``tests/worker/test_acceptance_e2e.py``) and the benchmark
(``scripts/bench_providers.py --only acceptance``): :func:`measure` sends :data:`ROUNDS`
rounds of :data:`ROUND_SIZE` captchas through ``solve.delay``, alternating the two sites;
:class:`Site` plays the target site; :class:`Measurement` holds what happened and its
:meth:`~Measurement.checks` the targets.  Needs the deployment running: the workers, and
the providers named ``main`` (the primary) and ``backup`` as sandbox processes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from captcha_tasks.worker.tasks import report, solve

#: The sandboxes' options: 20 threads each, quick solves.
SANDBOX_OPTIONS = ["--threads", "20", "--solve-time", "0.2", "--jitter", "0.05"]
GOOD_SITE = "https://good.example/login"
BAD_SITE = "https://bad.example/login"
SITEKEY = "0x4A"
#: The share of each provider's tokens the bad site rejects (the good one takes them all).
BAD_SITE_REJECTS = {"main": 0.60, "backup": 0.05}
ROUNDS, ROUND_SIZE = 22, 20
#: The captchas of each site the targets are judged on: the last ones.
LAST = 100
#: Seconds to wait for one outcome or one report.
GET_TIMEOUT = 45


class Site:
    """The target site, as the app sees it.  There is no real site that rejects a share of
    a provider's tokens on demand, so this plays it: a token is accepted when the issuing
    sandbox's siteverify says it is genuine and a seeded draw, made per token with the
    rejection rate of the provider that issued it, lets it through."""

    def __init__(self, urls: Mapping[str, str], seed: int = 33) -> None:
        self.urls = dict(urls)  # provider name -> its sandbox's base URL
        self.draws = random.Random(seed)

    def accepts(self, pageurl: str, outcome: Mapping[str, Any]) -> bool:
        provider = outcome["provider"]
        url = f"{self.urls[provider]}/siteverify"
        genuine = requests.post(url, data={"response": outcome["token"]}, timeout=5).json()
        rejects = BAD_SITE_REJECTS[provider] if pageurl == BAD_SITE else 0.0
        return bool(genuine["success"]) and self.draws.random() >= rejects


@dataclass(frozen=True)
class Use:
    """One captcha: its round, the page it was for, who solved it, whether it was taken."""

    round: int
    page: str
    provider: str
    accepted: bool


@dataclass
class Measurement:
    """Every captcha of a run, in the order the app used them."""

    uses: list[Use] = field(default_factory=list)

    def of(self, page: str, last: int | None = LAST) -> list[Use]:
        """The captchas of ``page``'s site (the ``last`` ones; None: all)."""
        found = [use for use in self.uses if use.page == page]
        return found if last is None else found[-last:]

    def bad_reports(self) -> dict[str, int]:
        """Tokens reported bad, by the provider that solved them."""
        counted = dict.fromkeys(BAD_SITE_REJECTS, 0)
        for use in self.uses:
            if not use.accepted:
                counted[use.provider] = counted.get(use.provider, 0) + 1
        return counted

    def figures(self) -> dict[str, int]:
        """Of the last :data:`LAST` of each site: the bad site's at the backup and
        accepted, the good site's at the primary."""
        bad, good = self.of(BAD_SITE), self.of(GOOD_SITE)
        return {
            "bad_at_backup": sum(use.provider == "backup" for use in bad),
            "bad_accepted": sum(use.accepted for use in bad),
            "good_at_primary": sum(use.provider == "main" for use in good),
        }

    def checks(self) -> list[tuple[str, bool]]:
        """The targets: of the last 100 bad-site captchas >= 80% at the backup and >= 85%
        accepted, of the last 100 good-site ones >= 90% at the primary."""
        found = self.figures()
        return [
            ("bad site: >= 80% of the last 100 at the backup", found["bad_at_backup"] >= 80),
            ("bad site: >= 85% of the last 100 accepted", found["bad_accepted"] >= 85),
            ("good site: >= 90% of the last 100 at the primary", found["good_at_primary"] >= 90),
        ]


def measure(
    site: Site,
    rounds: int = ROUNDS,
    size: int = ROUND_SIZE,
    on_round: Callable[[int], None] | None = None,
) -> Measurement:
    """Run the rounds: each sends ``size`` captchas alternating the good and the bad site,
    uses every token at ``site`` and reports it, and waits for every report to be counted
    (the next round is routed on all of this one's)."""
    measured = Measurement()
    for number in range(1, rounds + 1):
        pages = [GOOD_SITE, BAD_SITE] * (size // 2)
        sent = [solve.delay(method="turnstile", sitekey=SITEKEY, pageurl=p) for p in pages]
        reports = []
        for page, result in zip(pages, sent, strict=True):
            outcome = result.get(timeout=GET_TIMEOUT)
            accepted = site.accepts(page, outcome)
            measured.uses.append(Use(number, page, outcome["provider"], accepted))
            reports.append(report(outcome, good=accepted))
        for queued in reports:
            queued.get(timeout=GET_TIMEOUT)
        if on_round is not None:
            on_round(number)
    return measured
