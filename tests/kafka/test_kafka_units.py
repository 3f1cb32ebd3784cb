"""The Kafka bridge's parts without a broker: settings, client configs, message shapes,
offset bookkeeping and claims (against the real Redis server)."""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from contract import problems, validate
from image_files import png

from captcha_tasks.errors import ConfigurationError, ValidationError
from captcha_tasks.kafka.claims import ClaimStore
from captcha_tasks.kafka.client import (
    INSTALL_HINT,
    PartitionLag,
    RepeatFilter,
    TaskProducer,
    consumer_config,
    producer_config,
)
from captcha_tasks.kafka.feedback import FeedbackReader, result_of
from captcha_tasks.kafka.messages import (
    BadMessage,
    Feedback,
    Source,
    dead_letter,
    dead_letter_headers,
    feedback_value,
    parse_feedback,
    parse_task,
    task_value,
)
from captcha_tasks.kafka.offsets import OffsetTracker
from captcha_tasks.settings import ENVIRONMENT_VARIABLES, Settings
from captcha_tasks.worker.app import app

PAGE = "https://example.com/login"
KAFKA_VARS = {
    "KAFKA_BOOTSTRAP_SERVERS",
    "KAFKA_TASKS_TOPIC",
    "KAFKA_RESULTS_TOPIC",
    "KAFKA_DEAD_LETTER_TOPIC",
    "KAFKA_FEEDBACK_TOPIC",
    "KAFKA_GROUP_ID",
    "KAFKA_MAX_IN_FLIGHT",
    "KAFKA_RESULT_TTL",
    "KAFKA_CLIENT_CONFIG",
}


# -- settings and client configs ------------------------------------------------------------


@pytest.mark.unit
def test_kafka_settings_have_defaults_and_read_the_environment() -> None:
    assert KAFKA_VARS <= ENVIRONMENT_VARIABLES
    s = Settings.from_env({"CAPTCHAAI_THREADS": "15"})
    assert (
        s.kafka.tasks_topic,
        s.kafka.results_topic,
        s.kafka.dead_letter_topic,
        s.kafka.feedback_topic,
    ) == ("captcha-tasks", "captcha-results", "captcha-dead-letter", "captcha-feedback")
    assert s.kafka.in_flight_limit(s.providers.threads) == 30  # twice the plan's threads
    s = Settings.from_env(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092",
            "KAFKA_MAX_IN_FLIGHT": "7",
            "KAFKA_CLIENT_CONFIG": '{"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}',
        }
    )
    assert (s.kafka.bootstrap_servers, s.kafka.in_flight_limit(s.providers.threads)) == (
        "k1:9092,k2:9092",
        7,
    )
    assert s.kafka.client_config["sasl.password"] == "hunter2"
    assert "hunter2" not in repr(s)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("KAFKA_MAX_IN_FLIGHT", "0"),
        ("KAFKA_MAX_IN_FLIGHT", "lots"),
        ("KAFKA_RESULT_TTL", "0"),
        ("KAFKA_RESULTS_TOPIC", "captcha-tasks"),
        ("KAFKA_FEEDBACK_TOPIC", "captcha-results"),
        ("KAFKA_CLIENT_CONFIG", "[1, 2]"),
        ("KAFKA_CLIENT_CONFIG", '{"sasl.password": "hunter2", "nested": {"a": 1}}'),
        ("KAFKA_CLIENT_CONFIG", '{"sasl.password": "hunter2"'),
    ],
)
def test_bad_kafka_values_name_the_variable_not_the_secret(var: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.from_env({var: value})
    assert var in str(info.value)
    assert "hunter2" not in str(info.value)


@pytest.mark.unit
def test_client_config_cannot_switch_off_what_correctness_needs() -> None:
    extra = {
        "enable.auto.commit": True,
        "group.id": "someone-else",
        "acks": 1,
        "sasl.username": "bridge",
        "session.timeout.ms": 6000,
    }
    s = Settings.from_env({"KAFKA_GROUP_ID": "bridges", "KAFKA_CLIENT_CONFIG": json.dumps(extra)})
    consumer = consumer_config(s)
    assert (consumer["group.id"], consumer["enable.auto.commit"]) == ("bridges", False)
    assert (consumer["sasl.username"], consumer["session.timeout.ms"]) == ("bridge", 6000)
    assert consumer["auto.offset.reset"] == "earliest"
    producer = producer_config(s)
    assert (producer["acks"], producer["enable.idempotence"]) == ("all", True)


@pytest.mark.unit
def test_repeated_librdkafka_lines_are_let_through_once_a_minute() -> None:
    repeat = RepeatFilter(every_s=60)

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("librdkafka", logging.ERROR, __file__, 1, text, None, None)

    assert repeat.filter(record("Connect to 127.0.0.1:9 failed"))
    assert not repeat.filter(record("Connect to 127.0.0.1:9 failed"))
    assert repeat.filter(record("Authentication failed"))


@pytest.mark.unit
def test_lag_counts_from_the_earliest_offset_until_the_group_commits() -> None:
    assert PartitionLag(0, None, 10, 25).lag == 15
    assert PartitionLag(0, 20, 10, 25).lag == 5
    assert PartitionLag(0, 3, 10, 25).lag == 15  # committed offset deleted by retention


# -- messages -------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "empty"),
        (b"{not json", "not valid JSON"),
        (b"\xff\x00\x81", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"method": "turnstile"}', "task_id"),
        (b'{"task_id": "", "method": "turnstile"}', "task_id"),
        (b'{"task_id": 7}', "task_id"),
        (json.dumps({"task_id": "x" * 201}).encode(), "longer than"),
    ],
)
def test_unanswerable_messages_are_bad_messages(value: bytes | None, reason: str) -> None:
    with pytest.raises(BadMessage) as info:
        parse_task(value)
    assert reason in info.value.message
    assert info.value.code == "ERROR_BAD_MESSAGE"


@pytest.mark.unit
def test_a_task_round_trips_and_keeps_its_extras() -> None:
    fields = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "action": "login"}
    task = parse_task(task_value("t-1", fields))
    assert (task.task_id, task.fields, task.method) == ("t-1", fields, "turnstile")


@pytest.mark.unit
def test_a_dead_letter_keeps_the_original_bytes_and_says_why() -> None:
    raw = b"\x00 not json"
    letter = dead_letter("not valid JSON", "ERROR_BAD_MESSAGE", Source("tasks", 2, 41), raw)
    assert base64.b64decode(letter["original"]) == raw
    assert letter["source"] == {"topic": "tasks", "partition": 2, "offset": 41}
    assert letter["task_id"] is None and letter["task"] is None
    assert dead_letter_headers(letter) == [
        ("reason", b"not valid JSON"),
        ("error", b"ERROR_BAD_MESSAGE"),
    ]


SOLVED = {
    "status": "solved",
    "captcha_id": "7000001",
    "provider": "captchaai",
    "method": "userrecaptcha",
    "site": "example.com#6Le",
    "source": "api",
    "elapsed_s": 3.0,
    "solved_at": "2026-12-06T01:00:00.000Z",
    "expires_at": "2026-12-06T01:02:00.000Z",
    "token": "03A-secret",
}
FEEDBACK = [
    {"task_id": "t-1", "good": False},
    {"task_id": "t-1", "good": True, "score": 0.9},
    {"captcha_id": "7000001", "good": True, "score": 0},
    {"captcha_id": "7000001", "provider": "captchaai", "method": "turnstile", "site": "a#k",
     "good": False},
    {"task_id": "t-1", "captcha_id": "7000001", "provider": "captchaai", "good": True},
    # refused
    {"good": False},
    {"task_id": "t-1"},
    {"task_id": "t-1", "good": "false"},
    {"task_id": "t-1", "good": 0},
    {"task_id": "", "good": True},
    {"task_id": "x" * 201, "good": True},
    {"task_id": "t-1", "good": True, "score": 1.5},
    {"task_id": "t-1", "good": True, "score": True},
    {"task_id": "t-1", "good": True, "score": "0.3"},
    {"captcha_id": " ", "good": True},
    {"captcha_id": 7000001, "good": True},
    {"task_id": "t-1", "provider": "captchaai", "good": True},
    {"captcha_id": "7000001", "site": "", "good": True},
    {"task_id": "t-1", "good": True, "token": "03A"},
]  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize("message", FEEDBACK, ids=lambda m: json.dumps(m)[:60])
def test_feedback_schema_agrees_with_the_bridge(message: dict[str, Any]) -> None:
    try:
        parse_feedback(json.dumps(message).encode())
        accepted = True
    except BadMessage:
        accepted = False
    assert (not problems("kafka-feedback", message)) == accepted, problems(
        "kafka-feedback", message
    )


@pytest.mark.unit
def test_feedback_names_its_result_by_task_id_or_by_its_fields() -> None:
    by_id = parse_feedback(b'{"task_id": "t-1", "good": false}')
    assert by_id == Feedback(False, "t-1")
    stored = json.dumps({**SOLVED, "task_id": "t-1"})
    assert result_of(by_id, stored) == {
        "captcha_id": "7000001",
        "provider": "captchaai",
        "method": "userrecaptcha",
        "site": "example.com#6Le",
    }
    with pytest.raises(BadMessage) as gone:
        result_of(by_id, None)
    assert gone.value.code == "ERROR_NO_SUCH_CAPCHA_ID"
    failed = json.dumps({"status": "failed", "error": "ERROR_SOLVE_TIMEOUT", "message": "x"})
    with pytest.raises(BadMessage, match="failed") as no_token:
        result_of(by_id, failed)
    assert no_token.value.code == "ERROR_NO_SUCH_CAPCHA_ID"
    # the message's own fields win: they need no stored result
    named = Feedback(True, "t-1", {"captcha_id": "9", "provider": "backup"}, 0.3)
    assert result_of(named, stored) == {"captcha_id": "9", "provider": "backup"}
    assert parse_feedback(feedback_value(named)) == named


@pytest.mark.unit
def test_send_feedback_builds_the_message_report_would_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer = TaskProducer(Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}))
    produced: list[tuple[Any, ...]] = []
    monkeypatch.setattr(producer, "_produce", lambda *args: produced.append(args))
    producer.feedback({**SOLVED, "task_id": "t-1"}, good=False, score=0.2)
    producer.feedback("t-2", good=True)
    producer.feedback(SOLVED, good=True)  # a solve() outcome: no task id
    for bad in (
        lambda: producer.feedback("t-3", good=True, score=2),
        lambda: producer.feedback({"status": "failed", "error": "E", "message": "m"}, good=False),
        lambda: producer.feedback("", good=True),
        lambda: producer.feedback("t-4", good="yes"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValidationError):
            bad()
    keys = [key for key, _value, _topic in produced]
    assert keys == ["t-1", "t-2", "7000001"]
    assert {topic for _key, _value, topic in produced} == {"captcha-feedback"}
    values = [json.loads(value) for _key, value, _topic in produced]
    assert values[0] == {
        "task_id": "t-1",
        "captcha_id": "7000001",
        "provider": "captchaai",
        "method": "userrecaptcha",
        "site": "example.com#6Le",
        "good": False,
        "score": 0.2,
    }
    assert values[1] == {"task_id": "t-2", "good": True}
    assert "token" not in values[2] and "task_id" not in values[2]
    for value in values:
        validate("kafka-feedback", value)


@pytest.mark.unit
def test_enqueue_validates_before_anything_is_produced(monkeypatch: pytest.MonkeyPatch) -> None:
    producer = TaskProducer(Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}))
    produced: list[tuple[str, bytes]] = []
    monkeypatch.setattr(producer, "_produce", lambda *args: produced.append(args))
    with pytest.raises(ValidationError, match="pageurl"):
        producer.enqueue("t-1", "turnstile", "k", "ftp://example.com")
    with pytest.raises(ValidationError, match="unknown method"):
        producer.enqueue("t-2", "hcaptcha", "k", PAGE)
    with pytest.raises(BadMessage):
        producer.enqueue("", "turnstile", "k", PAGE)
    assert produced == []
    image = png()
    producer.enqueue("t-4", "base64", body=image)
    assert [task_id for task_id, _ in produced] == ["t-4"]
    assert parse_task(produced[0][1]).fields == {
        "method": "base64",
        "body": base64.b64encode(image).decode(),
    }


@pytest.mark.unit
def test_enqueue_carries_a_declared_tenant_and_a_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env(
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "CAPTCHAAI_TENANTS": '{"shop": {}}'}
    )
    producer = TaskProducer(settings)
    produced: list[tuple[str, bytes]] = []
    monkeypatch.setattr(producer, "_produce", lambda *args: produced.append(args))
    with pytest.raises(ValidationError, match="unknown tenant 'shp'"):
        producer.enqueue("t-1", "turnstile", "k", PAGE, tenant="shp")
    with pytest.raises(ValidationError, match="unknown lane 'now'"):
        producer.enqueue("t-2", "turnstile", "k", PAGE, lane="now")
    assert produced == []
    producer.enqueue("t-3", "turnstile", "k", PAGE, tenant="shop", lane="interactive")
    fields = parse_task(produced[0][1]).fields
    assert (fields["tenant"], fields["lane"]) == ("shop", "interactive")
    validate("kafka-task", {"task_id": "t-3", **fields})


# -- offsets --------------------------------------------------------------------------------


@pytest.mark.unit
def test_commit_points_stop_at_the_oldest_unanswered_message() -> None:
    tracker = OffsetTracker()
    first, second, third = (tracker.track(0, offset) for offset in (10, 11, 12))
    other = tracker.track(1, 5)
    assert tracker.commit_points() == {0: 10, 1: 5}
    tracker.mark_committed({0: 10, 1: 5})
    tracker.finish(third)
    tracker.finish(second)
    assert tracker.commit_points() == {}  # 10 is still being solved
    assert tracker.pending_count() == 2
    tracker.finish(first)
    assert tracker.commit_points() == {0: 13}
    tracker.finish(other)
    assert tracker.commit_points() == {0: 13, 1: 6}
    assert tracker.pending_count() == 0


@pytest.mark.unit
def test_a_revoked_partition_ignores_answers_from_before_the_revoke() -> None:
    tracker = OffsetTracker()
    old = tracker.track(0, 7)
    tracker.forget([0])
    again = tracker.track(0, 7)  # reassigned later and redelivered
    assert not tracker.finish(old)
    assert tracker.commit_points() == {0: 7}
    assert tracker.finish(again)
    assert tracker.commit_points() == {0: 8}


@pytest.mark.unit
def test_offsets_going_backwards_are_refused() -> None:
    tracker = OffsetTracker()
    tracker.track(3, 100)
    with pytest.raises(ValueError, match="backwards"):
        tracker.track(3, 99)


# -- claims ---------------------------------------------------------------------------------


def make_claims() -> ClaimStore:
    """Claims trusted for seconds, not tenths: nothing may expire while a test runs its
    lines (the ones that wait move the scripts' clock: ``move_clock``)."""
    return ClaimStore(
        app.runtime().state.db,
        "unit-group",
        result_ttl=60,
        solve_grace_s=10,
        dispatch_grace_s=5,
    )


@pytest.mark.redis
def test_one_claim_per_task_until_its_owner_is_presumed_dead(
    clean_state: None, move_clock: Callable[[float], None]
) -> None:
    claims = make_claims()
    mine = claims.claim("t-1", "c1")
    assert (mine.state, mine.celery_id, mine.ours) == ("new", "c1", True)
    seen = claims.claim("t-1", "c2")
    assert (seen.state, seen.celery_id, seen.ours) == ("claimed", "c1", False)
    assert 0 < seen.trust_s <= 5  # the dispatch grace
    assert claims.dispatched("t-1", "c1")
    solving = claims.claim("t-1", "c2", give_up_on="c1")  # too early to give up
    assert (solving.state, solving.celery_id) == ("solving", "c1")
    assert 5 < solving.trust_s <= 10  # the solve grace, from the dispatch
    move_clock(10.1)
    # Only a caller that looked for c1's result may take over, and only after the grace.
    gone = claims.claim("t-1", "c9")
    assert (gone.state, gone.trust_s) == ("solving", 0)
    taken = claims.claim("t-1", "c2", give_up_on="c1")
    assert (taken.state, taken.celery_id) == ("takeover", "c2")
    assert not claims.dispatched("t-1", "c1")  # the old owner no longer holds it


@pytest.mark.redis
def test_a_done_claim_returns_the_first_answer_stored(clean_state: None, redis_conn: Any) -> None:
    claims = make_claims()
    claims.claim("t-2", "c1")
    first = claims.complete("t-2", '{"status": "solved"}', '{"reason": "x"}')
    assert (first.stored, first.result) == (True, '{"status": "solved"}')
    second = claims.complete("t-2", '{"status": "failed"}')
    assert (second.stored, second.result, second.dead_letter) == (
        False,
        '{"status": "solved"}',
        '{"reason": "x"}',
    )
    done = claims.claim("t-2", "c3")
    assert (done.state, done.result, done.dead_letter) == (
        "done",
        '{"status": "solved"}',
        '{"reason": "x"}',
    )
    ttl_ms = redis_conn.pttl(app.runtime().state.keys.kafka_claim("unit-group", "t-2"))
    assert 50_000 < ttl_ms <= 60_000  # KAFKA_RESULT_TTL


@pytest.mark.redis
def test_a_failed_dispatch_releases_its_claim(clean_state: None) -> None:
    claims = make_claims()
    claims.claim("t-3", "c1")
    assert claims.release("t-3", "c1")
    assert claims.claim("t-3", "c2").state == "new"
    claims.dispatched("t-3", "c2")
    assert not claims.release("t-3", "c2")  # a dispatched solve keeps its claim
    claims.count("waited", 2)
    assert claims.stats() == {"waited": 2}


@pytest.mark.redis
def test_feedback_finds_the_published_result_and_is_recorded_once(
    clean_state: None, redis_conn: Any
) -> None:
    claims = make_claims()
    claims.claim("t-5", "c1")
    assert claims.published("t-5") is None  # claimed, not answered yet
    claims.complete("t-5", '{"status": "solved"}')
    assert claims.published("t-5") == '{"status": "solved"}'
    assert claims.published("t-unknown") is None
    assert not claims.feedback_recorded("captchaai", "7000001")
    claims.record_feedback("captchaai", "7000001")
    assert claims.feedback_recorded("captchaai", "7000001")
    assert not claims.feedback_recorded("backup", "7000001")  # another provider's captcha
    key = app.runtime().state.keys.kafka_feedback("unit-group", "captchaai", "7000001")
    assert 50_000 < redis_conn.pttl(key) <= 60_000  # KAFKA_RESULT_TTL


def queued_reports(redis_conn: Any, queue: str) -> list[list[Any]]:
    """The arguments of the report tasks waiting in ``queue`` (kombu's Redis messages)."""
    found = []
    for raw in reversed(redis_conn.lrange(queue, 0, -1)):  # LPUSHed: the oldest last
        message = json.loads(raw)
        if message["headers"]["task"] == "captcha_tasks.report":
            args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            found.append(args)
    return found


@pytest.mark.redis
def test_the_feedback_reader_reports_once_and_dead_letters_what_it_cannot_record(
    clean_state: None, redis_conn: Any
) -> None:
    claims = make_claims()
    claims.claim("t-1", "c1")
    claims.complete("t-1", json.dumps({**SOLVED, "task_id": "t-1"}))
    letters: list[tuple[Source, dict[str, Any]]] = []
    primary = app.runtime().settings.providers.named(None).name
    reader = FeedbackReader(
        "fb", claims, lambda source, _value, _p, letter: letters.append((source, letter)), primary
    )
    queue = app.runtime().settings.celery.queue("housekeeping")
    redis_conn.delete(queue)
    messages = [
        {"task_id": "t-1", "good": False, "score": 0.1},
        {"task_id": "t-1", "good": False},  # the same captcha again: skipped
        {"captcha_id": "42", "method": "turnstile", "site": "a.example", "good": True},
        {"task_id": "t-2", "good": True},  # no result kept
        {"captcha_id": "43", "provider": "nobody", "good": True},  # not configured
    ]
    try:
        for offset, message in enumerate(messages):
            reader.handle(0, offset, b"k", json.dumps(message).encode())
        reader.handle(0, len(messages), b"k", b"{not json")
        reports = queued_reports(redis_conn, queue)
    finally:
        redis_conn.delete(queue)
    # captcha_id, good, provider, method, site, score: as report(result) sends them
    assert reports == [
        ["7000001", False, "captchaai", "userrecaptcha", "example.com#6Le", 0.1],
        ["42", True, None, "turnstile", "a.example", None],
    ]
    assert [(s.offset, letter["error"]) for s, letter in letters] == [
        (3, "ERROR_NO_SUCH_CAPCHA_ID"),
        (4, "ERROR_VALIDATION"),
        (5, "ERROR_BAD_MESSAGE"),
    ]
    assert [letter["task_id"] for _, letter in letters] == ["t-2", None, None]
    for source, letter in letters:
        validate("kafka-dead-letter", letter)
        assert letter["source"]["topic"] == source.topic == "fb"
    # the recorded and the skipped are finished; the dead letters wait for their acks
    assert reader.tracker.commit_points() == {0: 3}
    assert claims.feedback_recorded(primary, "42")
    stats = claims.stats()
    assert (stats["feedback_repeated"], stats["feedback_bad"], stats["feedback_good"]) == (1, 1, 1)


# -- the optional extra ---------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("command", [["kafka", "lag"], ["kafka-bridge"]])
def test_without_confluent_kafka_the_cli_says_how_to_install_it(command: list[str]) -> None:
    code = (
        "import sys\n"
        "sys.modules['confluent_kafka'] = None  # as if the extra were not installed\n"
        "import captcha_tasks.cli\n"
        f"sys.argv = ['captcha-tasks', *{command!r}]\n"
        "captcha_tasks.cli.main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    assert INSTALL_HINT in out.stderr
    assert "Traceback" not in out.stderr
