"""``captcha-tasks providers --sites`` through click's runner: the busiest sites, each
provider's acceptance there, and where each site is routed now and why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from captcha_tasks.cli.providers import providers
from captcha_tasks.settings import Settings
from captcha_tasks.state import State
from captcha_tasks.state.acceptance import AcceptanceStore
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.worker.app import app

pytestmark = pytest.mark.redis


@pytest.fixture
def configured(redis_conn: Any, keys: Keys) -> Iterator[None]:
    """Two providers, this test's keys: the runtime the command reads."""
    env = {
        "CAPTCHAAI_KEY_PREFIX": keys.prefix,
        "CAPTCHAAI_PROVIDER_NAME": "main",
        "SITES_TEST_BACKUP_KEY": "backup-key",
        "CAPTCHAAI_PROVIDERS": json.dumps(
            [
                {
                    "name": "backup",
                    "base_url": "http://127.0.0.1:9",
                    "key_env": "SITES_TEST_BACKUP_KEY",
                    "threads": 5,
                    "role": "fallback",
                }
            ]
        ),  # fmt: skip
    }
    settings = Settings.from_env(env)
    app.use(settings, State.build(settings, redis_conn))
    yield
    app.forget_runtime()


def sites(*args: str) -> Result:
    return CliRunner().invoke(providers, list(args))


def test_the_busiest_sites_with_their_acceptance_and_route(
    redis_conn: Any, keys: Keys, configured: None
) -> None:
    store = AcceptanceStore(Db(redis_conn, keys), 100, 21600)
    for good in [True] * 4 + [False] * 6:
        store.report("main", "turnstile", "bad.test#0x4A", good)
    for good in [True] * 19 + [False]:
        store.report("backup", "turnstile", "bad.test#0x4A", good)
    store.report("main", "userrecaptcha", "v3.test", True, score=0.3)
    store.routed("turnstile", "bad.test#0x4A", "backup", "acceptance")

    done = sites("--sites", "--json")
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in done.output.splitlines()]
    assert [(r["site"], r["method"]) for r in rows] == [
        ("bad.test#0x4A", "turnstile"),
        ("v3.test", "userrecaptcha"),
    ]
    busiest = rows[0]
    assert (busiest["route"], busiest["why"]) == ("backup", "acceptance")
    assert busiest["providers"]["main"]["acceptance"] == pytest.approx(0.4, abs=0.01)
    assert busiest["providers"]["backup"]["reports"] == pytest.approx(20, abs=0.1)
    assert rows[1]["providers"]["main"]["measure"] == "score"
    assert (rows[1]["route"], rows[1]["why"]) == (None, "order")

    text = sites("--sites", "1")
    assert text.exit_code == 0, text.output
    assert text.output.splitlines() == [
        "bad.test#0x4A [turnstile]: main 40% accepted of 10 reports, backup 95% accepted of"
        " 20 reports; routed to backup (acceptance)"
    ]
