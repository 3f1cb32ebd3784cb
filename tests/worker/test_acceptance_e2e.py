"""Acceptance routing, end to end: two sandbox providers over HTTP (in.php), real workers,
real Redis, and an app that checks every token at the issuing provider's siteverify and
reports it.  One site rejects most of the primary's tokens: its captchas move to the
backup; the other site stays at the primary; every bad report reaches the provider that
solved the captcha (issue 33's measurement)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from captcha_tasks import create_pool, report, solve, take_token
from captcha_tasks.testing.processes import SandboxProcess, free_port, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.tasks import prewarm

pytestmark = [pytest.mark.e2e]

MAIN_KEY = "main-key-" + os.urandom(4).hex()
BACKUP_KEY = "backup-key-" + os.urandom(4).hex()
MAIN_PORT, BACKUP_PORT = free_port(), free_port()
SANDBOX_OPTIONS = ["--threads", "20", "--solve-time", "0.2", "--jitter", "0.05"]
GOOD_SITE = "https://good.example/login"
BAD_SITE = "https://bad.example/login"
#: The share of each provider's tokens the bad site rejects (the good one takes them all).
BAD_SITE_REJECTS = {"main": 0.60, "backup": 0.05}
ROUNDS, ROUND_SIZE = 22, 20
MODULE_ENV = {
    "CAPTCHAAI_BASE_URL": f"http://127.0.0.1:{MAIN_PORT}",
    "CAPTCHAAI_API_KEY": MAIN_KEY,
    "CAPTCHAAI_PROVIDER_NAME": "main",
    "CAPTCHAAI_THREADS": "20",
    "ACCEPTANCE_TEST_BACKUP_KEY": BACKUP_KEY,
    "CAPTCHAAI_PROVIDERS": json.dumps(
        [
            {
                "name": "backup",
                "base_url": f"http://127.0.0.1:{BACKUP_PORT}",
                "key_env": "ACCEPTANCE_TEST_BACKUP_KEY",
                "threads": 20,
                "role": "fallback",
            }
        ]
    ),
    "CAPTCHAAI_SOLVE_TIMEOUT": "60",
    "CAPTCHAAI_THREADS_CHECK_EVERY": "0",
}
GET_TIMEOUT = 45


@pytest.fixture(scope="module")
def main(output_dir: Path) -> Iterator[SandboxProcess]:
    process = SandboxProcess(
        "main", MAIN_KEY, port=MAIN_PORT, options=SANDBOX_OPTIONS, log_dir=output_dir
    )
    with process.start():
        yield process


@pytest.fixture(scope="module")
def backup(output_dir: Path) -> Iterator[SandboxProcess]:
    process = SandboxProcess(
        "backup", BACKUP_KEY, port=BACKUP_PORT, options=SANDBOX_OPTIONS, log_dir=output_dir
    )
    with process.start():
        yield process


class Site:
    """The target site, as the app sees it.  There is no real site that rejects a share of
    a provider's tokens on demand, so the test plays it: a token is accepted when the
    issuing sandbox's siteverify says it is genuine and a seeded draw, made per token with
    the rejection rate of the provider that issued it, lets it through."""

    def __init__(self, processes: dict[str, SandboxProcess]) -> None:
        self.processes = processes
        self.draws = random.Random(33)

    def accepts(self, pageurl: str, outcome: dict[str, Any]) -> bool:
        provider = outcome["provider"]
        url = f"{self.processes[provider].url}/siteverify"
        genuine = requests.post(url, data={"response": outcome["token"]}, timeout=5).json()
        rejects = BAD_SITE_REJECTS[provider] if pageurl == BAD_SITE else 0.0
        return bool(genuine["success"]) and self.draws.random() >= rejects


def test_a_site_goes_to_the_provider_whose_tokens_it_accepts(
    main: SandboxProcess, backup: SandboxProcess, worker: Any
) -> None:
    site = Site({"main": main, "backup": backup})
    seen: dict[str, list[tuple[str, bool]]] = {GOOD_SITE: [], BAD_SITE: []}
    bad_reports = {"main": 0, "backup": 0}
    for _ in range(ROUNDS):
        pages = [GOOD_SITE, BAD_SITE] * (ROUND_SIZE // 2)
        results = [solve.delay(method="turnstile", sitekey="0x4A", pageurl=p) for p in pages]
        reports = []
        for page, result in zip(pages, results, strict=True):
            outcome = result.get(timeout=GET_TIMEOUT)
            accepted = site.accepts(page, outcome)
            seen[page].append((outcome["provider"], accepted))
            if not accepted:
                bad_reports[outcome["provider"]] += 1
            reports.append(report(outcome, good=accepted))
        for sent in reports:  # the next round is routed on every report of this one
            sent.get(timeout=GET_TIMEOUT)
    last_bad, last_good = seen[BAD_SITE][-100:], seen[GOOD_SITE][-100:]
    at_backup = sum(provider == "backup" for provider, _ in last_bad)
    taken = sum(ok for _, ok in last_bad)
    at_main = sum(provider == "main" for provider, _ in last_good)
    assert at_backup >= 80, (at_backup, seen[BAD_SITE])
    assert taken >= 85, (taken, seen[BAD_SITE])
    assert at_main >= 90, (at_main, seen[GOOD_SITE])
    # every bad report reached the provider that solved the captcha, on its own API
    assert main.stats()["reports_bad"] == bad_reports["main"]
    assert backup.stats()["reports_bad"] == bad_reports["backup"]
    assert bad_reports["main"] > 0 and bad_reports["backup"] > 0
    # the route change was said once, by the worker that made it
    assert worker.log_text().count("site bad.example#0x4A (turnstile): its captchas go") >= 1
    assert "site good.example" not in worker.log_text()
    # a pool of the bad site refills from the provider the site is routed to (an exploring
    # share may still go to the primary)
    create_pool("bad-site", "turnstile", "0x4A", BAD_SITE, size=6, ttl=120)
    prewarm.delay("bad-site").get(timeout=GET_TIMEOUT)
    pools = app.runtime().state.pools
    wait_until(lambda: pools.live("bad-site") >= 6, 30, what="the pool's refills")
    pooled = [take_token("bad-site") for _ in range(6)]
    assert sum(t is not None and t["provider"] == "backup" for t in pooled) >= 4, pooled
