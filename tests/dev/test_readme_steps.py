"""Steps a new user copies from the README and the site's "Running the processes", run as
written: activating ``.venv`` in a new shell, the sandbox's documented key, the README's
process lines (the site's own), and the ``pingback-server`` line (with its ``GET /health``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from captcha_tasks.testing.processes import free_port, wait_until

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PROCESSES = (ROOT / "docs" / "operations" / "processes.md").read_text(encoding="utf-8")
VENV_BIN = Path(sys.prefix) / "bin"


def new_shell() -> dict[str, str]:
    """A new terminal: no virtualenv on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if Path(p).resolve() != VENV_BIN.resolve()
    )
    return env


def bash(script: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_in_a_new_shell_activating_the_venv_is_what_makes_it_work() -> None:
    assert "`source .venv/bin/activate`" in README
    env = new_shell()
    # What the README tells the user to do, with the virtualenv the scripts made (this one).
    activate = f"source {VENV_BIN / 'activate'}"
    done = bash(f"{activate} && captcha-tasks --version && python -c 'import captcha_tasks'", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("captcha-tasks, version ")


def test_the_documented_sandbox_key_is_the_one_it_accepts(tmp_path: Path) -> None:
    [key] = set(re.findall(r"CAPTCHAAI_API_KEY=(sandbox-key)\b", PROCESSES))
    # and the quickstart's is said to be another one, on the front page and the site
    assert "random key" in README and "random key" in PROCESSES
    port = free_port()
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "captcha_tasks.cli", "sandbox", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{url}/sandbox/stats"), 15, what="the sandbox")
        env = {**os.environ, "CAPTCHAAI_BASE_URL": url, "CAPTCHAAI_API_KEY": key}
        done = subprocess.run(
            [sys.executable, "-m", "captcha_tasks.cli", "account"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("balance: ")
    finally:
        sandbox.terminate()
        sandbox.wait(10)


def bash_blocks(page: str) -> list[str]:
    """The ```bash blocks of a page, continued lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", page, re.S)
    return [block.replace("\\\n", " ") for block in blocks]


def test_the_readmes_process_lines_are_the_sites() -> None:
    [running] = [b for b in bash_blocks(README) if "celery -A captcha_tasks worker" in b]
    site = {command(line) for block in bash_blocks(PROCESSES) for line in block.splitlines()}
    for line in running.splitlines():
        assert command(line) in site, line


def command(line: str) -> str:
    """A shell line without its comment."""
    return line.split("#", 1)[0].strip()


def documented_pingback_server() -> str:
    """The ``pingback-server`` command of "Running the processes", as one line."""
    [line] = [
        line
        for block in bash_blocks(PROCESSES)
        for line in block.splitlines()
        if "captcha-tasks pingback-server" in line
    ]
    return command(line)


def test_the_documented_pingback_server_line_starts_and_answers_health() -> None:
    port = free_port()
    command = documented_pingback_server().replace("--port 8766", f"--port {port}")
    # A shell where the virtualenv is active, as the README says.
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    server = subprocess.Popen(
        ["bash", "-c", f"exec env {command}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        health = f"http://127.0.0.1:{port}/health"
        wait_until(lambda: _answers(health) or server.poll() is not None, 20, what=health)
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        assert requests.get(health, timeout=5).text == "ok"
    finally:
        server.terminate()
        server.wait(10)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).ok
    except requests.ConnectionError:
        return False
