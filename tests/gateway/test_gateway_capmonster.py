"""CapMonster Cloud's official SDK (``capmonstercloudclient``) against the gateway's JSON
face, with nothing changed but ``service_url``: the gateway serves HTTPS with a
certificate this test makes, a real worker solves at the sandbox behind it.

The SDK runs in its own virtual environment (it pins its dependencies to exact versions,
``tests/pip_cache.py``) through ``sdk_driver.py``.  Under CI=true an environment that
cannot be built fails, never skips.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sdk_driver
from image_files import png

from captcha_tasks.gateway import GatewayServer
from captcha_tasks.gateway.server import tls_context
from harness.tls import self_signed

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("worker", "clean_state")]

KEY = "5ca1ab1e" * 4
BUDGET = 100
MODULE_ENV = {
    "CAPTCHAAI_TENANTS": json.dumps(
        {"scrapers": {"key_env": "GW_SCRAPERS_KEY", "daily_captchas": BUDGET}}
    )
}
PAGE = "https://example.com/capmonster"
#: The SDK's own deadlines: 180 s for a reCAPTCHA; the sandbox answers in 0.3 s.
DRIVER_TIMEOUT_S = 60
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "gateway.md"
#: The guide's gateway, replaced by the test's.
GUIDE_URL = "https://gateway.internal:8443"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    certfile, keyfile = self_signed(tmp_path_factory.mktemp("tls"))
    server = GatewayServer(
        tls=tls_context(str(certfile), str(keyfile)), environ={"GW_SCRAPERS_KEY": KEY}
    ).start()
    yield {"url": f"https://127.0.0.1:{server.port}", "ca": certfile}
    server.stop()


def drive(
    python: Path, gateway: dict[str, Any], tasks: list[dict[str, Any]], key: str, out: Path
) -> list[dict[str, Any]]:
    job = {"sdk": "capmonster", "url": gateway["url"], "tasks": tasks, "balance": True}
    proc = sdk_driver.start(python, job, key, gateway["ca"], out)
    return sdk_driver.finish(proc, DRIVER_TIMEOUT_S)


def test_capmonster_solves_recaptcha_turnstile_and_an_image(
    capmonster_python: Path, gateway: dict[str, Any], sandbox: Any, tmp_path: Path
) -> None:
    image = tmp_path / "captcha.png"
    image.write_bytes(png(4096))
    tasks = [
        {"kind": "recaptcha_v2", "sitekey": "6Le-capmonster", "pageurl": PAGE},
        {"kind": "turnstile", "sitekey": "0x4AAAAAAAcapmonster", "pageurl": PAGE},
        {"kind": "image", "image": str(image)},
    ]
    lines = drive(capmonster_python, gateway, tasks, KEY, tmp_path)
    answers = {line["i"]: line for line in lines if "i" in line}
    assert sorted(answers) == [0, 1, 2] and not any("error" in a for a in answers.values()), lines
    recaptcha, turnstile, text = answers[0], answers[1], answers[2]
    # the solution's shape is the one the SDK's users read
    assert set(recaptcha["solution"]) >= {"gRecaptchaResponse"}
    assert set(turnstile["solution"]) >= {"token"}
    assert set(text["solution"]) >= {"text"} and text["token"]
    for answer in (recaptcha, turnstile):
        assert sandbox.verify(answer["token"])["success"] is True
    submits = sandbox.stats()["submits_by_method"]
    assert (submits["userrecaptcha"], submits["turnstile"], submits["base64"]) == (1, 1, 1)
    # getBalance answers what the tenant may still spend: its budget less today's three
    assert [line["balance"] for line in lines if "balance" in line] == [BUDGET - 3]


def test_capmonster_with_a_wrong_key(
    capmonster_python: Path, gateway: dict[str, Any], sandbox: Any, tmp_path: Path
) -> None:
    wrong = "0" * 32
    tasks = [
        {"kind": "recaptcha_v2", "sitekey": "6Le-capmonster", "pageurl": PAGE},
        {"kind": "turnstile", "sitekey": "0x4AAAAAAAcapmonster", "pageurl": PAGE},
    ]
    lines = drive(capmonster_python, gateway, tasks, wrong, tmp_path)
    errors = [line for line in lines if "i" in line]
    assert len(errors) == 2
    for line in errors:  # refused at createTask, as CapMonster refuses an unknown key
        assert line["error"] == "GetTaskError", line
        assert "ERROR_KEY_DOES_NOT_EXIST" in line["message"], line
    [balance] = [line for line in lines if "balance" in line]
    assert balance["balance"] is None and balance["error"] == "GetBalanceError"
    assert "ERROR_KEY_DOES_NOT_EXIST" in balance["message"]
    for line in lines:
        assert wrong not in json.dumps(line) and KEY not in json.dumps(line)
    assert not any(sandbox.stats()["submits_by_method"].values())


def test_the_guides_example_solves_through_the_gateway(
    capmonster_python: Path, gateway: dict[str, Any], sandbox: Any, tmp_path: Path
) -> None:
    text = GUIDE.read_text(encoding="utf-8")
    blocks = [
        code
        for code in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
        if "capmonstercloudclient" in code
    ]
    assert len(blocks) == 1, "the guide shows one CapMonster example"
    [code] = blocks
    assert GUIDE_URL in code
    job = {"sdk": "code", "code": code.replace(GUIDE_URL, gateway["url"]), "print": ["token"]}
    proc = sdk_driver.start(capmonster_python, job, KEY, gateway["ca"], tmp_path)
    [line] = sdk_driver.finish(proc, DRIVER_TIMEOUT_S)
    assert sandbox.verify(line["token"])["success"] is True
