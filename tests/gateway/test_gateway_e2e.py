"""The gateway against a real worker process and the sandbox: both faces end to end, over
real sockets, as an SDK in another language would use them.

The gateway runs in this process (a thread of its own); the worker that solves is a
process; the sandbox plays the provider.  Every reply the gateway sends in this module is
kept and checked at the end for the provider's key.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from conftest import API_KEY
from hooks import Hooks
from image_files import png

from captcha_tasks import create_pool
from captcha_tasks.core.acceptance import site_of
from captcha_tasks.core.outcome import Solved
from captcha_tasks.gateway import MAX_BODY, GatewayServer
from captcha_tasks.testing.processes import free_port, wait_until
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("clean_state")]

#: The shop's callback endpoint (``callback_hosts`` lists it).
HOOK_PORT = free_port()
SHOP_KEY = "shop-" + "a" * 27
CRAWLER_KEY = "crawler-" + "b" * 24
BUDGET = 3
MODULE_ENV = {
    "CAPTCHAAI_TENANTS": json.dumps(
        {
            "shop": {
                "key_env": "GW_SHOP_KEY",
                "max_threads": 4,
                "callback_hosts": [f"127.0.0.1:{HOOK_PORT}"],
            },
            "crawler": {"key_env": "GW_CRAWLER_KEY", "daily_captchas": BUDGET},
        }
    )
}
KEYS = {"GW_SHOP_KEY": SHOP_KEY, "GW_CRAWLER_KEY": CRAWLER_KEY}
PAGE = "https://example.com/gateway"
#: Every body the gateway answered in this module.
SEEN: list[str] = []


@pytest.fixture(scope="module")
def gateway(worker: Any) -> Iterator[GatewayServer]:
    server = GatewayServer(environ=KEYS).start()
    yield server
    server.stop()
    assert not [body for body in SEEN if API_KEY in body]


def call(server: GatewayServer, path: str, method: str = "GET", **kwargs: Any) -> requests.Response:
    resp = requests.request(method, f"{server.url}/{path}", timeout=10, **kwargs)
    SEEN.append(resp.text)
    return resp


def res(server: GatewayServer, **params: Any) -> requests.Response:
    return call(server, "res.php", params={"key": SHOP_KEY, **params})


def answer_of(server: GatewayServer, captcha_id: str, key: str = SHOP_KEY) -> str:
    """Poll res.php (text) until the answer is not CAPCHA_NOT_READY."""

    def ready() -> str | None:
        text = call(server, "res.php", params={"key": key, "action": "get", "id": captcha_id}).text
        return None if text == "CAPCHA_NOT_READY" else text

    return str(wait_until(ready, 20, interval=0.1, what=f"captcha {captcha_id} answered"))


def test_in_php_and_res_php_in_text(gateway: GatewayServer, sandbox: Any) -> None:
    sent = call(
        gateway,
        "in.php",
        "POST",
        data={"key": SHOP_KEY, "method": "turnstile", "sitekey": "0x4AAA", "pageurl": PAGE},
    )
    assert sent.status_code == 200 and sent.text.startswith("OK|"), sent.text
    captcha_id = sent.text[3:]
    assert captcha_id.isdigit() and int(captcha_id) < 2**53
    text = answer_of(gateway, captcha_id)
    assert text.startswith("OK|")
    verdict = sandbox.verify(text[3:])
    assert verdict["success"] and verdict["sitekey"] == "0x4AAA" and verdict["pageurl"] == PAGE


def test_json_mode_bulk_ids_and_another_tenants_ids(gateway: GatewayServer, sandbox: Any) -> None:
    ids = []
    for n in range(3):
        sent = call(
            gateway,
            "in.php",
            params={
                "key": SHOP_KEY,
                "json": 1,
                "method": "userrecaptcha",
                "googlekey": f"6Le-{n}",
                "pageurl": PAGE,
            },
        ).json()
        assert sent["status"] == 1
        ids.append(sent["request"])
    assert len(set(ids)) == 3

    def all_ready() -> list[str] | None:
        body = res(gateway, action="get", ids=",".join(ids), json=1).json()
        items = body["request"].split("|")
        return None if "CAPCHA_NOT_READY" in items else items

    tokens = wait_until(all_ready, 20, interval=0.1, what="three answers")
    assert isinstance(tokens, list)
    assert all(sandbox.verify(t)["success"] for t in tokens)
    # another tenant does not see them
    other = call(gateway, "res.php", params={"key": CRAWLER_KEY, "action": "get", "id": ids[0]})
    assert other.text == "ERROR_WRONG_CAPTCHA_ID"
    assert res(gateway, action="get", id="99999999999", json=1).json() == {
        "status": 0,
        "request": "ERROR_WRONG_CAPTCHA_ID",
        "error_text": "ERROR_WRONG_CAPTCHA_ID",
    }


def test_a_file_part_and_a_structured_answer(gateway: GatewayServer, sandbox: Any) -> None:
    image = call(
        gateway,
        "in.php",
        "POST",
        data={"key": SHOP_KEY, "method": "post", "numeric": "1", "json": "1"},
        files={"file": ("captcha.png", png(4096), "image/png")},
    ).json()
    assert image["status"] == 1, image
    geetest = call(
        gateway,
        "in.php",
        data={
            "key": SHOP_KEY,
            "method": "geetest",
            "gt": "gt-1",
            "challenge": "ch-1",
            "pageurl": PAGE,
            "json": 1,
        },
        method="POST",
    ).json()

    def answered(captcha_id: str) -> dict[str, Any] | None:
        body = res(gateway, action="get", id=captcha_id, json=1).json()
        return None if body["request"] == "CAPCHA_NOT_READY" else body

    text = wait_until(lambda: answered(image["request"]), 20, what="the image's answer")
    assert isinstance(text, dict) and text["status"] == 1
    assert set(text["request"]) <= set("0123456789|")  # numeric=1 (a real answer may hold "|")
    solved = wait_until(lambda: answered(geetest["request"]), 20, what="the geetest answer")
    assert isinstance(solved, dict) and solved["request"]["geetest_challenge"] == "ch-1"


def test_bad_fields_are_answered_as_the_provider_would(gateway: GatewayServer) -> None:
    def submit(**fields: Any) -> dict[str, Any]:
        data = {"key": SHOP_KEY, "json": 1, **fields}
        return dict(call(gateway, "in.php", "POST", data=data).json())

    no_key = submit(method="userrecaptcha", pageurl=PAGE)
    assert (no_key["status"], no_key["request"]) == (0, "ERROR_GOOGLEKEY")
    bad_url = submit(method="turnstile", sitekey="0x4", pageurl="ftp://x")
    assert bad_url["request"] == "ERROR_PAGEURL"
    unknown = submit(method="turnstile", sitekey="0x4", pageurl=PAGE, sitkey="x")
    assert unknown["request"] == "ERROR_BAD_PARAMETERS" and "sitkey" in unknown["error_text"]
    tiny = submit(method="base64", body=base64.b64encode(b"GIF89a").decode())
    assert tiny["request"] == "ERROR_ZERO_CAPTCHA_FILESIZE"
    assert submit(method="nope")["request"] == "ERROR_BAD_PARAMETERS"
    assert submit(method="turnstile", sitekey="0x4", pageurl=PAGE, tenant="crawler")["request"] == (
        "ERROR_BAD_PARAMETERS"
    )
    callback = submit(method="turnstile", sitekey="0x4", pageurl=PAGE, pingback="http://x/y")
    assert callback["request"] == "ERROR_BAD_PARAMETERS"
    assert "not on this tenant's callback_hosts" in callback["error_text"]


def test_the_worker_calls_each_faces_callback_back(gateway: GatewayServer, sandbox: Any) -> None:
    hooks = Hooks(HOOK_PORT)
    try:
        hook = f"http://127.0.0.1:{HOOK_PORT}/hook"
        sent = call(
            gateway,
            "in.php",
            "POST",
            data={
                "key": SHOP_KEY,
                "method": "turnstile",
                "sitekey": "0x4-hook",
                "pageurl": PAGE,
                "pingback": hook,
            },
        ).text
        assert sent.startswith("OK|"), sent
        task = {"type": "TurnstileTaskProxyless", "websiteURL": PAGE, "websiteKey": "0x4-hookj"}
        body = {"clientKey": SHOP_KEY, "task": task, "callbackUrl": hook}
        created = call(gateway, "createTask", "POST", json=body).json()
        assert created["errorId"] == 0, created
        hits = hooks.wait_for(2)
    finally:
        hooks.close()
    [form] = [h.form for h in hits if h.content_type.startswith("application/x-www")]
    [result] = [h.json() for h in hits if h.content_type == "application/json"]
    assert form["id"] == sent[3:] and sandbox.verify(form["code"])["sitekey"] == "0x4-hook"
    assert result["taskId"] == created["taskId"] and result["status"] == "ready"
    assert sandbox.verify(result["solution"]["token"])["sitekey"] == "0x4-hookj"
    SEEN.extend(h.body.decode() for h in hits)  # no provider key in what a client gets


def test_wrong_keys_on_both_faces(gateway: GatewayServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="captcha_tasks")
    text = call(gateway, "in.php", "POST", data={"key": "x" * 32, "method": "turnstile"})
    assert (text.status_code, text.text) == (200, "ERROR_KEY_DOES_NOT_EXIST")
    in_json = call(gateway, "res.php", params={"key": API_KEY, "action": "getbalance", "json": 1})
    assert in_json.json()["request"] == "ERROR_KEY_DOES_NOT_EXIST"
    body = call(gateway, "getBalance", "POST", json={"clientKey": "y" * 32}).json()
    assert (body["errorId"], body["errorCode"]) == (1, "ERROR_KEY_DOES_NOT_EXIST")
    missing = call(gateway, "getBalance", "POST", json={}).json()
    assert missing["errorCode"] == "ERROR_KEY_DOES_NOT_EXIST"
    assert res(gateway, action="getbalance").status_code == 200
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("captcha_tasks"))
    for key in ("x" * 32, "y" * 32, API_KEY, SHOP_KEY):
        assert key not in ours  # no key, right or wrong, is logged (the client's own may)


def test_the_json_face_end_to_end(gateway: GatewayServer, sandbox: Any) -> None:
    created = call(
        gateway,
        "createTask",
        "POST",
        json={
            "clientKey": SHOP_KEY,
            "task": {"type": "TurnstileTaskProxyless", "websiteURL": PAGE, "websiteKey": "0x4J"},
        },
    ).json()
    assert created["errorId"] == 0 and isinstance(created["taskId"], int), created

    def ready() -> dict[str, Any] | None:
        body = call(
            gateway,
            "getTaskResult",
            "POST",
            json={"clientKey": SHOP_KEY, "taskId": created["taskId"]},
        ).json()
        return None if body.get("status") == "processing" else body

    result = wait_until(ready, 20, interval=0.1, what="the task's result")
    assert isinstance(result, dict) and result["status"] == "ready", result
    assert sandbox.verify(result["solution"]["token"])["success"]
    # a report reaches the provider that solved it
    reported = call(
        gateway,
        "reportIncorrectTokenCaptcha",
        "POST",
        json={"clientKey": SHOP_KEY, "taskId": created["taskId"]},
    ).json()
    assert reported == {"errorId": 0, "status": "success"}
    wait_until(lambda: sandbox.stats()["reports_bad"] == 1, 10, what="the report at the sandbox")
    # and counts for the site's acceptance of the provider's tokens (counted before it is sent)
    site = site_of(PAGE, "0x4J")
    assert site is not None
    counted = app.runtime().state.acceptance.read("turnstile", site).acceptance
    assert [round(c.bad, 2) for c in counted.values()] == [1.0]


def test_malformed_requests_get_the_protocols_error(gateway: GatewayServer) -> None:
    started = time.monotonic()
    broken = call(
        gateway,
        "createTask",
        "POST",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert broken.status_code == 400 and broken.json()["errorCode"] == "ERROR_BAD_PARAMETERS"
    unknown = call(
        gateway,
        "createTask",
        "POST",
        json={"clientKey": SHOP_KEY, "task": {"type": "FunCaptchaTaskProxyless"}},
    ).json()
    assert (unknown["errorId"], unknown["errorCode"]) == (1, "ERROR_TASK_NOT_SUPPORTED")
    absent = call(gateway, "createTask", "POST", json={"clientKey": SHOP_KEY}).json()
    assert absent["errorCode"] == "ERROR_TASK_ABSENT"
    field = call(
        gateway,
        "createTask",
        "POST",
        json={"clientKey": SHOP_KEY, "task": {"type": "TurnstileTask", "websiteURL": PAGE}},
    ).json()
    assert field["errorCode"] == "ERROR_INVALID_TASK_DATA"  # no websiteKey
    assert time.monotonic() - started < 2


def test_a_huge_body_is_refused_unread_and_the_gateway_keeps_serving(
    gateway: GatewayServer,
) -> None:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        size = 12 * 1024 * 1024
        sock.sendall(
            b"POST /in.php HTTP/1.1\r\nHost: g\r\nContent-Type: application/x-www-form-urlencoded"
            b"\r\nContent-Length: %d\r\n\r\n" % size
        )
        sock.sendall(b"key=" + b"x" * 65536)  # a start; the rest never needs sending
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert b"ERROR_TOO_BIG_CAPTCHA_FILESIZE" in head
    assert time.monotonic() - started < 2
    assert size > MAX_BODY
    assert res(gateway, action="getbalance").status_code == 200


def test_the_daily_budget_gives_exactly_n_tokens(gateway: GatewayServer, sandbox: Any) -> None:
    def balance() -> str:
        return call(gateway, "res.php", params={"key": CRAWLER_KEY, "action": "getbalance"}).text

    assert balance() == f"{BUDGET:.2f}"
    tokens = []
    for n in range(BUDGET + 2):
        sent = call(
            gateway,
            "in.php",
            "POST",
            data={"key": CRAWLER_KEY, "method": "turnstile", "sitekey": f"0x{n}", "pageurl": PAGE},
        ).text
        if not sent.startswith("OK|"):
            assert sent == "ERROR_ZERO_BALANCE"
            continue
        answer = answer_of(gateway, sent[3:], CRAWLER_KEY)
        assert answer.startswith("OK|"), answer
        tokens.append(answer[3:])
    assert len(tokens) == BUDGET
    assert balance() == "0.00"
    created = call(
        gateway,
        "createTask",
        "POST",
        json={
            "clientKey": CRAWLER_KEY,
            "task": {"type": "TurnstileTaskProxyless", "websiteURL": PAGE, "websiteKey": "0x4"},
        },
    ).json()
    assert created["errorCode"] == "ERROR_ZERO_BALANCE"


def test_threadsinfo_is_the_tenants_view(gateway: GatewayServer) -> None:
    body = res(gateway, action="threadsinfo", json=1).json()
    assert body["status"] == 1 and body["threads"] == 4  # the shop's max_threads
    assert body["working_threads"] + body["free_threads"] == 4


def test_requests_errors_and_answer_times_are_metrics(
    gateway: GatewayServer, metrics_url: str
) -> None:
    stats = gateway.gateway.state.gateway_stats
    # A gateway writes its counts once a second: what an earlier test's requests left in
    # its memory lands now, and counts as before.
    stats.flush()
    before = stats.read()
    shop, anyone = ("shop", "2captcha", "res.php:getbalance"), ("-", "json", "getBalance")
    asked = before[shop].requests if shop in before else 0
    refused = before[anyone].errors.get("ERROR_KEY_DOES_NOT_EXIST", 0) if anyone in before else 0
    for _ in range(3):
        assert res(gateway, action="getbalance").status_code == 200
    call(gateway, "getBalance", "POST", json={"clientKey": "z" * 32})
    stats.flush()
    text = requests.get(metrics_url, timeout=5).text
    where = 'endpoint="res.php:getbalance",protocol="2captcha",tenant="shop"'
    assert f"captcha_tasks_gateway_requests_total{{{where}}} {asked + 3}.0" in text
    assert f"captcha_tasks_gateway_request_seconds_count{{{where}}} {asked + 3}.0" in text
    wrong = 'code="ERROR_KEY_DOES_NOT_EXIST",endpoint="getBalance",protocol="json",tenant="-"'
    assert f"captcha_tasks_gateway_errors_total{{{wrong}}} {refused + 1}.0" in text
    assert SHOP_KEY not in text and "z" * 32 not in text


def test_a_request_a_pool_fits_is_answered_from_the_pool_at_once(
    gateway: GatewayServer, state: Any
) -> None:
    spec = create_pool("gw-pool", "turnstile", "0x4-pooled", PAGE, size=2, ttl=100)
    now = time.time()
    pooled = Solved("pooled-token", "7001", "turnstile", "api", 9.5, now - 10, now + 90)
    assert state.pools.add(spec.name, pooled.to_dict(), 90)
    sent = call(
        gateway,
        "in.php",
        "POST",
        data={"key": SHOP_KEY, "method": "turnstile", "sitekey": "0x4-pooled", "pageurl": PAGE},
    ).text
    assert sent.startswith("OK|")
    # answered at the first poll with the pooled token (the sandbox never made this one)
    assert res(gateway, action="get", id=sent[3:]).text == "OK|pooled-token"
