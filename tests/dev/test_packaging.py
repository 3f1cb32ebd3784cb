"""The package as users get it: ``python -m build`` makes a wheel and an sdist that pass
``twine check --strict``, and the wheel, installed alone in a fresh virtualenv and run from
another folder, solves a captcha through its own sandbox and worker (no file of the source
tree on its path)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import requests

from captcha_tasks.testing.processes import free_port, wait_until

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
VERSION = version("captcha-tasks")
#: What a process needs at run time, beyond the Python modules: inside the wheel.
RUNTIME_FILES = [
    "captcha_tasks/py.typed",
    "captcha_tasks/worker/config.py",
    "captcha_tasks/state/lua/__init__.py",
    *(f"captcha_tasks/schemas/{p.name}" for p in (ROOT / "captcha_tasks/schemas").glob("*.json")),
    # every Lua script and fragment: what Redis runs (and a Node client loads)
    *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "captcha_tasks/state/lua").rglob("*.lua"))),
]
#: The test harness (the Sentinel cluster, the Kafka broker, the connection flood ...): the
#: tests and benchmarks import it from the source tree; users never run it.


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel (built from the sdist, as ``python -m build`` does) and the sdist."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    [found] = dist.glob(pattern)
    return found


def test_wheel_and_sdist_pass_twine_check_strict(dist: Path) -> None:
    wheel = _one(dist, f"captcha_tasks-{VERSION}-py3-none-any.whl")
    sdist = _one(dist, f"captcha_tasks-{VERSION}.tar.gz")
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_wheel_holds_what_runs_and_nothing_of_the_tree_around_it(dist: Path) -> None:
    names = zipfile.ZipFile(_one(dist, "*.whl")).namelist()
    for path in RUNTIME_FILES:
        assert path in names, path
    assert [n for n in names if n.split("/", 1)[0] == "harness"] == []
    # nothing in the package that its source tree lacks (a harness module copied in): by
    # path, as the harness's names may be the package's too (acceptance.py)
    strays = [n for n in names if n.startswith("captcha_tasks/") and not (ROOT / n).exists()]
    assert strays == [], strays
    assert not [n for n in names if n.startswith("captcha_tasks/dev/")]
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"captcha_tasks", f"captcha_tasks-{VERSION}.dist-info"}, tops
    entry_points = zipfile.ZipFile(_one(dist, "*.whl")).read(
        f"captcha_tasks-{VERSION}.dist-info/entry_points.txt"
    )
    assert b"captcha-tasks = captcha_tasks.cli:main" in entry_points
    with tarfile.open(_one(dist, "*.tar.gz")) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for path in RUNTIME_FILES:
        assert path in members, path


# -- the wheel alone, in a fresh virtualenv ---------------------------------------------------


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin = path / "bin"

    def run(self, *argv: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
        done = subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A new virtualenv (its own interpreter, no access to ours) with the wheel and its
    dependencies from the package index, and nothing else."""
    venv = Venv(tmp_path_factory.mktemp("venv") / "env")
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv.path)], check=True)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv.bin / "python"),
         str(_one(dist, "*.whl"))],
        check=True,
        timeout=600,
    )  # fmt: skip
    return venv


def user_env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    """A user's shell: nothing of this test run's environment but PATH and the Redis URL."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "REDIS_URL": redis_url,
        "CAPTCHAAI_KEY_PREFIX": f"wheel-{os.getpid()}",
        "CAPTCHAAI_QUEUE_PREFIX": f"wheel-{os.getpid()}",
        "CAPTCHAAI_POLL_INTERVAL": "0.25",
        "CAPTCHAAI_INITIAL_WAIT": "0.3",
    }


class Started:
    """Processes started from the installed venv; every one stopped at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, venv: Venv, *argv: str, cwd: Path, env: dict[str, str], name: str) -> Path:
        log = self.log_dir / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(venv.bin / argv[0]), *argv[1:]],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append((proc, log))
        return log

    def stop(self) -> None:
        for proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


@pytest.fixture
def started(output_dir: Path) -> Iterator[Started]:
    processes = Started(output_dir)
    yield processes
    processes.stop()


SOLVE = """
import json, captcha_tasks
from captcha_tasks import solve
result = solve.delay(method="turnstile", sitekey="0x4AAAwheel", pageurl="https://example.com/w")
print(json.dumps({"file": captcha_tasks.__file__, "result": result.get(timeout=60)}))
"""


def test_the_wheel_alone_solves_through_its_own_sandbox_and_worker(
    installed: Venv, started: Started, tmp_path: Path, redis_url: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = user_env(tmp_path, redis_url)
    assert venv_version(installed, elsewhere, env) == VERSION
    port, key = free_port(), "wheel-key"
    sandbox_log = started.start(
        installed, "captcha-tasks", "sandbox", "--port", str(port), "--api-key", key,
        "--solve-time", "0.3", "--jitter", "0.1", cwd=elsewhere, env=env, name="wheel-sandbox",
    )  # fmt: skip
    sandbox = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(sandbox), 30, what=f"the sandbox ({sandbox_log})")
    env.update(CAPTCHAAI_BASE_URL=sandbox, CAPTCHAAI_API_KEY=key)
    queues = ",".join(f"{env['CAPTCHAAI_QUEUE_PREFIX']}.{k}" for k in
                      ("solve", "submit", "poll", "housekeeping"))  # fmt: skip
    worker_log = started.start(
        installed, "celery", "-A", "captcha_tasks", "worker", "-P", "threads", "-c", "4",
        "-Q", queues, "--without-gossip", "--without-mingle", "-l", "INFO",
        cwd=elsewhere, env=env, name="wheel-worker",
    )  # fmt: skip
    wait_until(lambda: " ready." in worker_log.read_text(), 60, what=f"the worker ({worker_log})")
    out = json.loads(installed.run("python", "-c", SOLVE, cwd=elsewhere, env=env))
    assert Path(out["file"]).is_relative_to(installed.path), out["file"]
    assert out["result"]["status"] == "solved"
    verdict = requests.post(f"{sandbox}/siteverify", data={"response": out["result"]["token"]},
                            timeout=5).json()  # fmt: skip
    assert verdict["success"] is True  # a token this sandbox issued, used once


def venv_version(venv: Venv, cwd: Path, env: dict[str, str]) -> str:
    printed = venv.run("captcha-tasks", "--version", cwd=cwd, env=env)
    return printed.strip().rsplit(" ", 1)[-1]


def _answers(url: str) -> bool:
    try:
        return requests.get(f"{url}/sandbox/stats", timeout=2).ok
    except requests.ConnectionError:
        return False
