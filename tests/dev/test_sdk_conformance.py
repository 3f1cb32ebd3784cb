"""CaptchaAI's own Python SDK (``captchaai``, the test extra installs it) against the sandbox
over HTTP: every solve method it has, and ``threads_info()``, must return a result.  When
CaptchaAI's client can talk to the sandbox, the sandbox speaks CaptchaAI's wire format, and
our client, tested against the sandbox, does too."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import captchaai
import captchaai.client
import pytest
from image_files import png

from captcha_tasks.worker.app import app

pytestmark = pytest.mark.system

PAGE = "https://example.com/login"
PROXY = {"proxy": "user:pw@10.0.0.1:3128", "proxytype": "HTTP"}
#: The SDK refuses keys that are not 32 characters long.
SDK_KEY = os.urandom(16).hex()
#: The SDK waits as against the real API (15 s before a reCAPTCHA's first poll, 5 s between
#: polls); against a sandbox that solves in 0.3 s its waits run this much faster.
TIME_SCALE = 0.02


class _ScaledTime:
    """The ``time`` module as the SDK's sync client sees it, with ``sleep`` scaled down.

    The SDK has no setting for its poll schedule, so this replaces the module reference in
    ``captchaai.client`` only (the narrowest seam: its HTTP calls, its waits' order and
    count are untouched)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds * TIME_SCALE)  # the SDK's own poll interval, scaled down


@pytest.fixture
def make_sdk(sandbox: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """CaptchaAI's sync client on the sandbox (the sandbox also knows the SDK's key)."""
    sandbox.configure(api_keys=[app.runtime().settings.providers.api_key, SDK_KEY])
    monkeypatch.setattr(captchaai.client, "time", _ScaledTime())
    made: list[captchaai.CaptchaAI] = []

    def make(**options: Any) -> captchaai.CaptchaAI:
        # base_url is the SDK's own option for the host serving in.php and res.php.
        made.append(captchaai.CaptchaAI(SDK_KEY, base_url=sandbox.url, **options))
        return made[-1]

    yield make
    for client in made:
        client.close()


@pytest.fixture
def sdk(make_sdk: Callable[..., captchaai.CaptchaAI]) -> captchaai.CaptchaAI:
    """With a client-level proxy, as the Cloudflare challenge and CaptchaFox need."""
    return make_sdk(**PROXY)


Call = Callable[[captchaai.CaptchaAI], captchaai.SolveResult]
IMAGE = png(4096)
TOKENS: list[tuple[str, Call, bool]] = [
    # name, the SDK call, whether the result carries a user agent
    ("recaptcha_v2", lambda c: c.recaptcha_v2("6Le-v2", PAGE), False),
    ("recaptcha_v2_invisible", lambda c: c.recaptcha_v2("6Le-v2", PAGE, invisible=True), False),
    (
        "recaptcha_v2_enterprise",
        lambda c: c.recaptcha_v2("6Le-v2e", PAGE, enterprise=True, action="login"),
        True,
    ),
    (
        "recaptcha_v3",
        lambda c: c.recaptcha_v3("6Le-v3", PAGE, action="login", min_score=0.7),
        False,
    ),
    (
        "recaptcha_v3_enterprise",
        lambda c: c.recaptcha_v3("6Le-v3e", PAGE, action="pay", enterprise=True),
        True,
    ),
    ("turnstile", lambda c: c.turnstile("0x4AAAAAAA", PAGE, user_agent="Mozilla/5.0 T"), False),
    ("cloudflare_challenge", lambda c: c.cloudflare_challenge(PAGE), True),
    ("captchafox", lambda c: c.captchafox("sk-fox", PAGE), True),
    ("friendly_captcha", lambda c: c.friendly_captcha("FCMG", PAGE, version="v2"), False),
]


@pytest.mark.parametrize(("name", "call", "agent"), TOKENS, ids=[t[0] for t in TOKENS])
def test_sdk_token_methods(
    sdk: captchaai.CaptchaAI, sandbox: Any, name: str, call: Call, agent: bool
) -> None:
    result = call(sdk)
    assert isinstance(result.solution, str) and result.solution
    assert result.task_id.isdigit()
    # the token the sandbox made reached the SDK whole
    assert sandbox.verify(result.solution)["success"] is True
    assert (result.user_agent is not None) is agent
    if agent:
        assert str(result.user_agent).startswith("Mozilla/5.0")


def test_sdk_user_agent_is_passed_through(sdk: captchaai.CaptchaAI) -> None:
    mine = "Mozilla/5.0 (X11; Linux x86_64) conformance"
    assert sdk.cloudflare_challenge(PAGE, user_agent=mine).user_agent == mine


def test_sdk_structured_methods(sdk: captchaai.CaptchaAI, sandbox: Any) -> None:
    geetest = sdk.geetest("gt-value", "challenge-1", PAGE)
    assert isinstance(geetest.solution, dict)
    assert geetest.solution["geetest_challenge"] == "challenge-1"
    assert sandbox.verify(geetest.solution["geetest_validate"])["success"] is True

    lemin = sdk.lemin("CROPPED_3dfdd5c_d1872b", "lemin-cropped-captcha", PAGE, api_server="x.io")
    assert isinstance(lemin.solution, dict)
    assert set(lemin.solution) == {"answer", "challenge_uuid"}
    assert sandbox.verify(lemin.solution["answer"])["sitekey"] == "CROPPED_3dfdd5c_d1872b"


def test_sdk_image_methods(make_sdk: Callable[..., captchaai.CaptchaAI], sandbox: Any) -> None:
    client = make_sdk()
    normal = client.normal(IMAGE, numeric=1, min_len=5, max_len=5)
    assert isinstance(normal.solution, str) and len(normal.solution) == 5
    grid = client.grid(IMAGE, "Select all squares with buses", "4x4")
    assert isinstance(grid.solution, list) and grid.solution
    assert set(grid.solution) <= set(range(1, 17))
    bls = client.bls([IMAGE] * 9, "Select all cars")
    assert isinstance(bls.solution, list) and bls.solution
    assert set(bls.solution) <= set(range(1, 10))
    by_method = sandbox.stats()["submits_by_method"]
    assert (by_method["base64"], by_method["bls"]) == (2, 1)


def _check_threads(read: Callable[[], dict[str, int] | None], sandbox: Any) -> None:
    before = sandbox.stats()
    info = read()
    after = sandbox.stats()["in_flight"]
    assert info is not None and set(info) == {"threads", "working_threads"}
    assert info["threads"] == before["config"]["threads"]
    # nothing is submitted meanwhile: the busy count can only fall
    assert after <= info["working_threads"] <= before["in_flight"]


def test_sdk_threads_info(sdk: captchaai.CaptchaAI, sandbox: Any) -> None:
    _check_threads(sdk.threads_info, sandbox)


def test_our_client_reads_threads_info_as_the_sdk_does(sandbox: Any) -> None:
    _check_threads(app.runtime().api().threads_info, sandbox)
