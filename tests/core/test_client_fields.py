"""What the API client sends with a submit, read by a real HTTP server that records each
request (the sandbox answers the protocol but keeps no request bodies): ``soft_id`` from
``CAPTCHAAI_SOFT_ID`` goes with every ``in.php`` to the primary, and nowhere else."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pytest

from captcha_tasks.core.providers import ProviderSpec
from captcha_tasks.methods import build_request
from captcha_tasks.providers.inphp import CaptchaAIClient
from captcha_tasks.settings import Settings
from captcha_tasks.worker.runtime import api_client

pytestmark = pytest.mark.redis

PAGE = "https://example.com/fields"


@dataclass
class Recorder:
    url: str
    #: (path, fields) of every request, in order.
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    box: list[Recorder] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode()
            fields = {k: v[0] for k, v in parse_qs(body).items()}
            box[0].seen.append((self.path, fields))
            reply = b'{"status":1,"request":"7001"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box.append(Recorder(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield box[0]
    server.shutdown()
    server.server_close()
    thread.join(5)


def submit_with(client: CaptchaAIClient, recorder: Recorder) -> dict[str, str]:
    assert client.submit(build_request("turnstile", "k", PAGE)) == "7001"
    path, fields = recorder.seen[-1]
    assert path == "/in.php" and fields["method"] == "turnstile"
    client.close()
    return fields


def test_the_soft_id_setting_goes_with_every_submit_to_the_primary(recorder: Recorder) -> None:
    settings = Settings.from_env(
        {"CAPTCHAAI_BASE_URL": recorder.url, "CAPTCHAAI_API_KEY": "k", "CAPTCHAAI_SOFT_ID": "4580"}
    )
    assert submit_with(api_client(settings), recorder)["soft_id"] == "4580"


def test_without_the_setting_no_soft_id_is_sent(recorder: Recorder) -> None:
    settings = Settings.from_env({"CAPTCHAAI_BASE_URL": recorder.url, "CAPTCHAAI_API_KEY": "k"})
    assert "soft_id" not in submit_with(api_client(settings), recorder)


def test_another_provider_never_gets_the_primarys_soft_id(recorder: Recorder) -> None:
    settings = Settings.from_env({"CAPTCHAAI_API_KEY": "k", "CAPTCHAAI_SOFT_ID": "4580"})
    other = ProviderSpec("backup", recorder.url, "k2", threads=5, role="fallback")
    assert "soft_id" not in submit_with(api_client(settings, other), recorder)


def test_only_submits_carry_it(recorder: Recorder) -> None:
    client = CaptchaAIClient(recorder.url, "k", soft_id="4580")
    client.get("7001")
    client.close()
    assert [(path, "soft_id" in fields) for path, fields in recorder.seen] == [("/res.php", False)]
