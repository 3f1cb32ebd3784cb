"""The README's first command: the whole stack and a demo batch, from nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from captcha_tasks.dev.devstack import free_port, redis_reachable

pytestmark = pytest.mark.slow


def test_quickstart_solves_a_demo_batch_and_cleans_up() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPTCHAAI_")}
    env["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    count = 4
    done = subprocess.run(
        [sys.executable, "-m", "captcha_tasks.cli", "quickstart", "--count", str(count)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not reachable: started a local server" in out
    assert "started the sandbox API" in out
    assert out.count("siteverify=ok") == count
    assert f"{count}/{count} solved" in out
    started = re.search(r"started a local server at (redis://\S+)", out)
    assert started is not None
    assert not redis_reachable(started.group(1))  # the server it started is gone
