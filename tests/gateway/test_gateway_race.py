"""The gateway's "done when": three SDKs in three processes at once against one gateway
over HTTPS (a self-signed certificate), an upstream of 15 threads.

* tenant ``shop``: CaptchaAI's SDK (30 reCAPTCHA v2) and ``2captcha-python`` (30
  Turnstile): all 60 solve, and each token verifies at the sandbox;
* tenant ``crawler``, ``daily_captchas`` 25: ``capmonstercloudclient`` (30
  RecaptchaV2Task): exactly 25 tokens and 5 errors (``ERROR_ZERO_BALANCE``, at the poll:
  all 30 were accepted before the budget ran out), and its next submit is refused;
* the sandbox never has more than 15 captchas in flight.

Each SDK runs as its users run it, the host changed (``sdk_driver.py``); the test waits
for the three processes to exit, then reads what each printed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sdk_driver

from captcha_tasks.gateway import GatewayServer
from captcha_tasks.gateway.server import tls_context
from captcha_tasks.serving import Limits
from harness.tls import self_signed

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("worker", "clean_state")]

SHOP_KEY = "5b0b" * 8  # 32 characters: CaptchaAI's SDK accepts no other length
CRAWLER_KEY = "c4a71e25" * 4
THREADS = 15
N = 30
CRAWLER_BUDGET = 25
MODULE_ENV = {
    "CAPTCHAAI_THREADS": str(THREADS),
    "CAPTCHAAI_TENANTS": json.dumps(
        {
            # 60 polling clients: the captchaai SDK's scaled schedule polls ~2 a second
            # each, past the default cap of 100 requests a second per tenant.
            "shop": {"key_env": "GW_SHOP_KEY", "requests_per_s": 1000},
            "crawler": {"key_env": "GW_CRAWLER_KEY", "daily_captchas": CRAWLER_BUDGET},
        }
    ),
}
PAGE = "https://example.com/race"
#: The captchaai SDK waits as against the real API (15 s, then every 5 s): scaled down.
TIME_SCALE = 0.1
DEADLINE_S = 90


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    certfile, keyfile = self_signed(tmp_path_factory.mktemp("tls"))
    server = GatewayServer(
        # every client is on 127.0.0.1: 90 connections at once from one address
        limits=Limits(max_per_address=256),
        tls=tls_context(str(certfile), str(keyfile)),
        environ={"GW_SHOP_KEY": SHOP_KEY, "GW_CRAWLER_KEY": CRAWLER_KEY},
    ).start()
    yield {"url": f"https://127.0.0.1:{server.port}", "ca": certfile}
    server.stop()


def tasks(kind: str, sitekey: str) -> list[dict[str, Any]]:
    return [{"kind": kind, "sitekey": f"{sitekey}{i}", "pageurl": PAGE} for i in range(N)]


@pytest.mark.timeout(180)
def test_three_sdks_two_tenants_one_gateway_fifteen_threads(
    capmonster_python: Path, gateway: dict[str, Any], sandbox: Any, tmp_path: Path
) -> None:
    sandbox.configure(threads=THREADS)
    url, ca = gateway["url"], gateway["ca"]
    jobs = {
        "captchaai": (
            sys.executable,
            {"url": url, "tasks": tasks("recaptcha_v2", "6Le-race-"), "time_scale": TIME_SCALE},
            SHOP_KEY,
        ),
        "2captcha": (sys.executable, {"url": url, "tasks": tasks("turnstile", "0x4AAA")}, SHOP_KEY),
        "capmonster": (
            capmonster_python,
            {"url": url, "tasks": tasks("recaptcha_v2", "6Le-crawl-"), "balance": True},
            CRAWLER_KEY,
        ),
    }
    running = {
        sdk: sdk_driver.start(python, {"sdk": sdk, **job}, key, ca, tmp_path)
        for sdk, (python, job, key) in jobs.items()
    }
    lines = {sdk: sdk_driver.finish(proc, DEADLINE_S) for sdk, proc in running.items()}

    answers = {sdk: [line for line in found if "i" in line] for sdk, found in lines.items()}
    for sdk, found in answers.items():
        assert sorted(line["i"] for line in found) == list(range(N)), (sdk, found)
    for sdk in ("captchaai", "2captcha"):
        failed = [line for line in answers[sdk] if "error" in line]
        assert not failed, (sdk, failed)
    crawler_tokens = [line["token"] for line in answers["capmonster"] if "token" in line]
    crawler_errors = [line for line in answers["capmonster"] if "error" in line]
    assert (len(crawler_tokens), len(crawler_errors)) == (CRAWLER_BUDGET, N - CRAWLER_BUDGET)
    for line in crawler_errors:  # the budget, as the SDK reports an empty balance
        assert "ERROR_ZERO_BALANCE" in line["message"], line
    [balance] = [line["balance"] for line in lines["capmonster"] if "balance" in line]
    assert balance == 0

    shop_tokens = [line["token"] for sdk in ("captchaai", "2captcha") for line in answers[sdk]]
    tokens = shop_tokens + crawler_tokens
    assert len(set(tokens)) == len(tokens) == 2 * N + CRAWLER_BUDGET
    unverified = [t for t in tokens if sandbox.verify(t)["success"] is not True]
    assert not unverified
    stats = sandbox.stats()
    assert 1 < stats["peak_in_flight"] <= THREADS, stats
    assert stats["submits_by_method"]["turnstile"] == N
    assert stats["submits_by_method"]["userrecaptcha"] == N + CRAWLER_BUDGET
    for sdk, found in lines.items():
        text = json.dumps(found)
        assert SHOP_KEY not in text and CRAWLER_KEY not in text, sdk

    # the budget spent, the next submit is refused at once (createTask)
    job = {"sdk": "capmonster", "url": url, "tasks": tasks("recaptcha_v2", "6Le-late-")[:1]}
    [late] = sdk_driver.finish(
        sdk_driver.start(capmonster_python, job, CRAWLER_KEY, ca, tmp_path), DEADLINE_S
    )
    assert late["error"] == "GetTaskError" and "ERROR_ZERO_BALANCE" in late["message"], late
    assert sandbox.stats()["submits_by_method"]["userrecaptcha"] == N + CRAWLER_BUDGET
