"""The pingback server against hostile clients: a real server in this process, real sockets,
and loopback addresses (every 127.0.0.x is the loopback on Linux) as distinct clients.

The sandbox, which plays the provider, calls back from 127.0.0.1; attackers come from
127.0.0.2 and up.  The thousand-connection attack runs in a process of its own
(:class:`harness.slowloris.Attack`), so its work does not slow this process's
probes.
"""

from __future__ import annotations

import http.client
import logging
import re
import resource
import threading
import time
from collections.abc import Callable, Iterator
from ipaddress import ip_network
from typing import Any

import pytest
from cheroot import wsgi
from raw_sockets import closed_after, connect, refused
from system_parts import ensure_open_files

from captcha_tasks import solve
from captcha_tasks.receiver import Limits, PingbackServer, Receiver, make_wsgi_app
from captcha_tasks.receiver.callbacks import STRIKES_BURST, Strikes
from captcha_tasks.serving.server import FD_RESERVE, fit_to_open_files
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.runtime import Runtime
from harness.slowloris import Attack

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

SECRET = "receiver-server-secret-0123"
PAGE = "https://example.com/receiver"
PROVIDER = "127.0.0.1"  # where the sandbox's callbacks come from
#: With callbacks on, a captcha is polled this long after its expected solve time: longer
#: than the test, so a solve that ends was ended by its callback.
NO_POLL_S = 60.0
HEALTH_BUDGET_S = 0.5


def receiver_of(settings: Any, strikes: Strikes | None = None) -> Receiver:
    """A receiver with ``settings`` on this module's Redis state."""
    return Receiver(Runtime(app, settings, app.runtime().state).runner, strikes)


def spent_strikes() -> Strikes:
    """Strike budgets on a stopped clock: none refills while a test counts to the burst,
    however slowly a loaded machine answers (one per second would, on the wall clock)."""
    return Strikes(clock=lambda: 0.0)


@pytest.fixture
def serve() -> Iterator[Callable[..., PingbackServer]]:
    """Start a server: ``serve(limits, strikes, **pingback)`` (fields of the pingback
    settings)."""
    servers: list[PingbackServer] = []

    def start(
        limits: Limits | None = None, strikes: Strikes | None = None, **pingback: Any
    ) -> PingbackServer:
        config = app.runtime().settings.replace(pingback={"secret": SECRET, **pingback})
        servers.append(PingbackServer(receiver_of(config, strikes), limits=limits).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def request(
    port: int,
    path: str,
    source: str = PROVIDER,
    headers: dict[str, str] | None = None,
) -> tuple[int, str, float]:
    """One GET from ``source``: status, body and seconds taken."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(), time.monotonic() - started
    finally:
        conn.close()


def held(server: PingbackServer, address: str) -> int:
    return int(server.stats()["by_address"].get(address, 0))


def tally(server: PingbackServer) -> dict[str, int]:
    return dict(server.stats()["tally"])


# -- a thousand slow connections ------------------------------------------------------------


def worker_env(port: int) -> dict[str, str]:
    return {
        "CAPTCHAAI_PINGBACK_URL": f"http://127.0.0.1:{port}/captcha/pingback",
        "CAPTCHAAI_PINGBACK_SECRET": SECRET,
        "CAPTCHAAI_PINGBACK_FALLBACK_POLL": str(NO_POLL_S),
        # nor polled before its method's solve times are known: every answer by callback
        "CAPTCHAAI_INITIAL_WAIT": str(NO_POLL_S),
    }


def test_health_and_callbacks_hold_under_a_thousand_slow_connections(
    serve: Any, sandbox: Any, start_worker: Any
) -> None:
    ensure_open_files(4096)  # the server's 464 held connections, and the flood's churn
    limits = Limits()
    server = serve(limits)
    start_worker(worker_env(server.port))
    attackers = [f"127.0.0.{n}" for n in range(3, 43)]
    attack = Attack(server.port, "127.0.0.2=600", "127.0.0.3-42=10")
    try:

        def in_place() -> bool:
            by = server.stats()["by_address"]
            others = sum(by.get(a, 0) for a in attackers)
            return by.get("127.0.0.2") == limits.max_per_address and others == 400

        wait_until(in_place, 30, what="600 + 400 slow connections opened")
        pending = [solve.delay(method="turnstile", sitekey="0x4A", pageurl=PAGE) for _ in range(30)]
        latencies, most_held = [], 0
        next_at = time.monotonic()
        for _ in range(12):  # every 0.5 s for 6 s, from the provider's address
            status, body, seconds = request(server.port, "/health")
            assert (status, body) == (200, "ok")
            latencies.append(seconds)
            most_held = max(most_held, held(server, "127.0.0.2"))
            next_at += 0.5
            time.sleep(max(0.0, next_at - time.monotonic()))  # the probe's cadence
        results = [r.get(timeout=15) for r in pending]
        under_attack = server.stats()
    finally:
        counts = attack.stop()
    assert max(latencies) < HEALTH_BUDGET_S, latencies
    assert all(r["status"] == "solved" for r in results)
    assert all(sandbox.verify(r["token"])["success"] for r in results)
    solved = app.runtime().state.stats.solved("turnstile")
    assert solved == {"pingback": 30}  # every answer came by callback, through the attack
    assert sandbox.stats()["res_php_get_requests"] == 0
    # the one address was capped; its flood of further connections refused at accept
    assert most_held == limits.max_per_address
    assert under_attack["tally"]["refused_per_address"] > 0
    assert counts["127.0.0.2"]["opened"] + counts["127.0.0.2"]["failed"] > 600
    assert counts["127.0.0.3-42"]["max_open"] == 400


# -- deadlines ------------------------------------------------------------------------------


def test_connections_that_never_finish_are_closed_by_the_deadlines(serve: Any) -> None:
    limits = Limits(header_timeout=0.5, body_timeout=0.5)
    server = serve(limits)
    port = server.port
    # a flood that never sends a byte: 50 connections from each of four addresses
    flood = [connect(port, f"127.0.0.{4 + n % 4}") for n in range(200)]

    def flood_taken() -> bool:
        # Each flood connection is open, or already closed by its header deadline: on a
        # loaded machine the first ones time out before the last ones are accepted, so
        # "200 open at once" is a race, not a state.
        stats = server.stats()
        return stats["open"] + stats["tally"].get("header_timeout", 0) == 200

    wait_until(flood_taken, 10, what="every flood connection accepted")
    # one that drips a header line every 0.1 s: busy, yet never done
    dripping = connect(port, "127.0.0.8")
    dripping.sendall(b"GET /captcha/pingback/x HTTP/1.1\r\nHost: r\r\n")
    dripped_at = time.monotonic()
    dripping.settimeout(0.1)
    while True:
        try:
            if dripping.recv(4096) == b"":
                break
        except TimeoutError:
            dripping.sendall(b"X-Slow: 1\r\n")
        except ConnectionResetError:
            break
        assert time.monotonic() - dripped_at < 5, "a dripping connection was kept"
    dripped = time.monotonic() - dripped_at
    # one whose body never comes
    slow_body = connect(port, "127.0.0.9")
    slow_body.sendall(
        b"POST /captcha/pingback/x HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\nid=1"
    )
    body_closed = closed_after(slow_body, 5)
    # the provider is answered meanwhile
    assert request(port, "/health")[:2] == (200, "ok")
    flood_closed = [closed_after(s, 5) for s in flood]

    assert limits.header_timeout * 0.9 <= dripped < limits.header_timeout + 1
    assert limits.body_timeout * 0.9 <= body_closed < limits.body_timeout + 1
    assert max(flood_closed) < limits.header_timeout + 1
    counts = tally(server)
    assert counts["header_timeout"] == 201 and counts["body_timeout"] == 1
    wait_until(lambda: server.stats()["open"] == 0, 5, what="every connection closed")
    for s in [*flood, dripping, slow_body]:
        s.close()


# -- caps -------------------------------------------------------------------------------------


def test_connections_per_address_are_capped(serve: Any) -> None:
    server = serve(Limits(max_per_address=5, header_timeout=30))
    port = server.port
    five = [connect(port, "127.0.0.10") for _ in range(5)]
    wait_until(lambda: held(server, "127.0.0.10") == 5, 5, what="five held")
    assert refused(port, "127.0.0.10") < 1.0  # at accept, long before any deadline
    assert tally(server) == {"refused_per_address": 1}
    assert request(port, "/health", source="127.0.0.11")[:2] == (200, "ok")
    five.pop().close()
    wait_until(lambda: held(server, "127.0.0.10") == 4, 5, what="one closed")
    five.append(connect(port, "127.0.0.10"))  # room again
    wait_until(lambda: held(server, "127.0.0.10") == 5, 5, what="five held again")
    assert tally(server) == {"refused_per_address": 1}
    for s in five:
        s.close()


def test_a_full_server_closes_the_connection_waiting_longest(serve: Any) -> None:
    server = serve(Limits(max_connections=10, header_timeout=30))
    port = server.port
    waiting = [connect(port, f"127.0.0.{20 + n}") for n in range(10)]
    for n in range(10):  # one by one, so the first is the one waiting longest
        wait_until(lambda n=n: held(server, f"127.0.0.{20 + n}") == 1, 5, what="held")
    assert request(port, "/health")[:2] == (200, "ok")
    assert closed_after(waiting[0], 5) < 1.0
    assert tally(server) == {"evicted": 1}
    assert held(server, "127.0.0.21") == 1  # the others stay
    for s in waiting:
        s.close()


def test_judging_is_bounded_and_health_never_waits_for_it(serve: Any, redis_conn: Any) -> None:
    # a Redis that stalls (CLIENT PAUSE) holds every judging thread
    server = serve(Limits(judge_threads=1, max_pending=2))
    port = server.port
    callbacks = [connect(port, f"127.0.0.{30 + n}") for n in range(3)]
    redis_conn.execute_command("CLIENT", "PAUSE", 1500, "ALL")
    try:
        for s in callbacks[:2]:
            s.sendall(b"GET /captcha/pingback/not-a-ticket HTTP/1.1\r\nHost: r\r\n\r\n")
        wait_until(lambda: server.stats()["pending"] == 2, 5, what="two being judged")
        callbacks[2].sendall(b"GET /captcha/pingback/not-a-ticket HTTP/1.1\r\nHost: r\r\n\r\n")
        callbacks[2].settimeout(1.0)  # before the pause ends
        assert callbacks[2].recv(4096).startswith(b"HTTP/1.1 503 ")
        status, body, seconds = request(port, "/health")
        assert (status, body) == (200, "ok") and seconds < HEALTH_BUDGET_S
    finally:
        redis_conn.execute_command("CLIENT", "UNPAUSE")
    for s in callbacks[:2]:
        s.settimeout(10)
        assert s.recv(4096).startswith(b"HTTP/1.1 404 ")  # judged once Redis answers
    assert tally(server) == {"busy": 1}
    for s in callbacks:
        s.close()


# -- the allowlist ------------------------------------------------------------------------------


def test_the_allowlist_refuses_other_sources_before_reading(serve: Any) -> None:
    server = serve(Limits(header_timeout=30), allow=(ip_network("127.0.0.40/31"),))
    port = server.port
    assert request(port, "/health", source="127.0.0.41")[:2] == (200, "ok")
    # at accept, long before any deadline: nothing sent, nothing awaited
    assert refused(port, "127.0.0.42") < 1.0
    assert refused(port, "127.0.0.42", b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n") < 1.0
    assert tally(server) == {"refused_not_allowed": 2}
    assert app.runtime().state.stats.callback_counts() == {}  # never judged


# -- reverse proxies ------------------------------------------------------------------------


def test_x_forwarded_for_is_read_only_from_trusted_proxies(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, direct = "127.0.0.50", "127.0.0.51"
    server = serve(
        Limits(max_per_address=2, header_timeout=30),
        spent_strikes(),
        trusted_proxies=(ip_network(f"{proxy}/32"),),
        allow=(ip_network("203.0.113.0/24"), ip_network(f"{direct}/32")),
    )
    port = server.port
    path = "/captcha/pingback/not-a-ticket"

    def via_proxy(client: str) -> int:
        headers = {"X-Forwarded-For": f"198.51.100.66, {client}"}  # the left one is forged
        return request(port, path, source=proxy, headers=headers)[0]

    caplog.set_level(logging.INFO, logger="captcha_tasks.receiver.callbacks")
    # the strike budget is the client's behind the proxy, not the proxy's
    assert [via_proxy("203.0.113.7") for _ in range(STRIKES_BURST)] == [404] * STRIKES_BURST
    assert via_proxy("203.0.113.7") == 429
    assert via_proxy("203.0.113.8") == 404  # another client of the same proxy
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any("203.0.113.7" in m for m in refused)
    assert not any(proxy in m for m in refused)
    # the allowlist too, once the headers name the client
    assert via_proxy("192.0.2.1") == 403
    # from elsewhere the header is the client's own word: ignored
    forged = {"X-Forwarded-For": "203.0.113.99"}
    statuses = [request(port, path, source=direct, headers=forged)[0] for _ in range(31)]
    assert statuses[-1] == 429  # the direct address paid for all of them
    assert via_proxy("203.0.113.99") == 404  # the named one paid nothing
    # a proxy is many clients: no cap per address on it
    through = [connect(port, proxy) for _ in range(4)]
    wait_until(lambda: held(server, proxy) == 4, 5, what="four connections from the proxy")
    for s in through:
        s.close()


def test_the_wsgi_app_reads_the_client_behind_a_trusted_proxy() -> None:
    proxy = "127.0.0.60"
    settings = app.runtime().settings.replace(
        pingback={"secret": SECRET, "trusted_proxies": (ip_network(f"{proxy}/32"),)}
    )
    server = wsgi.Server(
        ("127.0.0.1", 0), make_wsgi_app(receiver_of(settings, spent_strikes())), numthreads=2
    )
    server.prepare()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        port = int(server.bind_addr[1])
        path, named = "/captcha/pingback/not-a-ticket", {"X-Forwarded-For": "203.0.113.7"}
        statuses = [request(port, path, proxy, named)[0] for _ in range(STRIKES_BURST + 1)]
        assert statuses[-1] == 429
        other = {"X-Forwarded-For": "203.0.113.8"}
        assert request(port, path, proxy, other)[0] == 404
    finally:
        server.stop()
        thread.join()


# -- HTTP ------------------------------------------------------------------------------------


def test_kept_alive_and_pipelined_requests_are_answered_in_order(serve: Any) -> None:
    port = serve().port
    sock = connect(port, "127.0.0.70")
    sock.sendall(
        b"GET /health HTTP/1.1\r\nHost: r\r\n\r\n"
        b"GET /captcha/pingback/not-a-ticket HTTP/1.1\r\nHost: r\r\n\r\n"
        b"HEAD /health HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n"
    )
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    sock.close()
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", received)
    assert statuses == [b"200", b"404", b"200"]
    assert received.count(b"bad_path") == 1 and received.endswith(b"\r\n\r\n")  # HEAD: no body


def test_malformed_and_oversized_requests(serve: Any) -> None:
    server = serve()
    port = server.port
    garbage = connect(port, "127.0.0.71")
    garbage.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    assert garbage.recv(4096).startswith(b"HTTP/1.1 400 ")
    garbage.close()
    huge = connect(port, "127.0.0.72")
    huge.sendall(b"GET /health HTTP/1.1\r\nHost: r\r\nX-Big: " + b"x" * 20_000 + b"\r\n\r\n")
    assert huge.recv(4096).startswith(b"HTTP/1.1 431 ")
    huge.close()
    assert tally(server) == {"bad_request": 2}


def test_no_more_connections_are_promised_than_open_files_allow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        wanted = Limits(max_connections=100_000)
        assert fit_to_open_files(wanted) == wanted
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 100_000 + FD_RESERVE
        return
    fitted = fit_to_open_files(Limits(max_connections=hard))  # needs FD_RESERVE more
    assert fitted.max_connections == hard - FD_RESERVE
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard  # raised as far as it goes
    assert f"takes {hard - FD_RESERVE} connections, not {hard}" in caplog.text
