"""``celery -A captcha_tasks worker|beat|flower`` refuse to start with a bad setting (and a
worker without an API key): one line naming the variable, exit 78, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from captcha_tasks.testing.processes import free_port
from captcha_tasks.worker.startup import EXIT_CONFIG

pytestmark = pytest.mark.e2e

CELERY = [sys.executable, "-m", "celery", "-A", "captcha_tasks"]


def celery(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A process that did start would run until the timeout: the test then fails loudly.
    return subprocess.run([*CELERY, *args], env=env, capture_output=True, text=True, timeout=60)


def without(*names: str, **changes: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(changes, FLOWER_BASIC_AUTH="ops:secret")
    return env


def output_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]


def test_a_worker_without_an_api_key_refuses_to_start() -> None:
    done = celery("worker", "-P", "threads", "--without-gossip", "--without-mingle",
                  env=without("CAPTCHAAI_API_KEY"))  # fmt: skip
    assert done.returncode == EXIT_CONFIG
    [line] = output_lines(done)
    assert "ConfigurationError" in line
    assert "CAPTCHAAI_API_KEY is not set" in line


ROLES: dict[str, tuple[str, ...]] = {
    "worker": ("worker", "-P", "threads", "--without-gossip", "--without-mingle"),
    "beat": ("beat",),
    "flower": ("flower", "--address=127.0.0.1", "--port=0"),
}
BAD = [
    ("CAPTCHAAI_THREADS", "0"),
    ("CAPTCHAAI_POLL_INTERVAL", "soon"),
    ("REDIS_URL", "http://localhost:6379"),
    ("CAPTCHAAI_POOLS", "[{"),
    ("REDIS_SENTINEL_MASTER", "main"),  # read only with a sentinel:// REDIS_URL
]


# Every bad setting stops a worker; beat and Flower read the same settings object at start,
# so two of them (a number, the Redis URL) show they stop too.  Each case starts a Python
# process (~1 CPU-s): the whole matrix would add six that test nothing more.
CASES = [("worker", var, value) for var, value in BAD] + [
    (role, var, value) for role in ("beat", "flower") for var, value in BAD[:3:2]
]


@pytest.mark.parametrize(("role", "var", "value"), CASES)
def test_a_bad_setting_stops_every_process_in_one_line(role: str, var: str, value: str) -> None:
    done = celery(*ROLES[role], env=without(**{var: value}))
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    [line] = output_lines(done)
    assert line.startswith(f"celery {role}: ConfigurationError: {var}")


def logs_until(argv: list[str], env: dict[str, str], says: str, deadline_s: float = 60) -> str:
    """Start ``argv`` and read its log (stderr) line by line until a line says ``says``,
    it exits, or ``deadline_s`` passes (a loaded machine may take long to import it), then
    kill it; returns what it logged up to there.  Killed, not terminated: beat logs
    "Starting" just before its start-up signal handlers run, and a SIGTERM among them (its
    handler closes the scheduler from inside the signal) left it hung on loaded CI runs."""
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    timer = threading.Timer(deadline_s, proc.kill)  # for a process that hangs silently
    timer.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if says in line:
                break
    finally:
        timer.cancel()
        proc.kill()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()
    return "".join(seen)


def test_beat_needs_no_api_key(tmp_path: Any, redis_url: str) -> None:
    # Beat never calls the API: only the settings are checked; it gets past the check and
    # starts (on its broker, this run's Redis).
    schedule = tmp_path / "schedule"
    argv = [*CELERY, "beat", "-s", str(schedule), "-l", "INFO"]
    logged = logs_until(argv, without("CAPTCHAAI_API_KEY"), "beat: Starting")
    assert "beat: Starting" in logged, logged[-2000:]


def test_an_app_process_gets_the_exception_not_an_exit() -> None:
    code = (
        "from captcha_tasks import solve\n"
        "from captcha_tasks.errors import ConfigurationError\n"
        "try:\n"
        "    solve.delay(method='turnstile', sitekey='k', pageurl='https://example.com')\n"
        "except ConfigurationError as exc:\n"
        "    print('raised', exc.message)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=without(CAPTCHAAI_THREADS="0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "raised CAPTCHAAI_THREADS must be at least 1"


def test_a_worker_with_a_key_the_api_rejects_refuses_to_start(sandbox: Any) -> None:
    env = without(CAPTCHAAI_API_KEY="not-the-accounts-key", CAPTCHAAI_BASE_URL=sandbox.url)
    done = celery(*ROLES["worker"], env=env)
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    [line] = output_lines(done)
    assert line.startswith("celery worker: ConfigurationError: ERROR_WRONG_USER_KEY")
    assert "check CAPTCHAAI_API_KEY" in line
    assert "not-the-accounts-key" not in line  # the key itself is never shown


def test_an_unreachable_api_does_not_keep_a_worker_from_starting(redis_url: str) -> None:
    # Nothing listens at the base URL: the balance check fails fast and the worker starts
    # (its tasks retry).
    env = without(CAPTCHAAI_BASE_URL=f"http://127.0.0.1:{free_port()}")
    argv = [*CELERY, *ROLES["worker"], "-Q", "startup-unreachable", "-l", "INFO"]
    logged = logs_until(argv, env, " ready.")
    assert " ready." in logged, logged[-2000:]


PROVIDER = (
    '{"name": "backup", "base_url": "http://127.0.0.1:9", "key_env": "BACKUP_KEY", "threads": 5}'
)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (f'[{PROVIDER[:-1]}, "colour": "red"}}]', "unknown field 'colour'"),
        (f"[{PROVIDER}, {PROVIDER}]", "provider name 'backup' is used twice"),
        (f'[{PROVIDER[:-1]}, "methods": ["turnstyle"]}}]', "unknown method 'turnstyle'"),
        (f'[{PROVIDER[:-1]}, "role": "primary"}}]', 'role must be "fallback" or "overflow"'),
    ],
)
def test_a_bad_provider_list_stops_every_process_in_one_line(value: str, says: str) -> None:
    for role in ("worker", "beat"):
        done = celery(*ROLES[role], env=without(CAPTCHAAI_PROVIDERS=value, BACKUP_KEY="k"))
        assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
        [line] = output_lines(done)
        assert line.startswith(f"celery {role}: ConfigurationError: CAPTCHAAI_PROVIDERS")
        assert says in line


def test_a_worker_without_a_providers_key_refuses_to_start() -> None:
    done = celery(*ROLES["worker"], env=without("BACKUP_KEY", CAPTCHAAI_PROVIDERS=f"[{PROVIDER}]"))
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    [line] = output_lines(done)
    assert "provider 'backup' reads its key from BACKUP_KEY, which is not set" in line


def test_a_worker_whose_second_provider_refuses_its_key_refuses_to_start(sandbox: Any) -> None:
    entry = PROVIDER.replace("http://127.0.0.1:9", sandbox.url)
    env = without(CAPTCHAAI_PROVIDERS=f"[{entry}]", BACKUP_KEY="not-that-providers-key")
    done = celery(*ROLES["worker"], env=env)
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    [line] = output_lines(done)
    assert "provider 'backup' refuses the key in BACKUP_KEY (ERROR_WRONG_USER_KEY)" in line
    assert "not-that-providers-key" not in line


@pytest.fixture(scope="module")
def json_sandbox() -> Any:
    """A sandbox speaking Anti-Captcha's JSON dialect (createTask, getBalance...)."""
    from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer

    with SandboxServer(SandboxConfig(kind="anticaptcha", api_keys=("json-key",))) as server:
        yield server


def json_provider(url: str) -> str:
    return PROVIDER.replace("http://127.0.0.1:9", url).replace(
        '"threads": 5', '"threads": 5, "kind": "anticaptcha"'
    )


def test_a_worker_whose_json_providers_key_is_refused_refuses_to_start(
    sandbox: Any, json_sandbox: Any
) -> None:
    env = without(
        CAPTCHAAI_BASE_URL=sandbox.url,
        CAPTCHAAI_PROVIDERS=f"[{json_provider(json_sandbox.url)}]",
        BACKUP_KEY="not-that-json-providers-key",
    )
    balance_checks = json_sandbox.stats()["res_php_requests"]
    done = celery(*ROLES["worker"], env=env)
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    [line] = output_lines(done)
    assert line.startswith("celery worker: ConfigurationError: CAPTCHAAI_PROVIDERS")
    assert "provider 'backup' refuses the key in BACKUP_KEY (ERROR_KEY_DOES_NOT_EXIST)" in line
    assert "not-that-json-providers-key" not in line
    # the key was asked about with the family's getBalance, once
    assert json_sandbox.stats()["res_php_requests"] == balance_checks + 1


def test_a_worker_whose_json_primarys_key_is_refused_refuses_to_start(json_sandbox: Any) -> None:
    env = without(
        CAPTCHAAI_BASE_URL=json_sandbox.url,
        CAPTCHAAI_PROVIDER_KIND="anticaptcha",
        CAPTCHAAI_API_KEY="not-the-json-key",
    )
    done = celery(*ROLES["worker"], env=env)
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    [line] = output_lines(done)
    assert line.startswith("celery worker: ConfigurationError: CAPTCHAAI_API_KEY: provider")
    assert "refuses the key in CAPTCHAAI_API_KEY (ERROR_KEY_DOES_NOT_EXIST)" in line
    assert "not-the-json-key" not in line


def test_a_worker_whose_json_providers_key_is_good_starts(sandbox: Any, json_sandbox: Any) -> None:
    env = without(
        CAPTCHAAI_BASE_URL=sandbox.url,
        CAPTCHAAI_PROVIDERS=f"[{json_provider(json_sandbox.url)}]",
        BACKUP_KEY="json-key",
    )
    argv = [*CELERY, *ROLES["worker"], "-Q", "startup-json", "-l", "INFO"]
    with pytest.raises(subprocess.TimeoutExpired) as running:
        subprocess.run(argv, env=env, capture_output=True, timeout=12)
    logged = running.value.stderr or b""
    assert b" ready." in (logged if isinstance(logged, bytes) else logged.encode()), logged
