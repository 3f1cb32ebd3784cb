"""CapMonster Cloud's official SDK (``capmonstercloudclient``) against the sandbox's
``capmonster`` dialect directly, the way a JSON-family provider is tested without a
real account: reCAPTCHA v2, Turnstile and an image solve, and a wrong key.  If what the
sandbox's dialect answers drifts from what the SDK reads, this fails.

The SDK runs in its own virtual environment (it pins its dependencies to exact versions,
``tests/pip_cache.py``) through this folder's ``sdk_driver.py`` (shared with the
gateway's SDK tests).  Under CI=true an environment that cannot be built fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sdk_driver
from image_files import png

from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from harness.tls import self_signed

pytestmark = pytest.mark.system

KEY = "c0ffee00" * 4
PAGE = "https://example.com/capmonster-sandbox"
DRIVER_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def capmonster_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    config = SandboxConfig(kind="capmonster", api_keys=(KEY,), solve_time=0.3, jitter=0.1)
    with SandboxServer(config) as server:
        # The driver trusts a CA file for HTTPS; the sandbox speaks plain HTTP, so any
        # certificate does.
        certfile, _ = self_signed(tmp_path_factory.mktemp("tls"))
        yield {"url": server.url, "ca": certfile, "server": server}


def drive(
    python: Path, sandbox: dict[str, Any], tasks: list[dict[str, Any]], key: str, out: Path
) -> list[dict[str, Any]]:
    job = {"sdk": "capmonster", "url": sandbox["url"], "tasks": tasks, "balance": True}
    proc = sdk_driver.start(python, job, key, sandbox["ca"], out)
    return sdk_driver.finish(proc, DRIVER_TIMEOUT_S)


def verify(url: str, token: str) -> dict[str, Any]:
    return dict(requests.post(f"{url}/siteverify", data={"response": token}, timeout=5).json())


def test_capmonster_sdk_solves_recaptcha_turnstile_and_an_image_at_the_sandbox(
    capmonster_python: Path, capmonster_sandbox: dict[str, Any], tmp_path: Path
) -> None:
    image = tmp_path / "captcha.png"
    image.write_bytes(png(4096))
    tasks = [
        {"kind": "recaptcha_v2", "sitekey": "6Le-sandbox", "pageurl": PAGE},
        {"kind": "turnstile", "sitekey": "0x4AAAAAAAsandbox", "pageurl": PAGE},
        {"kind": "image", "image": str(image)},
    ]
    before = capmonster_sandbox["server"].stats()["submits_by_method"]
    lines = drive(capmonster_python, capmonster_sandbox, tasks, KEY, tmp_path)
    answers = {line["i"]: line for line in lines if "i" in line}
    assert sorted(answers) == [0, 1, 2] and not any("error" in a for a in answers.values()), lines
    recaptcha, turnstile, text = answers[0], answers[1], answers[2]
    assert set(recaptcha["solution"]) >= {"gRecaptchaResponse"}
    assert set(turnstile["solution"]) >= {"token"}
    assert set(text["solution"]) >= {"text"} and text["token"]
    for answer in (recaptcha, turnstile):
        assert verify(capmonster_sandbox["url"], answer["token"])["success"] is True
    after = capmonster_sandbox["server"].stats()["submits_by_method"]
    assert {m: after[m] - before.get(m, 0) for m in ("userrecaptcha", "turnstile", "base64")} == {
        "userrecaptcha": 1,
        "turnstile": 1,
        "base64": 1,
    }
    [balance] = [line for line in lines if "balance" in line]
    assert isinstance(balance["balance"], int | float) and balance.get("error") is None


def test_capmonster_sdk_with_a_wrong_key_at_the_sandbox(
    capmonster_python: Path, capmonster_sandbox: dict[str, Any], tmp_path: Path
) -> None:
    wrong = "0" * 32
    tasks = [{"kind": "turnstile", "sitekey": "0x4AAAAAAAsandbox", "pageurl": PAGE}]
    lines = drive(capmonster_python, capmonster_sandbox, tasks, wrong, tmp_path)
    [error] = [line for line in lines if "i" in line]
    assert error["error"] == "GetTaskError" and "ERROR_KEY_DOES_NOT_EXIST" in error["message"]
    [balance] = [line for line in lines if "balance" in line]
    assert balance["balance"] is None and "ERROR_KEY_DOES_NOT_EXIST" in balance["message"]
    assert all(wrong not in json.dumps(line) for line in lines)
