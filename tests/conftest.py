"""Test harness: a real Redis-protocol server process, the sandbox API over HTTP and real
Celery worker processes.

Nothing starts until a test asks: the Redis server is a session fixture started on first
request, each module that asks has a sandbox of its own, and the Celery app's settings
(``isolated_module``, through ``app``, ``settings``, ``state`` or ``env``) are built only
for the modules that use them.  Worker
processes get the module's environment.  The tier of each test (unit, redis, e2e, system)
is a marker, checked by ``tests/tiers.py``.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests

from captcha_tasks.testing import processes
from captcha_tasks.testing.processes import CeleryProcess, RedisServer

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "test-key-" + os.urandom(6).hex()
_STATE: dict[str, Any] = {}

#: Fast timings for tests: one tenth of a real solve or less.
TEST_ENV = {
    "CAPTCHAAI_API_KEY": API_KEY,
    "CAPTCHAAI_POLL_INTERVAL": "0.25",
    "CAPTCHAAI_INITIAL_WAIT": "0.3",
    "CAPTCHAAI_SOLVE_TIMEOUT": "30",
    "CAPTCHAAI_THREADS": "15",
    "CAPTCHAAI_KEY_PREFIX": "ct-test",
    "CAPTCHAAI_QUEUE_PREFIX": "ct-test",
    "CAPTCHAAI_TRANSPORT_RETRIES": "6",
}
SANDBOX_DEFAULTS = {
    "threads": 50,
    "solve_time": 0.3,
    "jitter": 0.1,
    "unsolvable_rate": 0.0,
    "error_rate": 0.0,
    "bulk": True,
    "thread_error": "ERROR_NO_SLOT_AVAILABLE",
    "pingback_method": "GET",
    "pingback_delay": 0.0,
    "pingback_drop_rate": 0.0,
    "hang_rate": 0.0,
    "status_429_rate": 0.0,
    "queue_silently": False,
    "balance_captchas": None,
    "outage_s": 0.0,
    "hold": False,
    # the real token lives (tests that shorten them must not leak into later tests)
    "token_ttl": {"userrecaptcha": 120.0, "turnstile": 300.0, "geetest": 120.0, "base64": 600.0},
}


pytest_plugins = ["tests.tiers", "tests.longest_first"]


def pytest_configure(config: pytest.Config) -> None:
    # Tests stop the processes they start with SIGINT, as Ctrl-C would.  Started in the
    # background (`./scripts/test &`, nohup), this process inherits SIGINT *ignored*, and so
    # would every child (an ignored signal stays ignored across exec).  A handler here
    # becomes the default disposition in each child instead.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path(os.environ.get("TEST_OUTPUT_DIR") or tempfile.mkdtemp(prefix="ct-tests-"))
    # Each pytest-xdist worker has servers and logs of its own.
    out = out / os.environ.get("PYTEST_XDIST_WORKER", "main")
    out.mkdir(parents=True, exist_ok=True)
    _STATE["out"] = out
    # Settings only: no socket is opened until a test asks for Redis.  Its address is fixed
    # now (a free port, not yet listened on), because Celery's configuration reads
    # REDIS_URL once, whenever a test first touches the app's config.  Each module that
    # asks for the sandbox gets one of its own (``sandbox_server``), in its settings.
    # Every process of the run (xdist workers, the lowest-versions sessions beside them,
    # the children they start, whatever TMPDIR a test gives them) notes its port picks in
    # one folder, so no two pick the same port (free_port).
    os.environ.setdefault(
        processes.PICKS_ENV, str(Path(tempfile.gettempdir()) / "captcha-tasks-port-picks")
    )
    _STATE["redis"] = RedisServer(log_dir=out)
    os.environ.update(TEST_ENV, REDIS_URL=_STATE["redis"].url)
    # The suite's ~200 worker and beat processes skip the `celery` group's imports
    # (harness/celery_main.py); the tests of the command line run `celery` itself.
    processes.CELERY_COMMAND = (sys.executable, str(ROOT / "harness" / "celery_main.py"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _STATE.get("redis_started"):
        _STATE["redis"].stop()


def _redis_server() -> RedisServer:
    """The session's Redis server, started the first time a test needs it."""
    if not _STATE.get("redis_started"):
        _STATE["redis"].start()
        _STATE["redis_started"] = True
    return _STATE["redis"]  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def output_dir() -> Path:
    return Path(_STATE["out"])


@pytest.fixture(scope="session")
def redis_url() -> str:
    return str(_redis_server().url)


@pytest.fixture(scope="session")
def capmonster_python(output_dir: Path) -> Path:
    """The interpreter of a venv holding ``capmonstercloudclient`` alone (it pins aiohttp,
    pydantic and others to exact versions, so it stays out of ours): built on first use
    by pip and cached (``tests/pip_cache.py``).  Without it a test skips; on CI it fails."""
    import subprocess

    from pip_cache import CAPMONSTER, isolated_python
    from system_parts import missing

    try:
        return isolated_python(CAPMONSTER, output_dir / "pip-capmonster.log")
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        missing("capmonstercloudclient", f"cannot build its virtual environment: {exc}")


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[Any]:
    """The module's sandbox (in this process, over HTTP): a provider of its own, so that
    what an earlier module left solving there cannot change what this one counts."""
    from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer

    server = SandboxServer(SandboxConfig(api_keys=(API_KEY,), **SANDBOX_DEFAULTS)).start()
    yield server
    server.stop()


class Sandbox:
    """The test's view of the sandbox: its URL, counters and runtime config."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.url: str = server.url

    def stats(self) -> dict[str, Any]:
        return dict(requests.get(f"{self.url}/sandbox/stats", timeout=5).json())

    def configure(self, **changes: Any) -> None:
        resp = requests.post(f"{self.url}/sandbox/config", json=changes, timeout=5)
        resp.raise_for_status()

    def reset(self) -> None:
        requests.post(f"{self.url}/sandbox/reset", timeout=5).raise_for_status()

    def verify(self, token: str) -> dict[str, Any]:
        resp = requests.post(f"{self.url}/siteverify", data={"response": token}, timeout=5)
        return dict(resp.json())


@pytest.fixture
def sandbox(sandbox_server: Any, isolated_module: str) -> Iterator[Sandbox]:
    """The module's sandbox, reset to the default config and zeroed counters."""
    from captcha_tasks.worker.app import app

    box = Sandbox(sandbox_server)
    box.configure(api_keys=[API_KEY], **SANDBOX_DEFAULTS)
    box.reset()
    yield box
    box.configure(api_keys=[API_KEY], **SANDBOX_DEFAULTS)
    # A test that emptied the balance or refused the key took the provider out of rotation:
    # the sandbox is whole again, so is the provider (no waiting for a probe).
    app.runtime().state.circuits.reset()


@pytest.fixture
def redis_conn(redis_url: str) -> Iterator[Any]:
    import redis

    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    yield conn
    conn.close()


@pytest.fixture
def keys(redis_conn: Any) -> Iterator[Any]:
    """Key names under a prefix of the test's own, deleted afterwards."""
    from uuid import uuid4

    from captcha_tasks.state.keys import Keys

    k = Keys(prefix=f"t-{uuid4().hex}")
    yield k
    for key in redis_conn.scan_iter(k.all_patterns()):
        redis_conn.delete(key)


@pytest.fixture
def move_clock(redis_conn: Any) -> Iterator[Callable[[float], None]]:
    """Moves the clock every Lua script reads (the test-only offset of ``lib/now.lua``) on
    by ``s`` seconds, when the test says.  A test that checks something is *not* due yet
    gives it seconds (not tenths: a loaded machine can stall a process that long between
    two lines), then moves past them instead of waiting.  The offset is the session Redis
    server's, so it is cleared afterwards; a test that finds one set fails at once."""
    from captcha_tasks.state.keys import TEST_CLOCK_OFFSET_KEY

    assert redis_conn.get(TEST_CLOCK_OFFSET_KEY) is None, "a test clock offset was left set"
    moved = 0

    def move(s: float) -> None:
        nonlocal moved
        moved += round(s * 1000)
        redis_conn.set(TEST_CLOCK_OFFSET_KEY, moved)

    yield move
    redis_conn.delete(TEST_CLOCK_OFFSET_KEY)


@pytest.fixture
def clean_state(redis_conn: Any, state: Any) -> Iterator[None]:
    """Forget captcha-tasks' own keys (solve-time samples, submissions) around a test."""

    def wipe() -> None:
        for key in redis_conn.scan_iter(state.keys.all_patterns(), count=1000):
            redis_conn.delete(key)

    wipe()
    yield
    wipe()


@pytest.fixture
def metrics_url(settings: Any, state: Any) -> Iterator[str]:
    """The Prometheus exporter, served in this process (read from the test's Redis)."""
    from captcha_tasks.metrics import StoreCollector, serve_in_thread

    server, thread = serve_in_thread("127.0.0.1", 0, StoreCollector(settings, state))
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def purge_broker(redis_url: str, env: Mapping[str, str]) -> None:
    """Drop queued and unacknowledged Celery messages left by an earlier module."""
    import redis

    from captcha_tasks.testing.processes import queue_names

    conn = redis.Redis.from_url(redis_url)
    conn.delete(*queue_names(env), "unacked", "unacked_index", "unacked_mutex")
    conn.close()


@pytest.fixture(scope="module")
def isolated_module(
    request: pytest.FixtureRequest, redis_url: str, sandbox_server: Any
) -> Iterator[str]:
    """Each test module works under Redis keys and Celery queues of its own, so state
    another module leaked cannot loosen its assertions.  Returns the prefix.

    The module's settings are a value (``settings``), installed in this process's app
    (``app.use``); processes a test starts get them through ``env``.  A module may add
    settings of its own in a ``MODULE_ENV`` dict.  Nothing rewrites ``os.environ``."""
    from captcha_tasks.settings import Settings
    from captcha_tasks.worker.app import app

    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    prefix = f"ct-{name}-{os.urandom(3).hex()}"
    # The module's own sandbox, unless the module names its providers (MODULE_ENV).
    env = {
        **os.environ,
        "CAPTCHAAI_BASE_URL": sandbox_server.url,
        **getattr(request.module, "MODULE_ENV", {}),
    }
    env.update(CAPTCHAAI_KEY_PREFIX=prefix, CAPTCHAAI_QUEUE_PREFIX=prefix)
    _MODULE.update(env=env, prefix=prefix)
    app.use(Settings.from_env(env))
    yield prefix
    app.forget_runtime()


#: The module being run: its environment (for the processes it starts) and key prefix.
_MODULE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def env(isolated_module: str) -> dict[str, str]:
    """The environment of this module's settings, for the processes its tests start."""
    return dict(_MODULE["env"])


@pytest.fixture(scope="module")
def app(isolated_module: str) -> Any:
    """The package's Celery app, with this module's settings installed."""
    from captcha_tasks.worker.app import app

    return app


@pytest.fixture(scope="module")
def settings(isolated_module: str) -> Any:
    """This module's settings (as installed in this process's app)."""
    from captcha_tasks.worker.app import app

    return app.runtime().settings


@pytest.fixture(scope="module")
def state(isolated_module: str) -> Any:
    """This module's Redis state (the app's, in this process)."""
    from captcha_tasks.worker.app import app

    return app.runtime().state


@pytest.fixture(scope="module")
def worker(
    output_dir: Path, redis_url: str, env: dict[str, str], request: pytest.FixtureRequest
) -> Iterator[CeleryProcess]:
    """One real worker process (threads pool) consuming every queue, for one test module."""
    purge_broker(redis_url, env)
    name = f"worker-{request.module.__name__.rsplit('.', 1)[-1]}"
    proc = CeleryProcess("worker", env=env, concurrency=16, log_dir=output_dir, name=name)
    proc.start()
    yield proc
    proc.stop()
    purge_broker(redis_url, env)


@pytest.fixture
def start_worker(output_dir: Path, redis_url: str, env: dict[str, str]) -> Iterator[Any]:
    """Factory for worker processes with their own environment (on top of the module's);
    all stopped after.

    Modules that use it must not also use the module-wide ``worker`` fixture.
    """
    started: list[CeleryProcess] = []
    purge_broker(redis_url, env)

    def start(extra: dict[str, str] | None = None, **kwargs: Any) -> CeleryProcess:
        proc = CeleryProcess("worker", env={**env, **(extra or {})}, log_dir=output_dir, **kwargs)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()
    purge_broker(redis_url, env)
