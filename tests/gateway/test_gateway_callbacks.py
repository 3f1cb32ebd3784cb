"""A client's own callback through the gateway: ``pingback`` (in.php) and ``callbackUrl``
(JSON), allowed by the tenant's ``callback_hosts`` or refused at submit with nothing
submitted; and the delivery (``gateway.delivery``) to a real HTTP server on this machine:
the body each face sends, a redirect not followed, a failure tried again then given up
without logging the token, a listed name resolving inside refused.

The gateway runs in this process; no worker runs (the solve's end is written as the
completion writes it); the worker's side is ``test_gateway_e2e``."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import requests
from celery import states
from hooks import Hooks

from captcha_tasks import errors
from captcha_tasks.gateway import GatewayServer
from captcha_tasks.gateway.delivery import deliver, gateway_callback
from captcha_tasks.gateway.service import IN_PHP_FACE, JSON_FACE, Gateway
from captcha_tasks.state.gateway import Ticket
from captcha_tasks.testing.processes import free_port, queue_names
from captcha_tasks.worker import names
from captcha_tasks.worker.app import app
from captcha_tasks.worker.results import Results

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("clean_state")]

HOOK_PORT = free_port()
SHOP_KEY = "shop-" + "c" * 27
OTHER_KEY = "other-" + "d" * 26
MODULE_ENV = {
    "CAPTCHAAI_TENANTS": json.dumps(
        {
            "shop": {
                "key_env": "GW_SHOP_KEY",
                "callback_hosts": [f"127.0.0.1:{HOOK_PORT}", "hooks.example"],
            },
            "other": {"key_env": "GW_OTHER_KEY"},
        }
    )
}
PAGE = "https://example.com/hooked"
TOKEN = "tok-" + "z" * 40
HOOK = f"http://127.0.0.1:{HOOK_PORT}/hook"


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    server = Hooks(HOOK_PORT)
    yield server
    server.close()


@pytest.fixture
def gateway_server(
    isolated_module: str, redis_url: str, env: dict[str, str]
) -> Iterator[GatewayServer]:
    server = GatewayServer(environ={"GW_SHOP_KEY": SHOP_KEY, "GW_OTHER_KEY": OTHER_KEY}).start()
    yield server
    server.stop()
    _purge(redis_url, env)


def _purge(redis_url: str, env: dict[str, str]) -> None:
    conn = redis.Redis.from_url(redis_url)
    conn.delete(*queue_names(env))
    conn.close()


def _messages(redis_url: str, env: dict[str, str]) -> list[dict[str, Any]]:
    conn = redis.Redis.from_url(redis_url)
    raw = [m for q in queue_names(env) for m in conn.lrange(q, 0, -1)]
    conn.close()
    return [json.loads(m) for m in raw]


def test_a_callback_host_off_the_list_is_refused_and_nothing_is_submitted(
    gateway_server: GatewayServer, redis_conn: Any, state: Any, redis_url: str, env: dict[str, str]
) -> None:
    url = gateway_server.url
    fields = {"method": "turnstile", "sitekey": "0x4", "pageurl": PAGE}
    text = requests.post(
        f"{url}/in.php",
        data={"key": SHOP_KEY, **fields, "pingback": "http://evil.example/x"},
        timeout=10,
    )
    assert text.text == "ERROR_BAD_PARAMETERS"
    as_json = requests.post(
        f"{url}/in.php",
        data={
            "key": SHOP_KEY,
            "json": 1,
            **fields,
            "pingback": f"http://127.0.0.1:{HOOK_PORT + 1}/",
        },
        timeout=10,
    ).json()
    assert as_json["status"] == 0 and as_json["request"] == "ERROR_BAD_PARAMETERS"
    assert "callback_hosts" in as_json["error_text"]
    task = {"type": "TurnstileTaskProxyless", "websiteURL": PAGE, "websiteKey": "0x4"}
    for key, callback in [
        (SHOP_KEY, "http://169.254.169.254/latest/meta-data"),
        (SHOP_KEY, f"http://user:pw@127.0.0.1:{HOOK_PORT}/hook"),
        (SHOP_KEY, ["not", "a", "url"]),
        (OTHER_KEY, HOOK),  # allowed for shop, not for a tenant with no list
    ]:
        body = {"clientKey": key, "task": task, "callbackUrl": callback}
        refused = requests.post(f"{url}/createTask", json=body, timeout=10).json()
        assert (refused["errorId"], refused["errorCode"]) == (1, "ERROR_BAD_PARAMETERS"), refused
        assert "callbackUrl refused" in refused["errorDescription"]
    # nothing was submitted: no id issued, no message sent
    assert redis_conn.get(state.keys.gateway_ids()) is None
    assert _messages(redis_url, env) == []
    # an allowed one is taken, and the delivery is linked to the solve by the id alone
    taken = requests.post(
        f"{url}/in.php", data={"key": SHOP_KEY, "json": 1, **fields, "pingback": HOOK}, timeout=10
    ).json()
    assert taken["status"] == 1, taken
    [message] = _messages(redis_url, env)
    _, kwargs, embed = json.loads(base64.b64decode(message["body"]))
    # carried in the solve's arguments for the completion, not where Celery would run it
    assert (embed["callbacks"], embed["errbacks"]) == (None, None)
    followup = kwargs["_followup"]
    for linked in (followup["callbacks"], followup["errbacks"]):
        assert [(s["task"], s["args"], s["immutable"]) for s in linked] == [
            (names.GATEWAY_CALLBACK, [taken["request"]], True)
        ]


def _issue(state: Any, ticket: Ticket) -> str:
    return str(state.gateway.issue(ticket, 300))


def _solved(method: str = "turnstile") -> dict[str, Any]:
    return {"status": "solved", "captcha_id": "77", "method": method, "token": TOKEN}


def _failed(state: Any, face: str, url: str = HOOK) -> str:
    """A gateway id whose solve ended unsolvable (its record as the completion writes it)."""
    task_id = str(uuid.uuid4())
    results = Results(app)
    error = errors.UnsolvableError("no worker could solve it", "ERROR_CAPTCHA_UNSOLVABLE")
    record = results.record(task_id, states.FAILURE, error)
    state.db.redis.set(results.key(task_id), record, ex=300)
    return _issue(state, Ticket("shop", "turnstile", task_id, callback=url, face=face))


def test_each_face_sends_the_answer_as_its_provider_does(hooks: Hooks, state: Any) -> None:
    gateway = Gateway(state)
    text_id = _issue(
        state, Ticket("shop", "turnstile", outcome=_solved(), callback=HOOK, face=IN_PHP_FACE)
    )
    json_id = _issue(
        state,
        Ticket(
            "shop", "userrecaptcha", outcome=_solved("userrecaptcha"), callback=HOOK, face=JSON_FACE
        ),
    )
    bad_text, bad_json = _failed(state, IN_PHP_FACE), _failed(state, JSON_FACE)
    for captcha_id in (text_id, json_id, bad_text, bad_json):
        assert deliver(gateway, captcha_id) is None
    text, as_json, failed_text, failed_json = hooks.wait_for(4)
    assert (text.verb, text.path, text.content_type) == (
        "POST",
        "/hook",
        "application/x-www-form-urlencoded",
    )
    assert text.form == {"id": text_id, "code": TOKEN}
    assert as_json.content_type == "application/json"
    assert as_json.json() == {
        "taskId": int(json_id),
        "errorId": 0,
        "status": "ready",
        "solution": {"gRecaptchaResponse": TOKEN},
        "cost": "0",
        "solveCount": 1,
    }
    assert failed_text.form == {"id": bad_text, "code": "ERROR_CAPTCHA_UNSOLVABLE"}
    assert failed_json.json()["taskId"] == int(bad_json)
    assert failed_json.json()["errorCode"] == "ERROR_CAPTCHA_UNSOLVABLE"


def test_a_redirect_is_not_followed_and_other_hosts_are_not_called(
    hooks: Hooks, state: Any
) -> None:
    gateway = Gateway(state)

    def ticket(url: str, tenant: str = "shop") -> str:
        return _issue(
            state, Ticket(tenant, "turnstile", outcome=_solved(), callback=url, face=IN_PHP_FACE)
        )

    moved = deliver(gateway, ticket(f"http://127.0.0.1:{HOOK_PORT}/redirect"))
    assert moved is not None and not moved.again and "302" in moved.reason
    assert [h.path for h in hooks.wait_for(1)] == ["/redirect"]
    broken = deliver(gateway, ticket(f"http://127.0.0.1:{HOOK_PORT}/fail"))
    assert broken is not None and broken.again and "HTTP 500" in broken.reason
    # a listed name is followed to public addresses only; the list is read again at delivery
    inside = deliver(gateway, ticket("http://hooks.example/cb"), lambda host, port: ["127.0.0.1"])
    assert inside is not None and not inside.again and "not allowed" in inside.reason
    unlisted = deliver(gateway, ticket(HOOK, tenant="other"))
    assert unlisted is not None and "callback_hosts" in unlisted.reason
    assert [h.path for h in hooks.hits] == ["/redirect", "/fail"]
    assert hooks.at("/elsewhere") == []


def test_a_failing_callback_is_tried_again_then_given_up_without_its_token(
    hooks: Hooks, state: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="captcha_tasks")
    url = f"http://127.0.0.1:{HOOK_PORT}/fail"
    captcha_id = _issue(
        state, Ticket("shop", "turnstile", outcome=_solved(), callback=url, face=IN_PHP_FACE)
    )
    # eager: each retry runs at once (its countdown is the worker's business)
    gateway_callback.apply(args=(captcha_id,))
    assert len(hooks.at("/fail")) == 4
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"callback of gateway captcha {captcha_id} given up after 4 tries: HTTP 500" in logged
    assert TOKEN not in logged
