"""What a new user runs, as subprocesses: Redis down or a wrong ``REDIS_URL`` from an app
and from the CLI, a wrong API key, pools declared from the user's own shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

import click
import pytest

import captcha_tasks
from captcha_tasks.cli import COMMANDS, load_command
from captcha_tasks.cli import cli as cli_group
from captcha_tasks.core.outcome import Solved, parse_iso
from captcha_tasks.settings import mask_url
from captcha_tasks.testing.processes import free_port
from captcha_tasks.testing.sandbox import SandboxConfig

pytestmark = pytest.mark.redis

PAGE = "https://example.com/cli"
PASSWORD = "hunter2-" + os.urandom(4).hex()
POOL = {
    "name": "shell-pool",
    "method": "turnstile",
    "sitekey": "shell-key",
    "pageurl": PAGE,
    "size": 3,
    "ttl": 100,
    "min_remaining": 5,
}


def run(argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, **kwargs)


def cli(*args: str, env: dict[str, str], **kwargs: Any) -> Any:
    return run([sys.executable, "-m", "captcha_tasks.cli", *args], env, **kwargs)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def refilled(token: str) -> dict[str, Any]:
    """A token as a refill puts it in its pool: the refill's outcome (``source`` "api")."""
    now = time.time()
    solved = Solved(token, "7001", "turnstile", "api", 9.5, now - 10, now + 90)
    return solved.to_dict()


# -- Redis down, or REDIS_URL pointing at something else ------------------------------------


@pytest.fixture(params=["nothing listens", "not a Redis server"])
def bad_redis_url(request: pytest.FixtureRequest, sandbox_server: Any) -> str:
    if request.param == "nothing listens":
        port = free_port()
    else:  # an HTTP server: redis-py reads a protocol error
        port = int(sandbox_server.url.rsplit(":", 1)[1])
    return f"redis://:{PASSWORD}@127.0.0.1:{port}/0"


def _env(redis_url: str) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": redis_url}


SOLVE_DELAY = f"""
import json, time
from captcha_tasks import solve
from captcha_tasks.errors import RetryableError
started = time.monotonic()
try:
    solve.delay(method="turnstile", sitekey="k", pageurl="{PAGE}")
except RetryableError as exc:
    took = time.monotonic() - started
    print(json.dumps({{"type": type(exc).__name__, "code": exc.code, "text": str(exc),
                      "took": took}}))
"""


def test_solve_delay_raises_retryable_error_naming_the_url(bad_redis_url: str) -> None:
    done = run([sys.executable, "-c", SOLVE_DELAY], _env(bad_redis_url))
    assert done.returncode == 0, done.stderr[-3000:]
    raised = json.loads(done.stdout)
    assert raised["code"] == "ERROR_REDIS_UNAVAILABLE"
    assert f"REDIS_URL={mask_url(bad_redis_url)}" in raised["text"]
    assert PASSWORD not in raised["text"]
    assert raised["took"] < 3  # no rounds of connection retries


def test_cli_solve_prints_one_line_and_exits_1(bad_redis_url: str) -> None:
    done = cli("solve", "--method", "turnstile", "--sitekey", "k", "--pageurl", PAGE,
               env=_env(bad_redis_url))  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == ""
    [line] = lines(done.stderr)
    assert "ERROR_REDIS_UNAVAILABLE" in line
    assert mask_url(bad_redis_url) in line
    assert PASSWORD not in done.stderr


def test_cli_batch_prints_one_line_and_leaves_no_output_file(
    bad_redis_url: str, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.csv"
    tasks.write_text(f"method,sitekey,pageurl\nturnstile,k,{PAGE}\nturnstile,k2,{PAGE}\n")
    output = tmp_path / "results.jsonl"
    done = cli("batch", str(tasks), "-o", str(output), env=_env(bad_redis_url))
    assert done.returncode == 1
    [line] = lines(done.stderr)
    assert "ERROR_REDIS_UNAVAILABLE" in line
    assert mask_url(bad_redis_url) in line
    assert not output.exists()


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("rediss://user:s3cret@host:6380/2") == "rediss://user:***@host:6380/2"
    assert mask_url("redis://:s3cret@host/0") == "redis://:***@host/0"
    assert mask_url("redis://host:6379/0") == "redis://host:6379/0"


# -- a wrong API key ------------------------------------------------------------------------


def test_a_wrong_key_says_which_variable_to_check(sandbox: Any, env: dict[str, str]) -> None:
    done = cli("account", env={**env, "CAPTCHAAI_API_KEY": "not-the-key"})
    assert done.returncode == 1
    [line] = lines(done.stderr)
    assert "ERROR_WRONG_USER_KEY" in line
    assert "check CAPTCHAAI_API_KEY" in line


# -- pools from the user's shell ------------------------------------------------------------


def _status(env: dict[str, str]) -> list[dict[str, Any]]:
    done = cli("pool", "status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def test_pools_in_the_shells_environment_are_registered(
    clean_state: None, env: dict[str, str]
) -> None:
    assert _status(env) == []
    shell = {**env, "CAPTCHAAI_POOLS": json.dumps([POOL])}
    assert [row["name"] for row in _status(shell)] == [POOL["name"]]
    # registered in Redis: a process without the variable (beat, a worker) sees it too
    assert [row["name"] for row in _status(env)] == [POOL["name"]]


def test_pool_declare_from_a_file(clean_state: None, tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "pools.json"
    path.write_text(json.dumps([POOL, {**POOL, "name": "second", "sitekey": "other"}]))
    done = cli("pool", "declare", "--file", str(path), env=env)
    assert done.returncode == 0, done.stderr
    assert "2 pool(s)" in done.stdout
    assert [row["name"] for row in _status(env)] == ["second", POOL["name"]]


def test_pool_declare_from_the_environment(clean_state: None, env: dict[str, str]) -> None:
    shell = {**env, "CAPTCHAAI_POOLS": json.dumps([POOL])}
    done = cli("pool", "declare", env=shell)
    assert done.returncode == 0, done.stderr
    assert "CAPTCHAAI_POOLS" in done.stdout
    assert [row["name"] for row in _status(env)] == [POOL["name"]]


def test_pool_declare_rejects_a_bad_file_in_one_line(
    clean_state: None, tmp_path: Path, env: dict[str, str]
) -> None:
    path = tmp_path / "pools.json"
    path.write_text(json.dumps([{**POOL, "size": 0}]))
    done = cli("pool", "declare", "--file", str(path), env=env)
    assert done.returncode == 1
    [line] = lines(done.stderr)
    assert str(path) in line
    assert "size" in line
    assert _status(env) == []


def test_pool_declare_with_nothing_to_declare_is_a_usage_error(
    clean_state: None, env: dict[str, str]
) -> None:
    without = {k: v for k, v in env.items() if k != "CAPTCHAAI_POOLS"}
    done = cli("pool", "declare", env=without)
    assert done.returncode == 2
    assert "CAPTCHAAI_POOLS" in done.stderr


def test_pool_status_says_where_pools_are_declared(clean_state: None, env: dict[str, str]) -> None:
    without = {k: v for k, v in env.items() if k != "CAPTCHAAI_POOLS"}
    done = cli("pool", "status", env=without)
    assert done.returncode == 0
    assert "CAPTCHAAI_POOLS" in done.stdout
    assert "captcha-tasks pool declare" in done.stdout


def test_sandbox_help_names_its_default_key(env: dict[str, str]) -> None:
    from_config = SandboxConfig().api_keys[0]
    done = cli("sandbox", "--help", env=env)
    assert done.returncode == 0
    assert f"CAPTCHAAI_API_KEY={from_config}" in done.stdout
    assert "CAPTCHAAI_BASE_URL=" in done.stdout


def test_an_app_calling_solve_registers_its_pools(
    clean_state: None, redis_conn: Any, isolated_module: str, env: dict[str, str]
) -> None:
    code = (
        "from captcha_tasks import solve\n"
        f"solve.delay(method='turnstile', sitekey='other', pageurl='{PAGE}')\n"
    )
    app_env = {**env, "CAPTCHAAI_POOLS": json.dumps([POOL])}
    try:
        done = run([sys.executable, "-c", code], app_env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert [row["name"] for row in _status(env)] == [POOL["name"]]
    finally:
        redis_conn.delete(f"{isolated_module}.solve")  # the message no worker will take


# -- the command itself: lazy sub-commands, --help and --version ----------------------------

HEAVY = ("celery", "captcha_tasks.testing", "captcha_tasks.kafka", "captcha_tasks.metrics",
         "captcha_tasks.worker", "captcha_tasks.batch", "requests")  # fmt: skip
IMPORTED_BY_HELP = """
import sys
from captcha_tasks.cli import main
sys.argv = ["captcha-tasks", "--help"]
main()
heavy = {HEAVY!r}
print("heavy:", sorted(m for m in sys.modules if m.startswith(heavy)))
"""


def test_help_lists_every_command_without_importing_any() -> None:
    done = run([sys.executable, "-c", IMPORTED_BY_HELP.format(HEAVY=HEAVY)], dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "heavy: []"
    listed = done.stdout.split("Commands:", 1)[1].split()
    for name in COMMANDS:
        assert name in listed, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_lazy_command_is_where_the_list_says_with_its_help(name: str) -> None:
    where, summary = COMMANDS[name]
    command = load_command(where)
    assert command.name == name
    assert command.get_short_help_str(1000) == summary


def test_a_command_runs_from_its_lazy_entry(env: dict[str, str]) -> None:
    assert cli_group.get_command(click.Context(cli_group), "no-such-command") is None
    done = cli("pool", "--help", env=env)
    assert done.returncode == 0
    assert "status" in done.stdout and "declare" in done.stdout
    done = cli("no-such-command", env=env)
    assert done.returncode == 2
    assert "No such command 'no-such-command'" in done.stderr


def test_version_is_the_packages(env: dict[str, str]) -> None:
    done = cli("--version", env=env)
    assert done.returncode == 0
    assert done.stdout.strip() == f"captcha-tasks, version {version('captcha-tasks')}"
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert version("captcha-tasks") == project["project"]["version"]
    assert captcha_tasks.__version__ == project["project"]["version"]


# -- a misspelt argument ------------------------------------------------------------------------

MISSPELT = f"""
from captcha_tasks import solve
from captcha_tasks.errors import ValidationError
try:
    solve.delay(method="turnstile", site_key="0x4AAA", pageurl="{PAGE}")
except ValidationError as exc:
    print(exc)
"""


def test_site_key_is_named_as_the_unknown_argument(clean_state: None, env: dict[str, str]) -> None:
    done = run([sys.executable, "-c", MISSPELT], env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "unknown parameter(s) for method 'turnstile': site_key (did you mean sitekey?)" in (
        done.stdout
    )
    assert "sitekey is required" not in done.stdout
    done = cli(
        "solve", "--method", "turnstile", "--param", "site_key=0x4AAA", "--pageurl", PAGE, env=env
    )
    assert done.returncode == 1
    [line] = lines(done.stderr)
    assert "site_key (did you mean sitekey?)" in line


def test_pool_status_explains_the_demand_aware_target(
    clean_state: None, env: dict[str, str], state: Any
) -> None:
    shell = {**env, "CAPTCHAAI_POOLS": json.dumps([{**POOL, "size": 10}])}
    before = cli("pool", "status", env=shell)
    assert before.returncode == 0, before.stderr
    [row] = [line.split() for line in lines(before.stdout) if line.startswith(POOL["name"])]
    assert row[1:3] == ["10", "10"]  # size, target: filled to its size until the first take
    assert "first take" not in before.stdout
    state.pools.add(POOL["name"], refilled("pooled-token"), 100)
    took = run([sys.executable, "-c", f"from captcha_tasks import take_token; "
                f"print(take_token({POOL['name']!r}))"], shell)  # fmt: skip
    assert took.returncode == 0, took.stderr
    assert "pooled-token" in took.stdout
    after = cli("pool", "status", env=shell)
    [row] = [line.split() for line in lines(after.stdout) if line.startswith(POOL["name"])]
    assert row[1] == "10" and 1 <= int(row[2]) <= 10  # the target follows the demand now
    assert float(row[5]) > 0  # takes/s
    assert "filled to its size until its first take" in after.stdout
    assert "takes/s x (solve time + margin)" in after.stdout


def test_pool_take_prints_a_token_as_json_or_exits_1_when_empty(
    clean_state: None, env: dict[str, str], state: Any
) -> None:
    shell = {**env, "CAPTCHAAI_POOLS": json.dumps([POOL])}
    empty = cli("pool", "take", POOL["name"], env=shell)
    assert (empty.returncode, empty.stdout) == (1, "")
    assert lines(empty.stderr) == [
        f"pool {POOL['name']} is empty: no token with enough life left (beat refills it)"
    ]
    added = time.monotonic()
    state.pools.add(POOL["name"], refilled("pooled-token"), 90)  # its life left, as it says
    took = cli("pool", "take", POOL["name"], env=shell)
    # the life it had, less no more than what passed while the command started and took it
    # (a loaded machine takes seconds to start a Python process)
    passed = time.monotonic() - added
    assert took.returncode == 0, took.stderr
    taken = json.loads(took.stdout)
    # the outcome's shape, as a pool hit through solve() has it: from the pool, its life left
    assert (taken["status"], taken["source"], taken["token"]) == ("solved", "pool", "pooled-token")
    assert list(taken)[-1] == "token" and 90 - passed - 0.1 < taken["remaining_s"] <= 90
    left = parse_iso(taken["expires_at"]) - time.time()
    assert abs(left - taken["remaining_s"]) < 5
    assert cli("pool", "take", POOL["name"], env=shell).returncode == 1  # handed out once
    # more life asked for than a token has: a miss, not an error
    state.pools.add(POOL["name"], refilled("short-lived"), 30)
    assert cli("pool", "take", POOL["name"], "--min-remaining", "60", env=shell).returncode == 1
    unknown = cli("pool", "take", "no-such-pool", env=shell)
    assert unknown.returncode == 2 and "no-such-pool" in unknown.stderr
