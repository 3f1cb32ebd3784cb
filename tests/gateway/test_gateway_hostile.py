"""The gateway holds against hostile clients as the receiver does (they share the server
core): a TLS handshake, headers and a body that never finish are cut at their deadlines,
connections per address are capped at accept, the allowlist refuses before a byte is read,
and behind a trusted proxy the wrong-key budget is the client's, not the proxy's.

The gateway runs in this process; no worker is needed (nothing here is solved)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Iterator
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest
import requests
from raw_sockets import closed_after, connect, refused

from captcha_tasks.gateway import GatewayServer
from captcha_tasks.gateway.server import tls_context
from captcha_tasks.gateway.tenants import WRONG_KEYS_BURST
from captcha_tasks.serving import Limits
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app
from harness.tls import self_signed

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

KEY = "hostile-" + "h" * 24
MODULE_ENV = {"CAPTCHAAI_TENANTS": json.dumps({"t": {"key_env": "GW_T", "requests_per_s": 5}})}


@pytest.fixture
def serve(state: Any) -> Iterator[Callable[..., GatewayServer]]:
    servers: list[GatewayServer] = []

    def start(
        limits: Limits | None = None, tls: ssl.SSLContext | None = None, **settings: Any
    ) -> GatewayServer:
        runtime = app.runtime()
        if settings:
            app.use(runtime.settings.replace(**settings), runtime.state)
        try:
            servers.append(GatewayServer(limits=limits, tls=tls, environ={"GW_T": KEY}).start())
        finally:
            app.use(runtime.settings, runtime.state)
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_a_handshake_headers_and_a_body_that_never_finish(serve: Any, tmp_path: Path) -> None:
    certfile, keyfile = self_signed(tmp_path)
    limits = Limits(header_timeout=0.5, body_timeout=0.5)
    secure = serve(limits, tls=tls_context(str(certfile), str(keyfile)))
    silent = connect(secure.port)  # TCP, and never a ClientHello
    assert 0.4 <= closed_after(silent, 5) < 1.5
    plain = serve(limits)
    dripping = connect(plain.port)
    dripping.sendall(b"GET /res.php?key=")
    assert 0.4 <= closed_after(dripping, 5) < 1.5
    body = connect(plain.port)
    body.sendall(b"POST /in.php HTTP/1.1\r\nHost: g\r\nContent-Length: 100\r\n\r\nkey=")
    assert 0.4 <= closed_after(body, 5) < 1.5
    assert requests.get(f"{plain.url}/health", timeout=5).text == "ok"
    tally = plain.stats()["tally"]
    assert tally["header_timeout"] == 1 and tally["body_timeout"] == 1
    assert secure.stats()["tally"]["handshake_failed"] == 1
    for sock in (silent, dripping, body):
        sock.close()


def test_connections_per_address_are_capped_and_the_allowlist_holds(serve: Any) -> None:
    server = serve(
        Limits(max_per_address=3, header_timeout=30),
        gateway={"allow": (ip_network("127.0.0.0/30"),)},
    )
    held = [connect(server.port, "127.0.0.2") for _ in range(3)]
    wait_until(lambda: server.stats()["by_address"].get("127.0.0.2") == 3, 5, what="three held")
    assert refused(server.port, "127.0.0.2") < 1.0  # refused at accept, nothing read
    assert refused(server.port, "127.0.0.9") < 1.0
    tally = server.stats()["tally"]
    assert tally["refused_per_address"] == 1 and tally["refused_not_allowed"] == 1
    for sock in held:
        sock.close()


def test_wrong_keys_and_rates_are_the_clients_behind_a_trusted_proxy(serve: Any) -> None:
    proxy = "127.0.0.20"
    server = serve(gateway={"trusted_proxies": (ip_network(f"{proxy}/32"),)})

    def via_proxy(client: str, key: str) -> requests.Response:
        session = requests.Session()
        session.mount("http://", _SourceAdapter(proxy))
        headers = {"X-Forwarded-For": f"198.51.100.66, {client}"}  # the left one is forged
        params = {"key": key, "action": "getbalance"}
        return session.get(f"{server.url}/res.php", params=params, headers=headers, timeout=5)

    answers = [via_proxy("203.0.113.7", "w" * 32).text for _ in range(WRONG_KEYS_BURST + 1)]
    assert answers[:-1] == ["ERROR_KEY_DOES_NOT_EXIST"] * WRONG_KEYS_BURST
    assert answers[-1] == "ERROR_TOO_MUCH_REQUESTS"  # this client guessed too often
    blocked = via_proxy("203.0.113.7", KEY)
    assert blocked.status_code == 429 and blocked.headers["Retry-After"] == "1"
    assert via_proxy("203.0.113.8", KEY).status_code == 200  # another client of the proxy
    # the tenant's own rate: 5 a second (a burst of 5), whoever sends them
    statuses = [via_proxy(f"203.0.113.{30 + n}", KEY).status_code for n in range(12)]
    assert statuses.count(429) >= 1


class _SourceAdapter(requests.adapters.HTTPAdapter):
    """Connections from one loopback address (as a reverse proxy's would come)."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)
