"""``celery -A captcha_tasks flower``: authentication is required, and the task list is
readable and free of secrets in a real headless browser (skipped without Chromium, and
failed instead on CI)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from browser import chromium

from captcha_tasks.testing.processes import CeleryProcess, RedisServer, free_port, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.flower_auth import (
    EXIT_CONFIG,
    EXIT_GRACE_S,
    NO_AUTH_MESSAGE,
    auth_problem,
)

pytestmark = pytest.mark.system

USER, PASSWORD = "ops", "flower-" + os.urandom(4).hex()
PROXY_PASSWORD = "SECRETPW" + os.urandom(3).hex()
PROXY = f"user:{PROXY_PASSWORD}@1.2.3.4:3128"
PAGE = "https://example.com/login"
TASK_NAMES = (
    "captcha_tasks.solve",
    "captcha_tasks.submit",
    "captcha_tasks.poll",
    "captcha_tasks.prewarm",
    "captcha_tasks.check_threads",  # housekeeping's look at the provider's threads
)
#: Names on Flower's task list after one parked solve (check_threads runs on its own
#: clock, maybe before Flower listens).
LISTED_NAMES = TASK_NAMES[:4]


def _flower_env(**extra: str) -> dict[str, str]:
    """The test environment without any Flower or opt-out setting, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FLOWER_") and k != "CAPTCHAAI_FLOWER_NO_AUTH"
    }
    return {**env, **extra}


class FlowerProcess(CeleryProcess):
    """``celery -A captcha_tasks flower`` on a free loopback port."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.port = free_port()
        super().__init__("flower", name=f"flower-{self.port}", log_dir=log_dir)
        self.env = env  # exactly this environment: no inherited FLOWER_* variables
        self.url = f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "captcha_tasks", "flower",
            f"--port={self.port}", "--address=127.0.0.1",
        ]  # fmt: skip

    def start(self, timeout: float = 30) -> FlowerProcess:
        self._spawn(self.argv(), self.env)
        wait_until(self._serving, timeout, interval=0.1, what="Flower's HTTP port")
        return self

    def _serving(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"flower exited early:\n{self.log_text()[-3000:]}")
        try:
            return requests.get(f"{self.url}/healthcheck", timeout=2).ok
        except requests.ConnectionError:
            return False

    def api_tasks(self) -> dict[str, Any]:
        resp = requests.get(f"{self.url}/api/tasks", auth=(USER, PASSWORD), timeout=5)
        resp.raise_for_status()
        return dict(resp.json())


def _run_flower_expecting_exit(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    port = free_port()
    argv = [sys.executable, "-m", "celery", "-A", "captcha_tasks", "flower", f"--port={port}"]
    # run() kills the child if it is still running at the timeout (the test then fails).
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


# -- the start-up check ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("basic_auth", "oauth", "ok"),
    [
        (None, "", False),
        ([], None, False),
        ([""], "", False),  # FLOWER_BASIC_AUTH= (set but empty)
        (["admin"], "", False),
        (["admin:"], "", False),
        ([":pw"], "", False),
        (["admin:pw"], "", True),
        (["admin:pw", "ro:pw2"], "", True),
        (None, r".*@example\.com", True),  # OAuth
    ],
)
def test_auth_problem(basic_auth: list[str] | None, oauth: str | None, ok: bool) -> None:
    assert (auth_problem(basic_auth, oauth) is None) is ok


def test_malformed_entry_is_not_echoed() -> None:
    problem = auth_problem(["admin:good", "s3cret-typed-alone"], None)
    assert problem is not None
    assert "#2" in problem
    assert "s3cret-typed-alone" not in problem


def test_flower_without_credentials_refuses_to_start() -> None:
    done = _run_flower_expecting_exit(_flower_env())
    assert done.returncode == EXIT_CONFIG, done.stderr[-2000:]
    assert NO_AUTH_MESSAGE in done.stderr
    assert "Visit me at" not in done.stderr + done.stdout  # never served


def test_flower_with_empty_or_malformed_credentials_refuses_to_start() -> None:
    empty = _run_flower_expecting_exit(_flower_env(FLOWER_BASIC_AUTH=""))
    assert empty.returncode == EXIT_CONFIG
    assert "FLOWER_BASIC_AUTH" in empty.stderr

    malformed = _run_flower_expecting_exit(_flower_env(FLOWER_BASIC_AUTH="typed-the-password"))
    assert malformed.returncode == EXIT_CONFIG
    assert "entry #1" in malformed.stderr
    assert "typed-the-password" not in malformed.stderr


def test_opt_out_starts_flower_without_auth(output_dir: Path) -> None:
    env = _flower_env(CAPTCHAAI_FLOWER_NO_AUTH="1")
    with FlowerProcess(env, output_dir).start() as flower:
        assert requests.get(f"{flower.url}/tasks", timeout=5).status_code == 200
        assert "WITHOUT authentication" in flower.log_text()


def test_credentials_are_required_but_metrics_stay_open(output_dir: Path) -> None:
    env = _flower_env(FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}")
    with FlowerProcess(env, output_dir).start() as flower:
        assert requests.get(f"{flower.url}/tasks", timeout=5).status_code == 401
        wrong = requests.get(f"{flower.url}/tasks", auth=(USER, "nope"), timeout=5)
        assert wrong.status_code == 401
        assert requests.get(f"{flower.url}/api/tasks", timeout=5).status_code == 401
        right = requests.get(f"{flower.url}/tasks", auth=(USER, PASSWORD), timeout=5)
        assert right.status_code == 200
        # Flower does not protect /metrics: keep it off public interfaces (see the README).
        assert requests.get(f"{flower.url}/metrics", timeout=5).status_code == 200
        for name in TASK_NAMES:
            assert name in flower.log_text()  # the "Registered tasks" banner


#: How often Flower asks the workers to send events (flower.events.Events, not a setting).
FLOWER_EVENTS_EVERY_S = 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_flower_stops_when_told_even_with_redis_down(output_dir: Path, sig: int) -> None:
    redis_server = RedisServer(log_dir=output_dir).start()
    env = _flower_env(FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}", REDIS_URL=redis_server.url)
    flower = FlowerProcess(env, output_dir).start()
    try:
        # Flower's event receiver must hold its subscription before Redis goes: a receiver
        # still connecting retries inside kombu and never logs the failure we wait for.
        wait_until(lambda: _events_subscribed(redis_server), 30, what="Flower's event receiver")
        redis_server.stop()
        wait_until(lambda: "Failed to capture events" in flower.log_text(), 30, what="retries")
        # An outage of a chosen length, not a synchronisation: every 5 s Flower asks the
        # workers to send events, and that call now waits for the broker in one of its
        # threads (the one that used to keep the process alive after the signal).
        time.sleep(FLOWER_EVENTS_EVERY_S + 1)  # the outage's length (see above)
        assert flower.proc is not None
        flower.proc.send_signal(sig)
        flower.proc.wait(timeout=EXIT_GRACE_S + 2)  # not the minutes of a broker retry
        assert flower.proc.returncode == 0
    finally:
        flower.stop()
        redis_server.stop()


def _events_subscribed(redis_server: RedisServer) -> bool:
    """Whether a client listens to Celery's event exchange (kombu's fanout on Redis pub/sub)."""
    with redis.Redis.from_url(redis_server.url) as client:
        return bool(client.pubsub_channels("*celeryev*")) or bool(client.pubsub_numpat())


# -- the task list in a real browser -------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def flower(worker: CeleryProcess, output_dir: Path) -> Iterator[FlowerProcess]:
    env = _flower_env(FLOWER_BASIC_AUTH=f"{USER}:{PASSWORD}")
    with FlowerProcess(env, output_dir).start() as proc:
        yield proc


def _prime_events(flower: FlowerProcess) -> None:
    """Wait until Flower's event receiver is subscribed: events sent before are lost."""
    from captcha_tasks.worker.tasks import prewarm

    sent: list[str] = []

    def seen() -> bool:
        sent.append(prewarm.delay().id)
        tasks = flower.api_tasks()
        # named: Flower got its task-received event too, not only a later one
        return any(tasks.get(task_id, {}).get("name") == prewarm.name for task_id in sent)

    wait_until(seen, 30, interval=0.5, what="Flower to receive task events")


def _hold_every_thread_briefly() -> None:
    """Fill the limiter with leases that expire in a second, so the next solve parks and
    is resumed by a ``submit`` once the worker's housekeeping reclaims them."""
    from dataclasses import replace

    from captcha_tasks.state.limiter import ThreadLimiter

    limiter = app.runtime().state.limiter
    short = ThreadLimiter(limiter.db, replace(limiter.config, lease_s=1.0))
    for i in range(limiter.config.capacity):
        held = short.admit(f"flower-hold-{i}", "{}", attempt=0, deadline_in_s=30)
        assert held.status == "go"


def _solved_in_flower(flower: FlowerProcess, solve_id: str) -> bool:
    tasks = flower.api_tasks()
    names = {info.get("name") for info in tasks.values()}
    solve = tasks.get(solve_id) or {}
    return solve.get("state") == "SUCCESS" and set(LISTED_NAMES) <= names


def flower_worker_name(flower: FlowerProcess) -> str:
    """The node name of the (single) worker Flower knows."""
    resp = requests.get(f"{flower.url}/api/workers", auth=(USER, PASSWORD), timeout=10)
    resp.raise_for_status()
    names = list(resp.json())
    assert len(names) == 1, names
    return str(names[0])


def _authorize(driver: Any) -> None:
    # Basic auth as a header on every request, the page's XHRs included.
    import base64

    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
    )


def test_flower_lists_solved_task_without_secrets(
    flower: FlowerProcess, browser: Any, sandbox: Any, clean_state: None, output_dir: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from captcha_tasks import solve

    _prime_events(flower)
    _hold_every_thread_briefly()
    result = solve.delay(method="turnstile", sitekey="0x4AAAAAAAflower", pageurl=PAGE, proxy=PROXY)
    assert result.get(timeout=60)["status"] == "solved"
    try:
        wait_until(lambda: _solved_in_flower(flower, result.id), 30, interval=0.5)
    except TimeoutError:
        seen = {k: (v.get("name"), v.get("state")) for k, v in flower.api_tasks().items()}
        pytest.fail(f"Flower did not list {result.id} as SUCCESS and {LISTED_NAMES}: {seen}")

    _authorize(browser)
    browser.get(f"{flower.url}/tasks")
    WebDriverWait(browser, 30).until(lambda d: result.id in d.page_source)
    table = browser.find_element(By.ID, "tasks-table").text
    for name in LISTED_NAMES:
        assert name in table, f"{name} missing from Flower's task list"
    browser.save_screenshot(str(output_dir / "flower-tasks.png"))
    pages = {"tasks": browser.page_source}

    # Every task, solve included, under its readable name on the worker's page.
    browser.get(f"{flower.url}/worker/{flower_worker_name(flower)}")
    WebDriverWait(browser, 30).until(lambda d: TASK_NAMES[0] in d.page_source)
    for name in TASK_NAMES:
        assert name in browser.page_source, f"{name} missing from the worker's task list"
    pages["worker"] = browser.page_source

    browser.get(f"{flower.url}/task/{result.id}")
    WebDriverWait(browser, 30).until(lambda d: "SUCCESS" in d.page_source)
    browser.save_screenshot(str(output_dir / "flower-task.png"))
    pages["task"] = browser.page_source

    pages["api"] = requests.get(
        f"{flower.url}/api/tasks", auth=(USER, PASSWORD), timeout=5
    ).text  # every task, not only the first page of the table
    api_key = os.environ["CAPTCHAAI_API_KEY"]
    for page, html in pages.items():
        assert api_key not in html, f"the API key is on Flower's {page} page"
        assert PROXY_PASSWORD not in html, f"the proxy password is on Flower's {page} page"


def test_flower_shows_where_a_solve_is(
    flower: FlowerProcess, sandbox: Any, clean_state: None
) -> None:
    """While in flight, a solve's state in Flower says where it is: PARKED while it waits
    for a thread, SUBMITTED (with its captcha id) at the provider, then SUCCESS."""
    from captcha_tasks import solve

    sandbox.configure(solve_time=2.0, jitter=0.0)
    _prime_events(flower)
    _hold_every_thread_briefly()
    result = solve.delay(method="turnstile", sitekey="0x4AAAAAAAwhere", pageurl=PAGE)
    seen: list[str] = []

    def state() -> str | None:
        found = flower.api_tasks().get(result.id, {})
        if found.get("state") and (not seen or seen[-1] != found["state"]):
            seen.append(found["state"])
        return found.get("state")

    wait_until(lambda: state() == "SUCCESS", 60, interval=0.2, what="the solve in Flower")
    assert "PARKED" in seen and "SUBMITTED" in seen, seen
    assert seen.index("PARKED") < seen.index("SUBMITTED") < seen.index("SUCCESS"), seen
    assert result.get(timeout=10)["status"] == "solved"
