"""``captcha-tasks pingback-server`` and ``captcha-tasks pingback register``, run as a user
runs them: subprocesses against the sandbox and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import requests

from captcha_tasks.core import pingback
from captcha_tasks.testing.processes import free_port, wait_until

pytestmark = pytest.mark.e2e

SECRET = "cli-pingback-secret-0123"


def cli(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "captcha_tasks.cli", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        **kwargs,
    )


def test_register_adds_the_address_at_the_provider(sandbox: Any) -> None:
    url = "https://hooks.example.com/captcha/pingback"
    done = cli(
        "pingback",
        "register",
        env={
            "CAPTCHAAI_BASE_URL": sandbox.url,
            "CAPTCHAAI_PINGBACK_URL": url,
            "CAPTCHAAI_PINGBACK_SECRET": SECRET,
        },
    )
    assert done.returncode == 0, done.stderr
    assert url in done.stdout
    listed = requests.post(
        f"{sandbox.url}/res.php",
        data={"key": os.environ["CAPTCHAAI_API_KEY"], "action": "get_pingback", "json": 1},
        timeout=5,
    ).json()
    assert url in listed["request"]


def test_register_without_an_address_says_what_is_missing() -> None:
    done = cli("pingback", "register", env={"CAPTCHAAI_PINGBACK_URL": ""})
    assert done.returncode == 1
    assert done.stderr.strip().endswith("CAPTCHAAI_PINGBACK_URL is not set (or pass --url)")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_server_refuses_to_start_without_a_secret() -> None:
    done = cli("pingback-server", "--port", str(free_port()), env={"CAPTCHAAI_PINGBACK_SECRET": ""})
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1
    assert "CAPTCHAAI_PINGBACK_SECRET" in done.stderr


def test_the_server_judges_callbacks() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "captcha_tasks.cli", "pingback-server", "--port", str(port)],
        env={**os.environ, "CAPTCHAAI_PINGBACK_SECRET": SECRET},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}/captcha/pingback"

        def up() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok
            except requests.ConnectionError:
                return False

        wait_until(up, 15, what="the pingback server")
        ticket = pingback.ticket(SECRET, "some-solve", 0)
        forged = pingback.ticket("not-the-secret-at-all", "some-solve", 0)
        fields = {"id": "123", "code": "0.tok"}
        assert requests.get(f"{base}/{forged}", params=fields, timeout=5).status_code == 403
        # a right MAC for a captcha not on the board (yet): kept for when it registers
        early = requests.post(f"{base}/{ticket}", data=fields, timeout=5)
        assert (early.status_code, early.text) == (202, "early")
        again = requests.post(f"{base}/{ticket}", data={**fields, "code": "0.other"}, timeout=5)
        assert (again.status_code, again.text) == (409, "replay")  # the first word stands
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


def test_the_server_refuses_a_bad_network_in_one_line() -> None:
    done = cli(
        "pingback-server",
        "--port",
        str(free_port()),
        env={"CAPTCHAAI_PINGBACK_SECRET": SECRET, "CAPTCHAAI_PINGBACK_ALLOW": "203.0.113.0/33"},
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "CAPTCHAAI_PINGBACK_ALLOW" in lines[0] and "'203.0.113.0/33'" in lines[0]


def test_the_server_refuses_a_limit_below_one() -> None:
    done = cli(
        "pingback-server", "--max-per-address", "0", env={"CAPTCHAAI_PINGBACK_SECRET": SECRET}
    )
    assert done.returncode == 2
    assert "--max-per-address" in done.stderr
