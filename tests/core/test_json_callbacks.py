"""The JSON family's callbacks as values: the body a provider POSTs to its ``callbackUrl``
(the task's ``getTaskResult`` JSON with its ``taskId``), read and checked without a
socket; the ticket's MAC is the in.php pingback's; each dialect's callback field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from captcha_tasks import errors
from captcha_tasks.core import pingback, steps
from captcha_tasks.core.answers import NOT_READY, Answer
from captcha_tasks.core.decisions import Deliver, Policy
from captcha_tasks.core.dialects import DIALECTS, Dialect, takes_callbacks
from captcha_tasks.core.job import Job
from captcha_tasks.core.providers import IN_PHP_KINDS
from captcha_tasks.methods import build_request
from captcha_tasks.providers.jsonapi import callback_reading
from captcha_tasks.testing.jsonface import COSTS, callback_body

pytestmark = pytest.mark.unit

SECRET = "json-callback-secret-0123"
KINDS = sorted(DIALECTS)


def body_of(dialect: Dialect, captcha_id: str = "7001", **changes: object) -> bytes:
    """What the sandbox (as the provider) POSTs for a solved Turnstile captcha."""
    text = callback_body(dialect, captcha_id, "turnstile", "0.TOKEN", None)
    return json.dumps({**json.loads(text), **changes}).encode()


@pytest.mark.parametrize("kind", KINDS)
def test_every_json_dialect_asks_for_callbacks_in_callback_url(kind: str) -> None:
    assert DIALECTS[kind].callback_field == "callbackUrl"
    assert takes_callbacks(kind)


def test_in_php_kinds_call_back_and_a_dialect_without_a_field_does_not() -> None:
    assert all(takes_callbacks(kind) for kind in IN_PHP_KINDS)
    silent = dataclasses.replace(DIALECTS["capmonster"], callback_field=None)
    assert silent.callback_field is None  # its captchas are polled


@pytest.mark.parametrize("kind", KINDS)
def test_a_json_provider_gets_the_same_ticket_as_an_in_php_one(kind: str) -> None:
    url = pingback.callback_url("https://hooks.example.com/cb", SECRET, "solve-9", 1, "backup")
    segment = url.rpartition("/")[2]
    assert pingback.read_ticket(SECRET, segment) == pingback.Ticket("solve-9", 1, "backup")
    with pytest.raises(pingback.BadMac):
        pingback.read_ticket("another-secret-of-sixteen", segment)


@pytest.mark.parametrize("kind", KINDS)
def test_a_callback_body_names_its_task(kind: str) -> None:
    dialect = DIALECTS[kind]
    found = pingback.read_json_callback(body_of(dialect, "7001"))
    assert isinstance(found, pingback.JsonCallback)
    # integer ids (Anti-Captcha, CapMonster) or CapSolver's uuid strings, as text
    expected = "7001" if dialect.id_type == "int" else "00000000-0000-0000-0000-000000001b59"
    assert found.captcha_id == expected
    assert json.loads(found.body)["solution"] == {"token": "0.TOKEN"}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"id=1&code=0.TOKEN", "not_json"),
        (b"\xff\xfe{", "not_json"),
        (b"[1, 2]", "not_json"),
        (b'"ready"', "not_json"),
        (b"", "not_json"),
        (b'{"status": "ready"}', "missing_field"),
        (b'{"taskId": true}', "missing_field"),
        (b'{"taskId": null}', "missing_field"),
        (b'{"taskId": {"id": 1}}', "missing_field"),
        (b'{"taskId": "  "}', "missing_field"),
        (json.dumps({"taskId": "x" * 101}).encode(), "missing_field"),
    ],
)
def test_what_is_no_callback_says_why(body: bytes, reason: str) -> None:
    assert pingback.read_json_callback(body) == pingback.NotACallback(reason)


@pytest.mark.parametrize("kind", KINDS)
def test_a_callback_reads_as_the_poll_of_the_same_task_would(kind: str) -> None:
    dialect = DIALECTS[kind]
    found = pingback.read_json_callback(body_of(dialect))
    assert isinstance(found, pingback.JsonCallback)
    answer = callback_reading(kind, found.body, found.captcha_id)
    cost = float(COSTS[kind]) if kind in COSTS else None
    assert answer == Answer("0.TOKEN", None, cost)


@pytest.mark.parametrize("kind", KINDS)
def test_a_callback_with_a_user_agent_and_an_object_answer(kind: str) -> None:
    dialect = DIALECTS[kind]
    text = callback_body(dialect, "5", "geetest", {"challenge": "c", "validate": "v"}, None, "UA")
    answer = callback_reading(kind, text, "5")
    assert isinstance(answer, Answer)
    assert answer == Answer({"challenge": "c", "validate": "v"}, "UA", answer.cost)


@pytest.mark.parametrize("kind", KINDS)
def test_a_callback_of_an_error_or_not_ready_reads_as_its_poll(kind: str) -> None:
    dialect = DIALECTS[kind]
    failed = callback_body(dialect, "5", "turnstile", None, "ERROR_CAPTCHA_UNSOLVABLE")
    assert isinstance(callback_reading(kind, failed, "5"), errors.UnsolvableError)
    pending = json.dumps({"errorId": 0, "taskId": 5, "status": "processing"})
    assert callback_reading(kind, pending, "5") is NOT_READY
    # a body that is no reply ends nothing (retryable: the poll's route stays open)
    assert isinstance(callback_reading(kind, "not json", "5"), errors.RetryableError)
    assert isinstance(callback_reading(kind, "[]", "5"), errors.RetryableError)


def test_an_in_php_kind_reads_its_code_as_before() -> None:
    assert callback_reading("captchaai", "0.TOKEN", "5") == Answer("0.TOKEN")
    assert isinstance(
        callback_reading("2captcha", "ERROR_CAPTCHA_UNSOLVABLE", "5"), errors.UnsolvableError
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_callback_answer_is_delivered_like_a_polled_one(kind: str) -> None:
    request = build_request("turnstile", "0x4A", "https://example.com/cb")
    job = Job.new("solve-1", request, 1000.0, 60.0).submitted("7001", 1000.0)
    found = pingback.read_json_callback(body_of(DIALECTS[kind]))
    assert isinstance(found, pingback.JsonCallback)
    reading = callback_reading(kind, found.body, found.captcha_id)
    policy = Policy(60.0, 5.0, 0.5, 2, 1, pingback_fallback=1.0)
    decision = steps.on_callback(job, reading, None, 1010.0, policy)
    assert isinstance(decision, Deliver)
    assert decision.outcome.token == "0.TOKEN"
