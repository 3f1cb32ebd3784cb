"""The README's first command: the whole stack and a demo batch, from nothing; kept
running, its settings for another shell; stopped by Ctrl-C, SIGTERM or SIGHUP alike."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from captcha_tasks.testing.processes import free_port, redis_reachable, wait_until

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = [sys.executable, "-m", "captcha_tasks.cli", "quickstart"]
CLI = [sys.executable, "-m", "captcha_tasks.cli"]


def user_env(tmp_path: Path) -> dict[str, str]:
    """A new user's shell: no captcha-tasks settings, nothing listening at REDIS_URL; the
    quickstart's folder and temporary files under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPTCHAAI_")}
    env["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["TMPDIR"] = str((tmp_path / "tmp").resolve())
    (tmp_path / "tmp").mkdir()
    return env


def quickstart_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "captcha-tasks" / "quickstart"


def test_quickstart_solves_a_demo_batch_and_cleans_up(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    count = 4
    done = subprocess.run(
        [*QUICKSTART, "--count", str(count)],
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
    assert list((tmp_path / "tmp").iterdir()) == []  # no temporary folder left behind
    logs = quickstart_dir(tmp_path)
    assert f"logs in {logs}" in out
    assert (logs / "worker1.log").exists()
    assert "captcha-tasks quickstart --keep-running" in out.split("solved in", 1)[1]  # next


# Its first step installs the package and every dependency into a fresh .venv with pip
# (77-108 s in CI runs, on a loaded machine): the run's own limit is 300 s, as below.
@pytest.mark.timeout(300)
def test_the_script_says_only_what_the_quickstart_says(tmp_path: Path) -> None:
    # ./scripts/quickstart as a new user runs it: the install is quiet (no build backend
    # warnings), the demo runs, the last lines say what to do next.
    env = user_env(tmp_path)
    done = subprocess.run(
        [str(ROOT / "scripts" / "quickstart"), "--count", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
    assert done.stdout.startswith("logs in "), done.stdout[:500]
    assert "2/2 solved" in done.stdout
    assert done.stdout.rstrip().splitlines()[-4].startswith("next:")


def test_a_failed_run_leaves_no_temporary_folder(tmp_path: Path) -> None:
    env = {**user_env(tmp_path), "CAPTCHAAI_THREADS": "0"}
    done = subprocess.run(
        [*QUICKSTART, "--count", "1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "CAPTCHAAI_THREADS must be at least 1" in done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


# -- --keep-running ---------------------------------------------------------------------------


class KeptStack:
    """``quickstart --keep-running`` as a user starts it in a terminal."""

    def __init__(self, tmp_path: Path) -> None:
        self.env = user_env(tmp_path)
        self.out = tmp_path / "quickstart.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [*QUICKSTART, "--count", "2", "--keep-running"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        return self.out.read_text()

    def wait_running(self) -> str:
        def running() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"quickstart exited early:\n{self.text()}")
            return "Ctrl-C, SIGTERM" in self.text()

        wait_until(running, 120, interval=0.2, what="the quickstart stack")
        return self.text()

    def children(self) -> list[int]:
        """Processes the quickstart started (Redis, worker, beat), by parent pid."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited while we looked
            if int(fields[1]) == self.proc.pid:
                found.append(int(stat.parent.name))
        return found

    def stop(self) -> None:
        """Ctrl-C; whatever still runs after it (the quickstart, or a child it left) is
        killed, so a failed test leaks no process."""
        children = self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in children:  # each leads a session of its own (Redis, a worker, beat)
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def kept_stack(tmp_path: Path) -> Iterator[KeptStack]:
    stack = KeptStack(tmp_path)
    yield stack
    stack.stop()


def parse_exports(text: str) -> dict[str, str]:
    exports = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            exports[name] = value
    return exports


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)


def check_commands_work(env: dict[str, str], threads: int, tmp_path: Path) -> None:
    account = cli(env, "account")
    assert account.returncode == 0, account.stderr
    assert f"threads (this deployment): 0/{threads} in use" in account.stdout
    solved = cli(env, "solve", "--method", "turnstile", "--sitekey", "k",
                 "--pageurl", "https://example.com/qs", "--json")  # fmt: skip
    assert solved.returncode == 0, solved.stderr
    assert '"status": "solved"' in solved.stdout
    tasks = tmp_path / "tasks.csv"
    tasks.write_text("method,sitekey,pageurl\nturnstile,k,https://example.com/qs\n")
    batch = cli(env, "batch", str(tasks), "-o", str(tmp_path / "out.jsonl"))
    assert batch.returncode == 0, batch.stderr
    assert cli(env, "pool", "status").returncode == 0
    port = free_port()
    metrics = subprocess.Popen([*CLI, "metrics", "--port", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def scrape() -> str | None:
            try:
                return requests.get(url, timeout=5).text
            except requests.ConnectionError:
                return None

        text = wait_until(scrape, 30, interval=0.2, what="the metrics exporter")
        assert f"captcha_tasks_threads_plan {float(threads)}" in str(text)
    finally:
        metrics.terminate()
        metrics.wait(10)


def test_kept_stack_prints_its_settings_for_another_shell(
    kept_stack: KeptStack, tmp_path: Path
) -> None:
    out = kept_stack.wait_running()
    env_file = quickstart_dir(tmp_path) / "quickstart.env"
    assert f"source {env_file}" in out
    exports = parse_exports(env_file.read_text())
    assert parse_exports(out) == exports  # the pasted block and the file agree
    assert set(exports) >= {
        "REDIS_URL", "CAPTCHAAI_BASE_URL", "CAPTCHAAI_API_KEY", "CAPTCHAAI_THREADS"
    }  # fmt: skip
    sandbox = re.search(r"started the sandbox API at (\S+)", out)
    assert sandbox is not None and exports["CAPTCHAAI_BASE_URL"] == sandbox.group(1)
    # Another shell: the user's environment plus the file, as `source` gives it.
    shell = {**kept_stack.env, **exports}
    check_commands_work(shell, int(exports["CAPTCHAAI_THREADS"]), tmp_path)


def test_a_process_that_dies_stops_the_kept_stack_and_says_which(
    kept_stack: KeptStack,
) -> None:
    kept_stack.wait_running()
    children = kept_stack.children()
    [redis] = [pid for pid in children if b"-server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    os.kill(redis, signal.SIGKILL)
    assert kept_stack.proc.wait(30) == 1
    said = kept_stack.text().rsplit("Ctrl-C, SIGTERM", 1)[1]
    assert "redis exited (code -9; log: " in said
    assert "stopping the stack" in said
    assert [pid for pid in children if alive(pid)] == []  # the worker and beat too


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_every_process(
    kept_stack: KeptStack, tmp_path: Path, signum: int
) -> None:
    kept_stack.wait_running()
    children = kept_stack.children()
    assert len(children) == 3  # Redis, the worker and beat
    redis_url = parse_exports(kept_stack.text())["REDIS_URL"]
    kept_stack.proc.send_signal(signum)
    assert kept_stack.proc.wait(60) == 0
    assert [pid for pid in children if alive(pid)] == []  # none left re-parented to init
    assert not redis_reachable(redis_url)
    assert not (quickstart_dir(tmp_path) / "quickstart.env").exists()
    assert list((tmp_path / "tmp").iterdir()) == []
