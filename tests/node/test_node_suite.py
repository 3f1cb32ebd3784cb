"""The Node.js client (``clients/node``) against this run's Redis, the Python package and
the sandbox API: its own ``node --test`` suite, run once with the test's Redis URL and key
prefix, must pass whole (nothing skipped).  What it covers is in ``clients/node/test``:
the Lua, key names and error tree are Python's; Python pools and Node takes; a race of 4
Node and 4 Python processes; cookies, the session lock and proxy leases both ways; a Redis
restart during takes; solve() and the puppeteer-extra provider through the sandbox."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from npm_cache import missing_node, node_modules
from system_parts import missing

from captcha_tasks.testing.processes import find_redis_server

pytestmark = pytest.mark.e2e

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "node"


@pytest.fixture(scope="module")
def node_path(output_dir: Path) -> str:
    problem = missing_node()
    if problem:
        missing("Node.js", problem)
    return str(node_modules(PACKAGE, output_dir / "npm-clients-node.log"))


@pytest.mark.timeout(300)
def test_node_suite_passes_against_redis_python_and_the_sandbox(
    node_path: str, redis_url: str, env: dict[str, str], sandbox: Any, output_dir: Path
) -> None:
    tests = sorted(str(path) for path in (PACKAGE / "test").glob("*.test.js"))
    run_env = {
        **os.environ,
        "NODE_PATH": node_path,
        "REDIS_URL": redis_url,
        "CAPTCHAAI_KEY_PREFIX": env["CAPTCHAAI_KEY_PREFIX"],
        "CT_PYTHON": sys.executable,
        "CT_REDIS_SERVER": find_redis_server(),
        "CT_GATEWAY_URL": sandbox.url,
        "CT_GATEWAY_KEY": env["CAPTCHAAI_API_KEY"],
    }
    node = shutil.which("node") or "node"
    run = subprocess.run(
        [node, "--test", "--test-reporter=tap", *tests],
        cwd=PACKAGE,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    (output_dir / "node-client-tests.tap").write_text(run.stdout + run.stderr)
    summary = dict(re.findall(r"^# (pass|fail|skipped|cancelled|todo) (\d+)$", run.stdout, re.M))
    assert run.returncode == 0, f"node --test failed:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert summary.get("fail") == "0" and summary.get("cancelled") == "0", summary
    assert summary.get("skipped") == "0", f"every Node test runs here: {summary}"
    assert int(summary.get("pass", "0")) >= 20, summary
