"""The sandbox calls back like the providers: CaptchaAI's GET, 2captcha's POST to
registered addresses, with a delay and losses.  A plain HTTP server records the calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests

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
                    "at": time.time(),
                }
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with recorder.changed:
                    recorder.calls.append(call)
                    recorder.changed.notify_all()

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
