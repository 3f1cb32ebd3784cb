"""Provider callbacks end to end: the sandbox calls back the receiver (a real asyncio
server in this process) for captchas a real worker submitted with ``pingback=``."""

from __future__ import annotations

import http.client
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
import requests
from image_files import png_b64
from prometheus_client import CollectorRegistry, generate_latest

from captcha_tasks import errors, solve
from captcha_tasks.core import pingback
from captcha_tasks.core.channel import CHANNEL_BACK, CHANNEL_SETTLE, DEGRADED, DOWN, UP
from captcha_tasks.metrics import StoreCollector
from captcha_tasks.receiver.callbacks import STRIKES_BURST, Receiver, Strikes
from captcha_tasks.receiver.server import PingbackServer
from captcha_tasks.testing.processes import free_port, wait_until
from captcha_tasks.worker.app import app
from captcha_tasks.worker.runtime import Runtime

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

SECRET = "pingback-test-secret-" + "x" * 8
PAGE = "https://example.com/pingback"
GET_TIMEOUT = 15
#: With callbacks on, a captcha is polled this long after its expected solve time: longer
#: than GET_TIMEOUT, so a solve that ends in time was ended by its callback.
NO_POLL_S = 60.0


#: The tests' cold wait (CAPTCHAAI_INITIAL_WAIT): while a method's solve times are not
#: known its captchas are polled as without callbacks, after this; longer than a callback
#: takes (the sandbox's 0.3 s solves), so a working callback comes first.
COLD_WAIT_S = 2.0


def worker_env(port: int, fallback: float, cold_wait: float = COLD_WAIT_S) -> dict[str, str]:
    return {
        "CAPTCHAAI_PINGBACK_URL": f"http://127.0.0.1:{port}/captcha/pingback",
        "CAPTCHAAI_PINGBACK_SECRET": SECRET,
        "CAPTCHAAI_PINGBACK_FALLBACK_POLL": str(fallback),
        "CAPTCHAAI_INITIAL_WAIT": str(cold_wait),
    }


def unpolled_env(port: int) -> dict[str, str]:
    """Callbacks on, and no captcha polled within GET_TIMEOUT, even before its method's
    solve times are known."""
    return worker_env(port, NO_POLL_S, cold_wait=NO_POLL_S)


@pytest.fixture
def receiver() -> Receiver:
    settings = app.runtime().settings.replace(pingback={"secret": SECRET})
    return Receiver(Runtime(app, settings, app.runtime().state).runner)


@pytest.fixture
def serve_receiver(receiver: Receiver) -> Iterator[Callable[[int], PingbackServer]]:
    servers: list[PingbackServer] = []

    def start(port: int = 0) -> PingbackServer:
        servers.append(PingbackServer(receiver, port=port).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def solve_many(count: int) -> list[Any]:
    return [solve.delay(method="turnstile", sitekey="0x4A", pageurl=PAGE) for _ in range(count)]


def solved_by_source() -> dict[str, int]:
    raw = app.runtime().state.redis.hgetall(app.runtime().state.keys.solved_counter("turnstile"))
    return {str(k): int(v) for k, v in raw.items()}


def test_callbacks_complete_captchas_without_a_single_poll(
    sandbox: Any, serve_receiver: Any, start_worker: Any
) -> None:
    server = serve_receiver()
    start_worker(unpolled_env(server.port))
    results = [r.get(timeout=GET_TIMEOUT) for r in solve_many(20)]
    assert all(sandbox.verify(r["token"])["success"] for r in results)
    # counted by the sandbox when the receiver's reply is back: maybe after the result
    wait_until(lambda: sandbox.stats()["pingbacks_sent"] == 20, 10, what="the replies")
    stats = sandbox.stats()
    assert stats["submits"] == 20
    assert stats["res_php_get_requests"] == 0
    assert solved_by_source() == {"pingback": 20}
    assert app.runtime().state.stats.callback_counts() == {"accepted": 20}
    wait_until(lambda: app.runtime().state.limiter.in_use() == 0, 5, what="threads freed")


def test_captchaai_answers_with_callbacks(
    sandbox: Any, serve_receiver: Any, start_worker: Any
) -> None:
    server = serve_receiver()
    start_worker(unpolled_env(server.port))
    grid = solve.delay(method="grid", body=png_b64(), instructions="bus", grid_size="3x3")
    lemin = solve.delay(method="lemin", sitekey="CROPPED_x", pageurl=PAGE, div_id="box")
    assert isinstance(grid.get(timeout=GET_TIMEOUT)["token"], list)
    assert set(lemin.get(timeout=GET_TIMEOUT)["token"]) == {"answer", "challenge_uuid"}
    wait_until(lambda: sandbox.stats()["pingbacks_sent"] == 2, 10, what="the replies")


def test_answers_with_a_user_agent_are_polled_not_called_back(
    sandbox: Any, serve_receiver: Any, start_worker: Any
) -> None:
    server = serve_receiver()
    start_worker(worker_env(server.port, NO_POLL_S, cold_wait=0.3))
    # a callback has no room for a user agent: such captchas are polled, not called back
    proxy = "u:p@10.0.0.1:3128"
    # ends within GET_TIMEOUT: polled at once, not after the NO_POLL_S fallback
    result = solve.delay(method="cloudflare_challenge", pageurl=PAGE, proxy=proxy).get(
        timeout=GET_TIMEOUT
    )
    assert result["user_agent"].startswith("Mozilla/5.0")
    stats = sandbox.stats()
    assert (stats["pingbacks_scheduled"], stats["res_php_get_requests"] > 0) == (0, True)


def test_lost_callbacks_cost_latency_never_a_captcha(sandbox: Any, start_worker: Any) -> None:
    sandbox.configure(pingback_drop_rate=1.0)
    nobody = free_port()  # callbacks that were not dropped would find nobody either
    start_worker(worker_env(nobody, 0.5))
    results = [r.get(timeout=GET_TIMEOUT) for r in solve_many(10)]
    assert all(r["status"] == "solved" for r in results)
    assert sandbox.stats()["pingbacks_dropped"] == 10
    sources = solved_by_source()
    assert sum(sources.values()) == 10 and "pingback" not in sources


def test_a_receiver_down_for_a_while(sandbox: Any, serve_receiver: Any, start_worker: Any) -> None:
    port = free_port()
    start_worker(worker_env(port, 1.0))
    down = [r.get(timeout=GET_TIMEOUT) for r in solve_many(5)]
    assert all(r["status"] == "solved" for r in down)
    wait_until(lambda: sandbox.stats()["pingbacks_failed"] == 5, 10, what="failed callbacks")
    serve_receiver(port)  # back up, on the address the workers send
    up = [r.get(timeout=GET_TIMEOUT) for r in solve_many(5)]
    assert all(r["status"] == "solved" for r in up)
    assert solved_by_source().get("pingback") == 5


def channel_metric() -> dict[str, float]:
    """The primary's channel, by state."""
    found = exported("captcha_tasks_pingback_channel{")
    primary = app.runtime().state.primary.name
    return {
        label.split('state="')[1].split('"')[0]: value
        for label, value in found.items()
        if f'provider="{primary}"' in label
    }


#: Rounds of five more solves a returning channel may need beyond CHANNEL_SETTLE answers.
MORE_ROUNDS = 4


def up_within(channel: Any, seconds: float) -> bool:
    """Whether the channel is up within ``seconds`` (it is judged just after each answer)."""
    try:
        wait_until(lambda: channel.read().state == UP, seconds, what="the channel up")
    except TimeoutError:
        return False
    return True


def test_when_callbacks_stop_captchas_are_polled_and_when_they_return_awaited_again(
    sandbox: Any, serve_receiver: Any, start_worker: Any
) -> None:
    port = free_port()  # nobody listens there yet: every callback is refused
    worker = start_worker(worker_env(port, 1.0))
    stopped = [r.get(timeout=GET_TIMEOUT) for r in solve_many(12)]
    assert all(r["status"] == "solved" for r in stopped)
    channel = app.runtime().state.channel
    # the answers came by poll: callbacks stopped (heard just after each result is out)
    wait_until(lambda: channel.read().state == DOWN, 10, what="the channel down")
    assert channel_metric() == {"up": 0.0, "degraded": 0.0, "down": 1.0}

    def warnings() -> list[str]:
        return [line for line in worker.log_text().splitlines() if "stopped arriving" in line]

    assert len(wait_until(warnings, 10, what="the warning")) == 1  # type: ignore[arg-type]
    late = exported("captcha_tasks_pingback_answer_late_seconds_count")
    assert list(late.values()) == [12.0]  # the primary's, every answer heard

    serve_receiver(port)  # the receiver is back: the workers kept sending its URL
    back = [r.get(timeout=GET_TIMEOUT) for r in solve_many(CHANNEL_BACK)]
    assert all(r["status"] == "solved" for r in back)
    wait_until(lambda: channel.read().state != DOWN, 10, what="the channel back")
    assert channel.read().state == DEGRADED  # until callbacks prove themselves
    for _ in range(CHANNEL_SETTLE // 5 + 1):
        assert all(r.get(timeout=GET_TIMEOUT)["status"] == "solved" for r in solve_many(5))
    # Up once the callbacks proved themselves.  On a loaded machine a degraded channel's
    # early poll can still win a race against a callback now and then; each such answer
    # lowers the share, and a few more callbacks (never many) bring it back up.
    for _ in range(MORE_ROUNDS):
        if up_within(channel, 2.0):
            break
        assert all(r.get(timeout=GET_TIMEOUT)["status"] == "solved" for r in solve_many(5))
    wait_until(lambda: channel.read().state == UP, 10, what="the channel up")
    assert solved_by_source()["pingback"] >= CHANNEL_BACK + CHANNEL_SETTLE
    assert channel_metric() == {"up": 1.0, "degraded": 0.0, "down": 0.0}


def test_an_error_in_a_callback_takes_the_polls_route(
    sandbox: Any, serve_receiver: Any, start_worker: Any
) -> None:
    sandbox.configure(unsolvable_rate=1.0)
    server = serve_receiver()
    start_worker(unpolled_env(server.port))
    with pytest.raises(errors.UnsolvableError):
        solve.delay(method="turnstile", sitekey="0x4A", pageurl=PAGE).get(timeout=GET_TIMEOUT)
    attempts = 1 + app.runtime().settings.solving.max_resubmits
    # counted once the receiver's reply is back: maybe after the result
    wait_until(lambda: sandbox.stats()["pingbacks_sent"] == attempts, 10, what="the replies")
    stats = sandbox.stats()
    assert stats["submits"] == attempts
    assert stats["res_php_get_requests"] == 0
    assert app.runtime().state.stats.callback_counts() == {"accepted": stats["submits"]}


# -- hostile callbacks --------------------------------------------------------------------


def call(
    port: int,
    segment: str,
    fields: dict[str, str] | None = None,
    verb: str = "GET",
    body: bytes | None = None,
    source: str = "127.0.0.1",
) -> tuple[int, str]:
    """One HTTP request to the receiver, from ``source`` (any 127/8 address)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    path = f"/captcha/pingback/{segment}"
    headers = {}
    if verb == "POST":
        body = body if body is not None else urlencode(fields or {}).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif fields:
        path += "?" + urlencode(fields)
    try:
        conn.request(verb, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def in_flight_captcha(solve_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for cid, job in app.runtime().state.redis.hgetall(app.runtime().state.keys.board()).items():
            if f'"solve_id":"{solve_id}"' in job:
                return {"captcha_id": str(cid), "job": job}
        return None

    return wait_until(found, 10, what="the captcha on the board")  # type: ignore[return-value]


def exported(name: str) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(StoreCollector(app.runtime().settings, app.runtime().state))
    found = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name):
            label, _, value = line.rpartition(" ")
            found[label] = float(value)
    return found


def test_forged_callbacks_are_refused_and_change_nothing(
    sandbox: Any, receiver: Receiver, serve_receiver: Any, start_worker: Any
) -> None:
    sandbox.configure(pingback_drop_rate=1.0, solve_time=0.5, jitter=0.0)  # we call back
    # a stopped clock: no strike refills between the flood and the call that must find the
    # budget spent, however slowly a loaded machine answers
    receiver.strikes = Strikes(clock=lambda: 0.0)
    port = serve_receiver().port
    start_worker(unpolled_env(port))
    pending = solve.delay(method="turnstile", sitekey="0x4A", pageurl=PAGE)
    captcha_id = in_flight_captcha(pending.id)["captcha_id"]
    genuine = pingback.ticket(SECRET, pending.id, 0)
    forged = {"id": captcha_id, "code": "0.FORGED"}

    assert call(port, pingback.ticket("another-secret-abcdef", pending.id, 0), forged) == (
        403,
        "bad_mac",
    )
    assert call(port, pingback.ticket(SECRET, "another-solve", 0), forged) == (403, "mismatch")
    assert call(port, pingback.ticket(SECRET, pending.id, 1), forged) == (403, "mismatch")
    assert call(port, genuine, {"id": "1", "code": "0.FORGED"}) == (404, "unknown_id")
    assert call(port, genuine, {"id": captcha_id}) == (400, "missing_field")
    assert call(port, genuine, verb="POST", body=b"id=1&code=" + b"x" * 20_000)[0] == 413
    assert call(port, genuine, forged, verb="PUT")[0] == 405
    assert call(port, "not-a-ticket", forged) == (404, "bad_path")
    assert not pending.ready()

    flood = [call(port, "x", forged)[0] for _ in range(STRIKES_BURST)]
    struck = 8  # the refusals above
    # the address used up its rejections
    assert flood == [404] * (STRIKES_BURST - struck) + [429] * struck
    assert call(port, genuine, forged)[0] == 429  # even a right MAC, from that address

    real = wait_until(lambda: sandbox_answer(sandbox, captcha_id), 10, what="the real answer")
    assert call(port, genuine, {"id": captcha_id, "code": real}, source="127.0.0.2") == (
        200,
        "accepted",
    )
    result = pending.get(timeout=GET_TIMEOUT)
    assert result["token"] == real and sandbox.verify(real)["success"]
    assert call(port, genuine, {"id": captcha_id, "code": real}, source="127.0.0.3") == (
        409,
        "replay",
    )

    rejected = exported("captcha_tasks_pingback_rejected_total")
    by_reason = {label.split('"')[1]: count for label, count in rejected.items()}
    expected = {"bad_mac", "mismatch", "unknown_id", "missing_field", "too_large"}
    expected |= {"method_not_allowed", "bad_path", "rate_limited", "replay"}
    assert set(by_reason) == expected
    assert by_reason["mismatch"] == 2 and by_reason["replay"] == 1
    assert exported("captcha_tasks_pingback_accepted_total") == {
        "captcha_tasks_pingback_accepted_total": 1.0
    }


def sandbox_answer(sandbox: Any, captcha_id: str) -> str | None:
    resp = requests.post(
        f"{sandbox.url}/res.php",
        data={
            "key": app.runtime().settings.providers.api_key,
            "action": "get",
            "id": captcha_id,
            "json": 1,
        },
        timeout=5,
    ).json()
    return str(resp["request"]) if resp["status"] == 1 else None


def test_2captcha_style_callbacks_to_a_registered_address(
    sandbox: Any, serve_receiver: Any, start_worker: Any
) -> None:
    sandbox.configure(pingback_method="POST")
    server = serve_receiver()
    env = unpolled_env(server.port)
    app.runtime().api().add_pingback(env["CAPTCHAAI_PINGBACK_URL"])  # pingback register
    start_worker(env)
    results = [r.get(timeout=GET_TIMEOUT) for r in solve_many(5)]
    assert all(sandbox.verify(r["token"])["success"] for r in results)
    wait_until(lambda: sandbox.stats()["pingbacks_sent"] == 5, 10, what="the replies")
    stats = sandbox.stats()
    assert stats["pingbacks_unregistered"] == 0
    assert stats["res_php_get_requests"] == 0
    assert solved_by_source() == {"pingback": 5}
