"""The JSON family's callbacks end to end, per dialect: a real worker submits to the
sandbox's JSON face (``anticaptcha``, ``capsolver``, ``capmonster``) with a ``callbackUrl``
carrying the solve's ticket, the sandbox POSTs the task's ``getTaskResult`` JSON there as
the provider does, and the receiver (a real server in this process, over HTTP) completes
the solve: no ``getTaskResult`` poll.  Forged, replayed and malformed callbacks are
refused with a clear status and change nothing."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from captcha_tasks import solve
from captcha_tasks.core import pingback
from captcha_tasks.core.dialects import DIALECTS
from captcha_tasks.receiver.callbacks import MAX_BODY, Receiver
from captcha_tasks.receiver.server import PingbackServer
from captcha_tasks.testing.jsonface import COSTS
from captcha_tasks.testing.processes import free_port, wait_until
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from captcha_tasks.worker.app import app
from captcha_tasks.worker.runtime import Runtime

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

SECRET = "json-callback-test-secret-" + "x" * 8
PAGE = "https://example.com/json-callbacks"
GET_TIMEOUT = 15
#: Callbacks on, and no captcha polled within GET_TIMEOUT (warm or cold): a solve that
#: ends in time was ended by its callback.
NO_POLL_S = 60.0
KINDS = sorted(DIALECTS)


#: Each sandbox between tests.
SANDBOX = {"solve_time": 0.3, "jitter": 0.1, "pingback_drop_rate": 0.0}


class Box:
    """A dialect's sandbox as the tests see it, over HTTP."""

    def __init__(self, server: SandboxServer, key: str) -> None:
        self.url, self.key = server.url, key

    def stats(self) -> dict[str, Any]:
        return dict(requests.get(f"{self.url}/sandbox/stats", timeout=5).json())

    def configure(self, **changes: Any) -> None:
        requests.post(f"{self.url}/sandbox/config", json=changes, timeout=5).raise_for_status()

    def reset(self) -> None:
        requests.post(f"{self.url}/sandbox/reset", timeout=5).raise_for_status()

    def verify(self, token: str) -> dict[str, Any]:
        resp = requests.post(f"{self.url}/siteverify", data={"response": token}, timeout=5)
        return dict(resp.json())


@pytest.fixture(scope="module")
def boxes(settings: Any) -> Iterator[dict[str, SandboxServer]]:
    """One sandbox per JSON dialect, for the module (the module's key)."""
    started: dict[str, SandboxServer] = {}
    try:
        for kind in KINDS:
            config = SandboxConfig(api_keys=(settings.providers.api_key,), kind=kind, **SANDBOX)
            started[kind] = SandboxServer(config).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def box(boxes: dict[str, SandboxServer], kind: str, settings: Any) -> Iterator[Box]:
    """The dialect's sandbox, at the module's config with zeroed counters."""
    found = Box(boxes[kind], settings.providers.api_key)
    found.configure(**SANDBOX)
    found.reset()
    yield found
    found.configure(**SANDBOX)


@pytest.fixture
def serve(settings: Any, kind: str, box: Box) -> Iterator[Callable[[], PingbackServer]]:
    """The receiver of a deployment whose primary is of ``kind``, served over HTTP."""
    mine = settings.replace(
        pingback={"secret": SECRET}, providers={"kind": kind, "base_url": box.url}
    )
    receiver = Receiver(Runtime(app, mine).runner)
    servers: list[PingbackServer] = []

    def start() -> PingbackServer:
        servers.append(PingbackServer(receiver).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def worker_env(
    kind: str, box: Box, port: int, fallback: float = NO_POLL_S, cold_wait: float = NO_POLL_S
) -> dict[str, str]:
    return {
        "CAPTCHAAI_PROVIDER_KIND": kind,
        "CAPTCHAAI_BASE_URL": box.url,
        "CAPTCHAAI_PINGBACK_URL": f"http://127.0.0.1:{port}/captcha/pingback",
        "CAPTCHAAI_PINGBACK_SECRET": SECRET,
        "CAPTCHAAI_PINGBACK_FALLBACK_POLL": str(fallback),
        "CAPTCHAAI_INITIAL_WAIT": str(cold_wait),
    }


def turnstile() -> Any:
    return solve.delay(method="turnstile", sitekey="0x4A", pageurl=PAGE)


def post(port: int, segment: str, body: bytes) -> tuple[int, str]:
    """A JSON provider's callback to the receiver, as it makes them."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(
            "POST",
            f"/captcha/pingback/{segment}",
            body=body,
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def on_board(solve_id: str) -> str:
    """The captcha id (the provider's ``taskId``, as text) the solve has at the provider."""
    state = app.runtime().state

    def found() -> str | None:
        for cid, job in state.redis.hgetall(state.keys.board()).items():
            if f'"solve_id":"{solve_id}"' in job:
                return str(cid)
        return None

    return str(wait_until(found, 10, what="the captcha on the board"))


def task_id_of(kind: str, captcha_id: str) -> int | str:
    return int(captcha_id) if DIALECTS[kind].id_type == "int" else captcha_id


def result_body(box: Box, kind: str, captcha_id: str) -> dict[str, Any] | None:
    """What the provider would POST once the task is done (None: not done yet)."""
    task_id = task_id_of(kind, captcha_id)
    body = {"clientKey": box.key, "taskId": task_id}
    reply = requests.post(f"{box.url}/getTaskResult", json=body, timeout=5).json()
    return {**reply, "taskId": task_id} if reply.get("status") == "ready" else None


def encoded(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


def test_a_callback_completes_the_solve_without_a_poll(
    kind: str, box: Box, serve: Any, start_worker: Any
) -> None:
    server = serve()
    start_worker(worker_env(kind, box, server.port))
    results = [r.get(timeout=GET_TIMEOUT) for r in [turnstile() for _ in range(5)]]
    assert all(box.verify(r["token"])["success"] for r in results)
    # counted by the sandbox when the receiver's reply is back: maybe after the result
    wait_until(lambda: box.stats()["pingbacks_sent"] == 5, 10, what="the replies")
    stats = box.stats()
    assert (stats["submits"], stats["res_php_get_requests"]) == (5, 0)
    assert stats["pingbacks_failed"] == 0
    state = app.runtime().state
    assert state.stats.callback_counts() == {"accepted": 5}
    # what the answers cost, where the provider says (Anti-Captcha), as a poll counts it
    expected = 5 * float(COSTS[kind]) if kind in COSTS else 0.0
    assert sum(state.primary.stats.costs().values()) == pytest.approx(expected)


def test_lost_callbacks_fall_back_to_polls(kind: str, box: Box, start_worker: Any) -> None:
    box.configure(pingback_drop_rate=1.0)
    nobody = free_port()  # callbacks that were not dropped would find nobody either
    start_worker(worker_env(kind, box, nobody, fallback=0.5, cold_wait=0.3))
    results = [r.get(timeout=GET_TIMEOUT) for r in [turnstile() for _ in range(5)]]
    assert all(box.verify(r["token"])["success"] for r in results)
    stats = box.stats()
    assert (stats["pingbacks_dropped"], stats["submits"]) == (5, 5)
    assert stats["res_php_get_requests"] >= 5  # each answer was read by a getTaskResult
    assert app.runtime().state.stats.callback_counts() == {}


def test_forged_replayed_and_malformed_callbacks_change_nothing(
    kind: str, box: Box, serve: Any, start_worker: Any
) -> None:
    box.configure(pingback_drop_rate=1.0)  # the test makes the callbacks
    port = serve().port
    start_worker(worker_env(kind, box, port))
    pending = turnstile()
    captcha_id = on_board(pending.id)
    ready = wait_until(lambda: result_body(box, kind, captcha_id), 10, what="the answer")
    assert isinstance(ready, dict)
    genuine = pingback.ticket(SECRET, pending.id, 0)
    other = "99" if DIALECTS[kind].id_type == "int" else "00000000-0000-0000-0000-000000000063"

    forged = pingback.ticket("another-secret-abcdef", pending.id, 0)
    assert post(port, forged, encoded(ready)) == (403, "bad_mac")
    assert post(port, genuine, b"id=1&code=0.FORGED") == (400, "not_json")
    assert post(port, genuine, b"[]") == (400, "not_json")
    assert post(port, genuine, encoded({**ready, "taskId": None})) == (400, "missing_field")
    assert post(port, genuine, b"{" + b" " * MAX_BODY + b"}") == (413, "too_large")
    # a right MAC, but a taskId that is not its attempt's captcha
    assert post(port, genuine, encoded({**ready, "taskId": task_id_of(kind, other)})) == (
        404,
        "unknown_id",
    )
    assert post(port, pingback.ticket(SECRET, "another-solve", 0), encoded(ready)) == (
        403,
        "mismatch",
    )
    assert not pending.ready()

    assert post(port, genuine, encoded(ready)) == (200, "accepted")
    result = pending.get(timeout=GET_TIMEOUT)
    assert result["token"] == ready["solution"]["token"]
    assert box.verify(result["token"])["success"]
    # the same callback again: refused, and nothing is paid or changed
    assert post(port, genuine, encoded(ready)) == (409, "replay")
    assert box.stats()["submits"] == 1
    assert app.runtime().state.stats.callback_counts() == {
        "accepted": 1,
        "bad_mac": 1,
        "not_json": 2,
        "missing_field": 1,
        "too_large": 1,
        "unknown_id": 1,
        "mismatch": 1,
        "replay": 1,
    }
