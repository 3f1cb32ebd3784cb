"""The sandbox calls back like the providers: CaptchaAI's GET, 2captcha's POST to
registered addresses, the JSON family's POST of the task's ``getTaskResult`` JSON to its
``callbackUrl``, with a delay and losses.  A plain HTTP server records the calls."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests

from captcha_tasks.core.dialects import DIALECTS
from captcha_tasks.testing.callbacks import JSON_TIMEOUT_S
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer

pytestmark = pytest.mark.redis

KEY = "cb-key"
PAGE = "https://example.com/cb"


class Recorder:
    """An HTTP server that records every request it gets."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        #: Cleared: every call is answered only once it is set again (a receiver too slow).
        self.answering = threading.Event()
        self.answering.set()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size).decode() if size else ""
                parts = urlsplit(self.path)
                call = {
                    "verb": self.command,
                    "path": parts.path,
                    "query": dict(parse_qsl(parts.query)),
                    "form": dict(parse_qsl(body)),
                    "body": body,
                    "type": self.headers.get("Content-Type"),
                    "at": time.time(),
                }
                with recorder.changed:
                    recorder.calls.append(call)
                    recorder.changed.notify_all()
                recorder.answering.wait(30)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.calls) >= count, timeout), self.calls
            return list(self.calls)

    def close(self) -> None:
        self.answering.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.close()


def submit(box: SandboxServer, pingback: str, method: str = "turnstile") -> str:
    resp = requests.post(
        f"{box.url}/in.php",
        data={
            "key": KEY,
            "method": method,
            "sitekey": "0x4A",
            "pageurl": PAGE,
            "pingback": pingback,
            "json": 1,
        },
        timeout=5,
    )
    return str(resp.json()["request"])


def answer(box: SandboxServer, captcha_id: str) -> str:
    resp = requests.post(
        f"{box.url}/res.php",
        data={"key": KEY, "action": "get", "id": captcha_id, "json": 1},
        timeout=5,
    )
    return str(resp.json()["request"])


def test_captchaai_calls_back_with_a_get_when_the_answer_is_ready(recorder: Recorder) -> None:
    config = SandboxConfig(api_keys=(KEY,), solve_time=0.3, jitter=0.0, pingback_delay=0.2)
    with SandboxServer(config) as box:
        captcha_id = submit(box, f"{recorder.url}/hook/t1")
        (call,) = recorder.wait_for(1)
        ready = box.ready_times([captcha_id])[captcha_id]
        assert call["verb"] == "GET" and call["path"] == "/hook/t1"
        assert call["query"] == {"id": captcha_id, "code": answer(box, captcha_id)}
        assert call["at"] >= ready + config.pingback_delay
        served = requests.get(f"{box.url}/sandbox/ready", params={"ids": captcha_id}, timeout=5)
        assert served.json() == {captcha_id: pytest.approx(ready, abs=0.01)}
        wait_until(lambda: box.stats()["pingbacks_sent"] == 1, 10, what="the reply counted")


def test_an_unsolvable_captcha_calls_back_its_error(recorder: Recorder) -> None:
    config = SandboxConfig(api_keys=(KEY,), solve_time=0.1, jitter=0.0, unsolvable_rate=1.0)
    with SandboxServer(config) as box:
        captcha_id = submit(box, f"{recorder.url}/hook")
        (call,) = recorder.wait_for(1)
        assert call["query"] == {"id": captcha_id, "code": "ERROR_CAPTCHA_UNSOLVABLE"}


def test_2captcha_posts_form_fields_to_registered_addresses_only(recorder: Recorder) -> None:
    config = SandboxConfig(api_keys=(KEY,), solve_time=0.1, jitter=0.0, pingback_method="POST")
    with SandboxServer(config) as box:
        submit(box, f"{recorder.url}/hook/unregistered")
        added = requests.post(
            f"{box.url}/res.php",
            data={"key": KEY, "action": "add_pingback", "addr": f"{recorder.url}/hook", "json": 1},
            timeout=5,
        )
        assert added.json() == {"status": 1, "request": "OK"}
        captcha_id = submit(box, f"{recorder.url}/hook/t2")
        (call,) = recorder.wait_for(1)
        assert (call["verb"], call["path"], call["query"]) == ("POST", "/hook/t2", {})
        assert call["form"] == {"id": captcha_id, "code": answer(box, captcha_id)}
        stats = box.stats()
        assert (stats["pingbacks_scheduled"], stats["pingbacks_unregistered"]) == (2, 1)


def test_dropped_callbacks_are_never_made(recorder: Recorder) -> None:
    config = SandboxConfig(api_keys=(KEY,), solve_time=0.0, jitter=0.0, pingback_drop_rate=1.0)
    with SandboxServer(config) as box:
        ids = [submit(box, f"{recorder.url}/hook") for _ in range(5)]
        box.update_config(pingback_drop_rate=0.0)
        last = submit(box, f"{recorder.url}/hook")
        calls = recorder.wait_for(1)
        assert [c["query"]["id"] for c in calls] == [last]  # after the 5 dropped ones
        assert box.stats()["pingbacks_dropped"] == len(ids)


# -- the JSON family ----------------------------------------------------------------------


def create_task(box: SandboxServer, kind: str, callback: str) -> Any:
    """A Turnstile ``createTask`` with a ``callbackUrl``: its ``taskId``."""
    task = {"type": DIALECTS[kind].task_types["turnstile"].proxyless}
    task.update(websiteURL=PAGE, websiteKey="0x4A")
    body = {"clientKey": KEY, "task": task, "callbackUrl": callback}
    resp = requests.post(f"{box.url}/createTask", json=body, timeout=5).json()
    assert resp["errorId"] == 0, resp
    return resp["taskId"]


def task_result(box: SandboxServer, task_id: Any) -> dict[str, Any]:
    body = {"clientKey": KEY, "taskId": task_id}
    return dict(requests.post(f"{box.url}/getTaskResult", json=body, timeout=5).json())


@pytest.mark.parametrize("kind", sorted(DIALECTS))
def test_json_providers_post_the_task_result_to_its_callback_url(
    recorder: Recorder, kind: str
) -> None:
    config = SandboxConfig(api_keys=(KEY,), kind=kind, solve_time=0.2, jitter=0.0)
    with SandboxServer(config) as box:
        task_id = create_task(box, kind, f"{recorder.url}/hook/t3")
        (call,) = recorder.wait_for(1)
        assert (call["verb"], call["path"], call["query"]) == ("POST", "/hook/t3", {})
        assert call["type"] == "application/json"
        posted = json.loads(call["body"])
        assert posted == {**task_result(box, task_id), "taskId": task_id}
        assert posted["status"] == "ready" and posted["solution"]["token"]
        assert type(posted["taskId"]) is (int if DIALECTS[kind].id_type == "int" else str)
        wait_until(lambda: box.stats()["pingbacks_sent"] == 1, 10, what="the reply counted")


@pytest.mark.parametrize("kind", sorted(DIALECTS))
def test_a_json_providers_unsolvable_task_posts_its_error(recorder: Recorder, kind: str) -> None:
    config = SandboxConfig(
        api_keys=(KEY,), kind=kind, solve_time=0.1, jitter=0.0, unsolvable_rate=1.0
    )
    with SandboxServer(config) as box:
        task_id = create_task(box, kind, f"{recorder.url}/hook")
        (call,) = recorder.wait_for(1)
        posted = json.loads(call["body"])
        assert posted["taskId"] == task_id
        assert (posted["errorId"], posted["errorCode"]) == (1, "ERROR_CAPTCHA_UNSOLVABLE")


def test_a_json_callback_not_accepted_within_two_seconds_failed(recorder: Recorder) -> None:
    config = SandboxConfig(api_keys=(KEY,), kind="anticaptcha", solve_time=0.0, jitter=0.0)
    recorder.answering.clear()  # the receiver takes the call and never answers in time
    with SandboxServer(config) as box:
        create_task(box, "anticaptcha", f"{recorder.url}/hook")
        recorder.wait_for(1)
        # given up after JSON_TIMEOUT_S (2 s), as the providers do; never made again
        wait_until(
            lambda: box.stats()["pingbacks_failed"] == 1, JSON_TIMEOUT_S + 10, what="gave up"
        )
        recorder.answering.set()
        assert box.stats()["pingbacks_sent"] == 0 and len(recorder.calls) == 1
