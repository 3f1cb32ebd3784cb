"""Acceptance routing, end to end: two sandbox providers over HTTP (in.php), real workers,
real Redis, and an app that checks every token at the issuing provider's siteverify and
reports it.  One site rejects most of the primary's tokens: its captchas move to the
backup; the other site stays at the primary; every bad report reaches the provider that
solved the captcha (issue 33's measurement)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from captcha_tasks import create_pool, take_token
from captcha_tasks.testing.processes import SandboxProcess, free_port, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.tasks import prewarm
from harness.acceptance import (
    BAD_SITE,
    GET_TIMEOUT,
    SANDBOX_OPTIONS,
    SITEKEY,
    Site,
    measure,
)

pytestmark = [pytest.mark.e2e]

MAIN_KEY = "main-key-" + os.urandom(4).hex()
BACKUP_KEY = "backup-key-" + os.urandom(4).hex()
MAIN_PORT, BACKUP_PORT = free_port(), free_port()
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


def test_a_site_goes_to_the_provider_whose_tokens_it_accepts(
    main: SandboxProcess, backup: SandboxProcess, worker: Any
) -> None:
    measured = measure(Site({"main": main.url, "backup": backup.url}))
    found = measured.figures()
    assert found["bad_at_backup"] >= 80, (found, measured.of(BAD_SITE, None))
    assert found["bad_accepted"] >= 85, (found, measured.of(BAD_SITE, None))
    assert found["good_at_primary"] >= 90, found
    assert all(met for _, met in measured.checks())
    # every bad report reached the provider that solved the captcha, on its own API
    bad_reports = measured.bad_reports()
    assert main.stats()["reports_bad"] == bad_reports["main"]
    assert backup.stats()["reports_bad"] == bad_reports["backup"]
    assert bad_reports["main"] > 0 and bad_reports["backup"] > 0
    # the route change was said once, by the worker that made it
    assert worker.log_text().count(f"site bad.example#{SITEKEY} (turnstile): its captchas go") >= 1
    assert "site good.example" not in worker.log_text()
    # a pool of the bad site refills from the provider the site is routed to (an exploring
    # share may still go to the primary)
    create_pool("bad-site", "turnstile", SITEKEY, BAD_SITE, size=6, ttl=120)
    prewarm.delay("bad-site").get(timeout=GET_TIMEOUT)
    pools = app.runtime().state.pools
    wait_until(lambda: pools.live("bad-site") >= 6, 30, what="the pool's refills")
    pooled = [take_token("bad-site") for _ in range(6)]
    assert sum(t is not None and t["provider"] == "backup" for t in pooled) >= 4, pooled
