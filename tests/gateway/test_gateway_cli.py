"""``captcha-tasks gateway`` run as a user runs it: a subprocess, its keys in its
environment, refusing to start with one line naming what is wrong."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
import requests

from captcha_tasks.testing.processes import free_port, wait_until

pytestmark = pytest.mark.e2e

KEY = "cli-" + "c" * 28
TENANTS = json.dumps({"cli": {"key_env": "GW_CLI_KEY"}})


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "captcha_tasks.cli", "gateway", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CAPTCHAAI_TENANTS": ""}, "key_env"),
        ({"CAPTCHAAI_TENANTS": TENANTS, "GW_CLI_KEY": ""}, "GW_CLI_KEY"),
        ({"CAPTCHAAI_TENANTS": TENANTS, "GW_CLI_KEY": "short"}, "GW_CLI_KEY"),
        (
            {
                "CAPTCHAAI_TENANTS": TENANTS,
                "GW_CLI_KEY": KEY,
                "CAPTCHAAI_GATEWAY_ALLOW": "10.0.0.0/33",
            },
            "CAPTCHAAI_GATEWAY_ALLOW",
        ),
    ],
)
def test_the_gateway_refuses_to_start_in_one_line(env: dict[str, str], named: str) -> None:
    done = cli("--port", str(free_port()), env=env)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]
    assert KEY not in done.stderr and "short" not in done.stderr.replace(named, "")


def test_tls_files_that_cannot_be_read_are_one_line(tmp_path: Any) -> None:
    missing = tmp_path / "nope.pem"
    env = {"CAPTCHAAI_TENANTS": TENANTS, "GW_CLI_KEY": KEY}
    done = cli("--certfile", str(missing), env=env)
    assert done.returncode == 1 and "--certfile" in done.stderr
    assert cli("--keyfile", str(missing), env=env).returncode == 2


def test_the_gateway_serves_and_stops_on_sigterm(redis_url: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "captcha_tasks.cli", "gateway", "--port", str(port)],
        env={**os.environ, "REDIS_URL": redis_url, "CAPTCHAAI_TENANTS": TENANTS, "GW_CLI_KEY": KEY},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return requests.get(f"{base}/health", timeout=1).ok
            except requests.ConnectionError:
                return False

        wait_until(up, 15, what="the gateway")
        answer = requests.get(
            f"{base}/res.php", params={"key": KEY, "action": "getbalance"}, timeout=5
        )
        assert answer.status_code == 200 and float(answer.text) >= 0
        wrong = requests.post(f"{base}/getBalance", json={"clientKey": "w" * 32}, timeout=5)
        assert wrong.json()["errorCode"] == "ERROR_KEY_DOES_NOT_EXIST"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert f"gateway on http://127.0.0.1:{port}" in out
    assert KEY not in out + err
