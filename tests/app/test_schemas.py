"""The contract in ``captcha_tasks/schemas/``: the files are valid JSON Schema, the request
schema says what ``build_request`` says, and real outcomes and batch stream entries from real
runs (a real worker, Redis and the sandbox) match them.  The Kafka messages are checked against
theirs in ``tests/kafka/test_node_client.py``, against a real broker."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from contract import load, problems, registry, validate
from image_files import png_b64
from jsonschema import Draft202012Validator

from captcha_tasks import errors, schemas, solve
from captcha_tasks.batch import stream
from captcha_tasks.methods import METHODS, build_request
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

PAGE = "https://example.com/schemas"
IMAGE = png_b64(2048)

NAMES = schemas.names()


@pytest.mark.unit
def test_the_seven_schemas_are_valid_json_schema() -> None:
    assert NAMES == [
        "batch-entry",
        "kafka-dead-letter",
        "kafka-feedback",
        "kafka-result",
        "kafka-task",
        "outcome",
        "solve-request",
    ]
    for name in NAMES:
        schema = load(name)
        Draft202012Validator.check_schema(schema)
        assert registry().contents(schema["$id"]) == schema


def method_branches() -> dict[str, dict[str, Any]]:
    request = load("solve-request")["$defs"]["request"]
    return {b["properties"]["method"]["const"]: b for b in request["oneOf"]}


@pytest.mark.unit
def test_request_schema_lists_each_method_and_its_parameters() -> None:
    request = load("solve-request")["$defs"]["request"]
    assert sorted(request["properties"]["method"]["enum"]) == sorted(METHODS)
    branches = method_branches()
    assert sorted(branches) == sorted(METHODS)
    for name, spec in METHODS.items():
        named = {"method", "sitekey", "pageurl"}
        assert set(branches[name]["properties"]) == named | spec.optional | spec.required, name
        required = {"method", *spec.required}
        required |= {"sitekey"} if spec.sitekey_field else set()
        required |= {"pageurl"} if spec.needs_pageurl else set()
        assert set(branches[name]["required"]) == required, name


REQUESTS: list[dict[str, Any]] = [
    {"method": "turnstile", "sitekey": "0x4AAA", "pageurl": PAGE},
    {"method": "turnstile", "sitekey": "0x4AAA", "pageurl": PAGE, "action": "login"},
    {"method": "userrecaptcha", "sitekey": "6Le", "pageurl": PAGE, "version": "v3",
     "min_score": 0.7},
    {"method": "userrecaptcha", "sitekey": "6Le", "pageurl": PAGE, "invisible": True},
    {"method": "geetest", "sitekey": "gt", "pageurl": PAGE, "challenge": "c"},
    {"method": "base64", "body": IMAGE, "numeric": 1},
    {"method": "grid", "body": IMAGE, "instructions": "buses", "grid_size": "3x3"},
    {"method": "bls", "images": [IMAGE] * 9, "instructions": "cats"},
    {"method": "cloudflare_challenge", "pageurl": PAGE, "proxy": "u:p@h:1"},
    {"method": "captchafox", "sitekey": "sk", "pageurl": PAGE, "proxy": "u:p@h:1"},
    {"method": "friendly_captcha", "sitekey": "FC", "pageurl": PAGE, "version": "v2"},
    {"method": "lemin", "sitekey": "CROPPED_1", "pageurl": PAGE, "div_id": "lemin"},
    {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxy": "u:p@h:1",
     "proxytype": "SOCKS5"},
    {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxy": "pool",
     "proxy_owner": "w1"},
    # refused
    {"method": "turnstile", "sitekey": "k", "pageurl": "ftp://x"},
    {"method": "turnstile", "sitekey": "k"},
    {"method": "turnstile", "sitekey": "", "pageurl": PAGE},
    {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "colour": "red"},
    {"method": "hcaptcha", "sitekey": "k", "pageurl": PAGE},
    {"sitekey": "k", "pageurl": PAGE},
    {"method": "geetest", "sitekey": "gt", "pageurl": PAGE},
    {"method": "base64"},
    {"method": "grid", "body": IMAGE, "instructions": "buses", "grid_size": "5x5"},
    {"method": "bls", "images": [IMAGE] * 8, "instructions": "cats"},
    {"method": "cloudflare_challenge", "pageurl": PAGE},
    {"method": "lemin", "sitekey": "CROPPED_1", "pageurl": PAGE},
    {"method": "base64", "body": IMAGE, "sitekey": "k"},
    {"method": "userrecaptcha", "sitekey": "6Le", "pageurl": PAGE, "min_score": 2},
    {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxytype": "FTP"},
    {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxy_owner": "w1"},
    {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "action": ["a"]},
]  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: json.dumps(r)[:60])
def test_request_schema_agrees_with_call_site_validation(request_: dict[str, Any]) -> None:
    fields = dict(request_)
    try:
        build_request(fields.pop("method", None), **fields)
        accepted = True
    except errors.ValidationError:
        accepted = False
    assert (not problems("solve-request", request_)) == accepted, problems(
        "solve-request", request_
    )


@pytest.mark.e2e
@pytest.mark.usefixtures("worker", "clean_state")
def test_real_outcomes_and_batch_entries_match(sandbox: Any, redis_conn: Any) -> None:
    solved = solve.delay(method="turnstile", sitekey="k", pageurl=PAGE).get(timeout=30)
    validate("outcome", solved)
    geetest = solve.delay(
        method="geetest", sitekey="gt", pageurl=PAGE, challenge="c", api_server="api.x"
    ).get(timeout=30)
    validate("outcome", geetest)
    assert problems("outcome", {**solved, "colour": "red"})  # the schema is closed
    assert not problems("outcome", {**solved, "user_agent": "Mozilla/5.0"})

    # raw entries, as another language reads them from the Redis stream
    batch_id = uuid.uuid4().hex
    tasks = [
        {"method": "turnstile", "sitekey": "k", "pageurl": PAGE},
        {"method": "base64", "body": IMAGE},
        {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxy": "u:p@bad-proxy:1"},
    ]
    for index, task in enumerate(tasks):
        solve.apply_async(kwargs={**task, "_batch": {"id": batch_id, "index": index}})
    key = app.runtime().state.keys.batch_results(batch_id)
    wait_until(lambda: redis_conn.xlen(key) == len(tasks), 30, what="three batch entries")
    raw = [json.loads(fields["outcome"]) for _id, fields in redis_conn.xrange(key)]
    assert sorted(e["index"] for e in raw) == [0, 1, 2]
    assert {e["status"] for e in raw} == {"solved", "failed"}
    for entry in raw:
        validate("batch-entry", entry)
        assert problems("outcome", entry)  # an entry is an outcome plus its index
    redis_conn.delete(key)

    # what stream() yields, the entries it makes up itself included
    sandbox.configure(solve_time=4, jitter=0)
    slow = [{"method": "turnstile", "sitekey": "k", "pageurl": PAGE}, {"method": "nope"}]
    yielded = list(stream(slow, timeout_per_task=1.0))
    assert sorted(r["error"] for r in yielded) == ["ERROR_SOLVE_TIMEOUT", "ERROR_VALIDATION"]
    for entry in yielded:
        validate("batch-entry", entry)
    # the shared sandbox is left idle for the next test
    wait_until(lambda: sandbox.stats()["in_flight"] == 0, 10, what="the provider to go idle")
