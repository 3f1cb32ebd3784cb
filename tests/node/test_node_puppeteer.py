"""The npm package's puppeteer-extra-plugin-recaptcha provider in headless Chromium
(puppeteer-core driving the system's ``chromium``, puppeteer-extra with the plugin): a login
page's reCAPTCHA v2 is found by the plugin, solved through the gateway with a tenant's key
by a real worker against the sandbox, and its token entered in the page's
``g-recaptcha-response`` (and given to the page's callback).  When a pool matches the
sitekey, the provider takes the pooled token instead, and the sandbox solves nothing.

The browser side is ``clients/node/test/fixtures/solve_page.js``; its page carries a
stand-in for Google's ``api.js`` (commented there: it cannot load without internet).
Everything else is real.  Under ``CI`` a missing Node.js or Chromium fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from npm_cache import missing_node, node_modules
from system_parts import missing

from captcha_tasks.gateway import GatewayServer
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.tasks import create_pool, prewarm

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "node"
SCRIPT = PACKAGE / "test" / "fixtures" / "solve_page.js"
TENANT_KEY = "scraper-" + "c" * 24
MODULE_ENV = {"CAPTCHAAI_TENANTS": json.dumps({"scraper": {"key_env": "GW_SCRAPER_KEY"}})}
SOLVED_SITEKEY = "6Lc-puppeteer-solved"
POOLED_SITEKEY = "6Lc-puppeteer-pooled"
POOL = "puppeteer-login"
POOL_PAGE = "https://shop.example/login"
#: Seconds the browser script may take (a solve here takes well under one).
RUN_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def node_path(output_dir: Path) -> str:
    problem = missing_node()
    if problem:
        missing("Node.js", problem)
    return str(node_modules(PACKAGE, output_dir / "npm-clients-node.log"))


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        missing("Chromium", "no `chromium` on PATH (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def gateway(worker: Any) -> Iterator[GatewayServer]:
    server = GatewayServer(environ={"GW_SCRAPER_KEY": TENANT_KEY})
    server.start()
    yield server
    server.stop()


@pytest.fixture
def solve_page(
    node_path: str,
    chromium: str,
    gateway: GatewayServer,
    redis_url: str,
    env: dict[str, str],
    output_dir: Path,
) -> Any:
    """Run solve_page.js on a page with ``sitekey``; the page's outcome (JSON)."""
    run_env = {
        **os.environ,
        "NODE_PATH": node_path,
        "REDIS_URL": redis_url,
        "CAPTCHAAI_KEY_PREFIX": env["CAPTCHAAI_KEY_PREFIX"],
        "CT_GATEWAY_URL": gateway.url,
        "CT_GATEWAY_KEY": TENANT_KEY,
        "CT_CHROMIUM": chromium,
        "CT_POOLS": json.dumps({POOLED_SITEKEY: POOL}),
    }

    def run(sitekey: str) -> dict[str, Any]:
        code, out, err = _run_node([SCRIPT.name, sitekey], run_env)
        (output_dir / f"puppeteer-{sitekey}.log").write_text(out + err)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        pids = [line["browser_pid"] for line in lines if "browser_pid" in line]
        for pid in pids:
            _gone(pid)
        assert code == 0, f"solve_page.js exit {code}:\n{out[-3000:]}\n{err[-3000:]}"
        for secret in (TENANT_KEY, env["CAPTCHAAI_API_KEY"]):
            assert secret not in out + err
        assert len(pids) == 1 and len(lines) == 2, out
        return dict(lines[-1])

    return run


def _run_node(args: list[str], run_env: dict[str, str]) -> tuple[int, str, str]:
    node = shutil.which("node") or "node"
    proc = subprocess.Popen(
        [node, *args],
        cwd=SCRIPT.parent,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # puppeteer closes its browser on SIGTERM
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"solve_page.js ran over {RUN_TIMEOUT_S} s:\n{out[-3000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _gone(pid: int) -> None:
    """Chromium (pid ``pid``) has exited with the script; if not, it is killed and the test
    fails."""
    try:
        wait_until(lambda: not _running(pid), 10, what=f"Chromium (pid {pid}) to exit")
    except TimeoutError:
        # puppeteer starts the browser in a process group of its own
        os.killpg(pid, signal.SIGKILL)
        raise


def _one_solution(page: dict[str, Any], sitekey: str) -> str:
    """The page's one reCAPTCHA was found and answered by our provider; its token, which is
    in the page's g-recaptcha-response and was given to its callback."""
    assert page["found"] == [{"sitekey": sitekey, "url": page["url"], "type": "checkbox"}]
    assert page["error"] is None, page["error"]
    [solution] = page["solutions"]
    assert solution["provider"] == "captcha-tasks" and solution["hasSolution"], solution["error"]
    assert page["solved"] == [{"isSolved": True, "responseElement": True, "responseCallback": True}]
    token = str(page["response"])
    assert token and token == solution["text"] == page["callback"]
    return token


@pytest.mark.timeout(300)
def test_the_plugin_solves_a_pages_recaptcha_through_the_gateway(
    solve_page: Any, sandbox: Any
) -> None:
    page = solve_page(SOLVED_SITEKEY)
    token = _one_solution(page, SOLVED_SITEKEY)
    assert sandbox.stats()["submits"] == 1
    verdict = sandbox.verify(token)
    assert verdict["success"], verdict
    assert (verdict["method"], verdict["sitekey"]) == ("userrecaptcha", SOLVED_SITEKEY)
    assert verdict["pageurl"] == page["url"]
    assert sandbox.verify(token) == {"success": False, "error-codes": ["already-used"]}


@pytest.mark.timeout(300)
def test_a_pool_matching_the_sitekey_answers_the_page_without_a_solve(
    solve_page: Any, sandbox: Any, state: Any
) -> None:
    create_pool(POOL, "userrecaptcha", POOLED_SITEKEY, POOL_PAGE, size=1, ttl=100)
    assert prewarm.delay(POOL).get(timeout=30) == {POOL: 1}
    wait_until(lambda: state.pools.live(POOL) == 1, 30, what="the worker to fill the pool")
    assert sandbox.stats()["submits"] == 1
    token = _one_solution(solve_page(POOLED_SITEKEY), POOLED_SITEKEY)
    assert state.pools.live(POOL) == 0
    assert sandbox.stats()["submits"] == 1, "the provider took from the pool: no new solve"
    verdict = sandbox.verify(token)
    assert verdict["success"], verdict
    assert (verdict["sitekey"], verdict["pageurl"]) == (POOLED_SITEKEY, POOL_PAGE)
    assert sandbox.verify(token) == {"success": False, "error-codes": ["already-used"]}
