"""The official SDKs against the gateway, with nothing changed but the host: 2captcha's
``2captcha-python`` (``server=``, always over HTTPS: the gateway serves TLS with a
certificate this test makes and trusts) and CaptchaAI's ``captchaai`` (``base_url=``).

A real worker process solves at the sandbox behind the gateway.  Under CI=true a missing
SDK fails at import, never skips.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import captchaai
import captchaai.client
import pytest
from image_files import png
from twocaptcha import TwoCaptcha
from twocaptcha.api import ApiException

from captcha_tasks.gateway import GatewayServer
from captcha_tasks.gateway.server import tls_context
from captcha_tasks.testing.processes import wait_until
from harness.tls import self_signed

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("clean_state")]

#: 32 characters: CaptchaAI's SDK refuses keys of any other length.
SHOP_KEY = "c0ffee" * 5 + "ab"
MODULE_ENV = {
    "CAPTCHAAI_TENANTS": json.dumps({"shop": {"key_env": "GW_SHOP_KEY", "max_threads": 6}})
}
PAGE = "https://example.com/sdk"
#: The captchaai SDK waits as against the real API (15 s before a first poll); against a
#: sandbox that solves in 0.3 s its waits run this much faster.
TIME_SCALE = 0.02


@pytest.fixture(scope="module")
def servers(worker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The gateway over TLS (for 2captcha-python) and over plain HTTP (for captchaai)."""
    certfile, keyfile = self_signed(tmp_path_factory.mktemp("tls"))
    environ = {"GW_SHOP_KEY": SHOP_KEY}
    tls = GatewayServer(tls=tls_context(str(certfile), str(keyfile)), environ=environ).start()
    plain = GatewayServer(environ=environ).start()
    yield {"tls": tls, "plain": plain, "ca": certfile}
    tls.stop()
    plain.stop()


@pytest.fixture
def twocaptcha(servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> TwoCaptcha:
    # requests (under 2captcha-python) trusts this CA bundle: the test's own certificate
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(servers["ca"]))
    server = f"127.0.0.1:{servers['tls'].port}"
    return TwoCaptcha(SHOP_KEY, server=server, pollingInterval=1, defaultTimeout=30)


def test_2captcha_python_solves_reports_and_reads_the_balance(
    twocaptcha: TwoCaptcha, sandbox: Any, tmp_path: Path
) -> None:
    result = twocaptcha.turnstile(sitekey="0x4AAAAAAA", url=PAGE)
    assert sandbox.verify(result["code"])["success"] is True
    recaptcha = twocaptcha.recaptcha(sitekey="6Le-sdk", url=PAGE)
    assert sandbox.verify(recaptcha["code"])["success"] is True
    image = tmp_path / "captcha.png"
    image.write_bytes(png(4096))
    text = twocaptcha.normal(str(image), numeric=1)  # a file part (method=post)
    assert text["code"]
    twocaptcha.report(result["captchaId"], False)
    wait_until(lambda: sandbox.stats()["reports_bad"] == 1, 10, what="the report at the sandbox")
    assert twocaptcha.balance() >= 0.0


def test_2captcha_python_with_a_wrong_key(servers: dict[str, Any], monkeypatch: Any) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(servers["ca"]))
    solver = TwoCaptcha("f" * 32, server=f"127.0.0.1:{servers['tls'].port}")
    with pytest.raises(ApiException, match="ERROR_KEY_DOES_NOT_EXIST"):
        solver.turnstile(sitekey="0x4", url=PAGE)


class _ScaledTime:
    """The ``time`` module as the captchaai SDK sees it, with ``sleep`` scaled down (its
    poll schedule has no setting)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds * TIME_SCALE)  # the SDK's own poll schedule, scaled: not a wait of ours


@pytest.fixture
def make_captchaai(
    servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., captchaai.CaptchaAI]]:
    monkeypatch.setattr(captchaai.client, "time", _ScaledTime())
    made: list[captchaai.CaptchaAI] = []

    def make(key: str = SHOP_KEY, **options: Any) -> captchaai.CaptchaAI:
        made.append(captchaai.CaptchaAI(key, base_url=servers["plain"].url, **options))
        return made[-1]

    yield make
    for client in made:
        client.close()


def test_captchaai_sdk_through_the_gateway(
    make_captchaai: Callable[..., captchaai.CaptchaAI], sandbox: Any
) -> None:
    client = make_captchaai()
    turnstile = client.turnstile("0x4AAAAAAA", PAGE)
    assert sandbox.verify(turnstile.solution)["success"] is True
    enterprise = client.recaptcha_v2("6Le-e", PAGE, enterprise=True, action="login")
    assert sandbox.verify(enterprise.solution)["success"] is True
    assert str(enterprise.user_agent).startswith("Mozilla/5.0")
    geetest = client.geetest("gt-value", "challenge-1", PAGE)
    assert geetest.solution["geetest_challenge"] == "challenge-1"
    grid = client.grid(png(4096), "Select all squares with buses", "4x4")
    assert isinstance(grid.solution, list) and set(grid.solution) <= set(range(1, 17))
    info = client.threads_info()
    assert info["threads"] == 6  # the tenant's max_threads, not the account's


def test_captchaai_sdk_with_a_wrong_key(make_captchaai: Callable[..., Any]) -> None:
    with pytest.raises(captchaai.InvalidKeyError):
        make_captchaai("e" * 32).turnstile("0x4", PAGE)
