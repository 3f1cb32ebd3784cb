"""The Kafka bridge end to end: a real Kafka broker, real Redis, real Celery workers, bridge
processes and the sandbox API."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from contract import validate
from image_files import png
from kafka_broker import (  # noqa: F401  (the fixtures are used by name)
    KafkaSetup,
    Record,
    kafka_broker_fixture,
    kafka_fixture,
    start_bridge_fixture,
    wait_for_members,
)

from captcha_tasks.kafka.claims import ClaimStore
from captcha_tasks.kafka.client import (
    FEEDBACK_PARTITIONS,
    Consumer,
    Producer,
    TaskProducer,
    TopicPartition,
    consumer_config,
    consumer_lag,
    producer_config,
    total_lag,
)
from captcha_tasks.kafka.messages import task_value
from captcha_tasks.testing.processes import wait_until
from captcha_tasks.worker.app import app

pytestmark = pytest.mark.system

PAGE = "https://example.com/kafka"
MODULE_ENV = {"CAPTCHAAI_TENANTS": json.dumps({"scrapers": {"weight": 1}})}


def enqueue_all(setup: KafkaSetup, count: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    with TaskProducer(setup.settings) as producer:
        for task_id in ids:
            producer.enqueue(task_id, "turnstile", "0x4AAAAAAAkafka", PAGE)
    return ids


def unique_keys(records: list[Record]) -> set[str | None]:
    return {r.key for r in records}


def claims_stats(setup: KafkaSetup) -> dict[str, int]:
    claims = ClaimStore.for_settings(app.runtime().state.db, setup.settings)
    return claims.stats()


def celery_backlog() -> int:
    """Captchas waiting in Redis to be submitted: queued solve and submit messages plus
    parked submits (one each per captcha).  Poll messages are left out: a captcha can
    briefly have two (its countdown poll and one a bulk poll woke).

    One snapshot (MULTI): read one after another, a captcha whose solve message was read
    in its queue could be read again as the submit it became (a run saw 93 of a bound
    of 90)."""
    runtime = app.runtime()
    settings = runtime.settings
    names = (
        *settings.celery.solve_queues,
        settings.celery.queue("submit"),
    )  # the bridge's are bulk
    snapshot = runtime.state.redis.pipeline(transaction=True)
    for name in names:
        snapshot.llen(name)
    snapshot.zcard(runtime.state.limiter.keys.parked())
    return sum(int(n) for n in snapshot.execute())


def lag_cli(setup: KafkaSetup, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "captcha_tasks.cli", "kafka", "lag", *args]
    env = {**os.environ, **setup.env}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def lag_table(output: str) -> dict[str, tuple[str, int, int]]:
    """partition (or 'total') -> (committed, end, lag) from ``kafka lag``'s table."""
    rows: dict[str, tuple[str, int, int]] = {}
    for line in output.splitlines()[1:]:
        cells = line.split()
        if cells[0] == "total":
            rows["total"] = ("", 0, int(cells[1]))
        else:
            rows[cells[0]] = (cells[1], int(cells[2]), int(cells[3]))
    return rows


@pytest.mark.timeout(180)
def test_500_tasks_over_three_bridges_use_the_whole_plan(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    threads = app.runtime().settings.providers.threads
    setup = kafka(partitions=6)
    sandbox.configure(threads=threads, solve_time=0.2, jitter=0.05)
    for n in range(3):
        start_bridge(setup, f"bridge-{n}")
    members = wait_for_members(setup, 3)
    ids = enqueue_all(setup, 500)
    # No worker yet: each bridge dispatches up to its bound and pauses its partitions.
    bound = 3 * setup.settings.kafka.in_flight_limit(setup.settings.providers.threads)
    wait_until(lambda: celery_backlog() == bound, 30, 0.05, "every bridge at its bound")
    start_worker(concurrency=16, name="kafka-w1")

    results = setup.reader(setup.settings.kafka.results_topic)
    limiter = app.runtime().state.limiter
    backlog_seen = slots_seen = 0

    def done() -> bool:
        nonlocal backlog_seen, slots_seen
        results.poll()
        backlog_seen = max(backlog_seen, celery_backlog())
        slots_seen = max(slots_seen, limiter.in_use())
        return len(unique_keys(results.records)) >= len(ids)

    wait_until(done, 150, 0.05, "500 results")
    by_id = {r.key: r.value for r in results.records}
    assert set(by_id) == set(ids)
    assert all(v["status"] == "solved" and v["task_id"] == k for k, v in by_id.items())
    assert len(results.records) == len(ids), "no duplicates without a crash"
    stats = sandbox.stats()
    print(f"\nmembers {members}; {stats['submits']} submits")
    print(f"peak: {slots_seen} threads held, {stats['peak_in_flight']} captchas at the API")
    print(f"largest backlog in Redis {backlog_seen} (bound {bound})")
    assert stats["submits"] == len(ids)
    assert stats["thread_rejections"] == 0
    # Six partitions, yet the plan's fifteen threads were all held at once: the partitions
    # are not the cap.  (The API's own count stays lower at 0.2 s solves: a thread is held
    # from submit to the poll that sees the answer, longer than the solve itself.  The
    # limiter's count can briefly read above the plan: a poll renews a lease that a bulk
    # poll has just released; the API never sees more than the plan.)
    assert slots_seen >= threads
    assert 6 < stats["peak_in_flight"] <= threads
    # Back-pressure: the backlog waited in Kafka; Redis held at most the bridges' bound.
    assert backlog_seen <= bound
    tokens = [v["token"] for v in list(by_id.values())[:50]]
    assert all(sandbox.verify(t)["success"] for t in tokens)
    wait_until(lambda: sum(p.lag for p in consumer_lag(setup.settings)) == 0, 10, 0.2, "lag 0")


@pytest.mark.timeout(180)
def test_killed_bridge_loses_nothing_and_pays_once(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    setup = kafka(partitions=6)
    sandbox.configure(threads=app.runtime().settings.providers.threads, solve_time=0.2, jitter=0.05)
    start_worker(concurrency=16, name="kafka-w2")
    bridges = [start_bridge(setup, f"doomed-{n}") for n in range(3)]
    wait_for_members(setup, 3)
    ids = enqueue_all(setup, 300)
    results = setup.reader(setup.settings.kafka.results_topic)
    results.read_until(lambda r: len(r) >= 100, 60, "a third of the results")

    bridges[0].kill()  # SIGKILL: no revoke, no commit, tasks in flight
    wait_for_members(setup, 2, timeout=60)
    results.read_until(lambda r: unique_keys(r) >= set(ids), 120, "every result")

    counts = Counter(r.key for r in results.records)
    duplicates = {key: n for key, n in counts.items() if n > 1}
    stats, claims = sandbox.stats(), claims_stats(setup)
    print(f"\n{len(results.records)} results for {len(ids)} tasks; duplicates: {len(duplicates)}")
    for key, n in sorted(duplicates.items()):
        print(f"  duplicate {key} x{n}")
    print(f"claims {claims}; sandbox submits {stats['submits']}")
    assert set(counts) == set(ids), "none lost"
    assert all(r.value["status"] == "solved" for r in results.records)
    # Copies of one task carry the same answer: republished, not solved again.
    by_id: dict[str | None, str] = {}
    for r in results.records:
        assert by_id.setdefault(r.key, r.value["token"]) == r.value["token"]
    # The killed bridge's solves were waited for, not paid for again; a solve taken over
    # under the same id is not paid for again either (its copies are recognised).
    assert claims.get("waited", 0) + claims.get("republished", 0) > 0
    assert stats["submits"] == len(ids)
    wait_until(lambda: sum(p.lag for p in consumer_lag(setup.settings)) == 0, 15, 0.2, "lag 0")


def test_poison_messages_go_to_dead_letters_without_stalling(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    setup = kafka(partitions=2)
    s = setup.settings
    no_id = [b"not json {", b"[1, 2]", json.dumps({"method": "turnstile"}).encode(), b"\xff\xfe"]
    invalid = {
        "t-unknown-method": {"method": "hcaptcha", "sitekey": "k", "pageurl": PAGE},
        "t-bad-pageurl": {"method": "turnstile", "sitekey": "k", "pageurl": "ftp://x"},
    }
    fatal = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxy": "u:p@bad-proxy:8080"}
    good = [f"t-good-{n}" for n in range(5)]
    producer = Producer(producer_config(s))
    # Everything on partition 0, poison first: the good tasks must not be held up.
    for raw in no_id:
        producer.produce(s.kafka.tasks_topic, value=raw, key=b"junk", partition=0)
    for task_id, fields in invalid.items():
        producer.produce(s.kafka.tasks_topic, value=task_value(task_id, fields), partition=0)
    producer.produce(s.kafka.tasks_topic, value=task_value("t-fatal", fatal), partition=0)
    for task_id in good:
        fields = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE}
        producer.produce(s.kafka.tasks_topic, value=task_value(task_id, fields), partition=0)
    assert producer.flush(10) == 0
    start_worker(concurrency=16, name="kafka-w3")
    start_bridge(setup, "bridge-poison")

    results = setup.reader(s.kafka.results_topic).read_until(
        lambda r: len(r) >= 8, 60, "eight results"
    )
    letters = setup.reader(s.kafka.dead_letter_topic).read_until(
        lambda r: len(r) >= 7, 30, "seven dead letters"
    )
    by_id = {r.key: r.value for r in results}
    assert set(by_id) == {*invalid, "t-fatal", *good}
    assert all(by_id[t]["status"] == "solved" for t in good)
    for task_id in invalid:
        assert (by_id[task_id]["status"], by_id[task_id]["error"]) == ("failed", "ERROR_VALIDATION")
    assert by_id["t-fatal"]["error"] == "ERROR_PROXY_CONNECTION_FAILED"

    unanswerable = [r for r in letters if r.value["task_id"] is None]
    assert sorted(base64.b64decode(r.value["original"]) for r in unanswerable) == sorted(no_id)
    assert all(r.value["error"] == "ERROR_BAD_MESSAGE" and r.value["reason"] for r in unanswerable)
    assert all(r.headers["error"] == "ERROR_BAD_MESSAGE" for r in unanswerable)
    answered = {r.value["task_id"]: r.value for r in letters if r.value["task_id"]}
    assert set(answered) == {*invalid, "t-fatal"}
    assert "unknown method" in answered["t-unknown-method"]["reason"]
    fatal_letter = answered["t-fatal"]
    assert fatal_letter["task"] == {"task_id": "t-fatal", **fatal}
    assert fatal_letter["outcome"] == {k: v for k, v in by_id["t-fatal"].items() if k != "task_id"}
    assert json.loads(base64.b64decode(fatal_letter["original"]))["proxy"] == fatal["proxy"]
    # Nothing invalid reached the API; the partition's offsets moved past the poison.
    assert sandbox.stats()["submits"] == len(good) + 1
    wait_until(lambda: sum(p.lag for p in consumer_lag(s)) == 0, 10, 0.2, "lag 0")


def test_lag_reports_before_and_after_consumption(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    setup = kafka(partitions=2)
    s = setup.settings
    producer = Producer(producer_config(s))
    fields = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE}
    for n in range(7):
        value = task_value(f"lag-{n}", fields)
        producer.produce(s.kafka.tasks_topic, value=value, partition=0 if n < 4 else 1)
    assert producer.flush(10) == 0

    before = lag_cli(setup, "--max-lag", "5")
    assert before.returncode == 1, before.stderr
    assert "above --max-lag 5" in before.stderr
    assert lag_table(before.stdout) == {
        "0": ("-", 4, 4),
        "1": ("-", 3, 3),
        "total": ("", 0, 7),
    }
    assert lag_cli(setup, "--max-lag", "7").returncode == 0

    start_worker(concurrency=16, name="kafka-w4")
    start_bridge(setup, "bridge-lag")
    reader = setup.reader(s.kafka.results_topic)
    reader.read_until(lambda r: len(r) >= 7, 60, "seven results")
    wait_until(lambda: sum(p.lag for p in consumer_lag(s)) == 0, 10, 0.2, "commits")

    after = lag_cli(setup, "--max-lag", "0")
    assert after.returncode == 0, after.stderr
    assert lag_table(after.stdout) == {"0": ("4", 4, 0), "1": ("3", 3, 0), "total": ("", 0, 0)}


def test_answered_tasks_redelivered_are_republished_not_solved_again(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    setup = kafka(partitions=2)
    start_worker(concurrency=16, name="kafka-w5")
    ids = enqueue_all(setup, 6)
    first = start_bridge(setup, "bridge-first")
    results = setup.reader(setup.settings.kafka.results_topic)
    results.read_until(lambda r: len(r) >= len(ids), 60, "the first answers")
    wait_until(lambda: sum(p.lag for p in consumer_lag(setup.settings)) == 0, 10, 0.2, "commits")
    first.stop()
    rewind(setup)  # as after a crash before the commits: every task comes again

    start_bridge(setup, "bridge-again")
    results.read_until(lambda r: len(r) >= 2 * len(ids), 60, "the answers again")
    tokens: dict[str | None, set[str]] = {}
    for record in results.records:
        tokens.setdefault(record.key, set()).add(record.value["token"])
    assert set(tokens) == set(ids)
    assert all(len(t) == 1 for t in tokens.values()), "the stored answer, not a new one"
    assert Counter(r.key for r in results.records) == dict.fromkeys(ids, 2)
    assert sandbox.stats()["submits"] == len(ids)
    assert claims_stats(setup)["republished"] == len(ids)


def test_captchaai_methods_answer_with_their_shape_and_user_agent(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    setup = kafka(partitions=1)
    start_worker(concurrency=8, name="kafka-w6")
    tasks: dict[str, dict[str, Any]] = {
        "t-cf": {"method": "cloudflare_challenge", "pageurl": PAGE, "proxy": "u:p@10.0.0.1:8080"},
        "t-grid": {"method": "grid", "body": png(), "instructions": "bus", "grid_size": "4x4"},
        "t-bls": {"method": "bls", "images": [png() for _ in range(9)], "instructions": "cars"},
        "t-fc": {"method": "friendly_captcha", "sitekey": "FCMG", "pageurl": PAGE},
    }
    with TaskProducer(setup.settings) as producer:
        for task_id, fields in tasks.items():
            producer.enqueue(task_id, **fields)
    start_bridge(setup, "bridge-captchaai")
    results = setup.reader(setup.settings.kafka.results_topic)
    results.read_until(lambda r: len(r) >= len(tasks), 60, "the answers")
    by_id = {r.key: r.value for r in results.records}
    assert set(by_id) == set(tasks)
    assert all(v["status"] == "solved" and v["task_id"] == k for k, v in by_id.items()), by_id
    assert by_id["t-cf"]["user_agent"].startswith("Mozilla/5.0")
    assert sandbox.verify(by_id["t-cf"]["token"])["success"] is True
    assert isinstance(by_id["t-grid"]["token"], list) and by_id["t-grid"]["token"]
    assert isinstance(by_id["t-bls"]["token"], list) and by_id["t-bls"]["token"]
    assert "user_agent" not in by_id["t-fc"]
    assert sandbox.verify(by_id["t-fc"]["token"])["success"] is True


def test_a_tasks_tenant_and_lane_are_served_and_an_unknown_tenant_is_a_failed_task(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    setup = kafka(partitions=1)
    start_worker(concurrency=8, name="kafka-w7")
    with TaskProducer(setup.settings) as producer:
        producer.enqueue("t-bulk", "turnstile", "k", PAGE, tenant="scrapers")
        producer.enqueue("t-now", "turnstile", "k", PAGE, tenant="scrapers", lane="interactive")
    producer = Producer(producer_config(setup.settings))  # a producer that checks nothing
    fields = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "tenant": "nobody"}
    producer.produce(setup.settings.kafka.tasks_topic, task_value("t-nobody", fields), b"t-nobody")
    producer.flush(10)
    start_bridge(setup, "bridge-tenants")
    results = setup.reader(setup.settings.kafka.results_topic)
    results.read_until(lambda r: len(r) >= 3, 60, "the answers")
    by_id = {r.key: r.value for r in results.records}
    assert by_id["t-bulk"]["status"] == by_id["t-now"]["status"] == "solved"
    assert by_id["t-nobody"]["error"] == "ERROR_VALIDATION"
    assert "unknown tenant 'nobody'" in by_id["t-nobody"]["message"]
    assert sandbox.stats()["submits"] == 2
    counted = app.runtime().state.stats.lane_outcomes()
    assert (
        counted[("solved", "bulk", "scrapers")]
        == counted[("solved", "interactive", "scrapers")]
        == 1
    )


@pytest.mark.timeout(120)
def test_feedback_reaches_the_provider_that_solved_and_counts_once(
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
) -> None:
    setup = kafka(partitions=2)
    s = setup.settings
    start_worker(concurrency=8, name="kafka-w8")
    bridge = start_bridge(setup, "bridge-feedback")
    ids = enqueue_all(setup, 5)
    results = setup.reader(s.kafka.results_topic).read_until(
        lambda r: len(r) >= len(ids), 60, "the answers"
    )
    by_id = {r.key: r.value for r in results}
    site = "example.com#0x4AAAAAAAkafka"
    assert {v["site"] for v in by_id.values()} == {site}
    with TaskProducer(s) as producer:
        for task_id in ids[:3]:
            producer.feedback(task_id, good=False)  # by task id: the bridge kept the result
        producer.feedback(by_id[ids[3]], good=True)  # by the result's own fields
        producer.feedback(by_id[ids[4]], good=True, score=0.9)
    refused = {
        "ERROR_BAD_MESSAGE": b"not json {",
        "ERROR_NO_SUCH_CAPCHA_ID": json.dumps({"task_id": "t-never", "good": False}).encode(),
        "ERROR_VALIDATION": json.dumps(
            {"captcha_id": "1", "provider": "nobody", "method": "turnstile", "good": False}
        ).encode(),
    }
    raw = Producer(producer_config(s))
    for value in refused.values():
        raw.produce(s.kafka.feedback_topic, value=value, key=b"junk")
    assert raw.flush(10) == 0

    letters = setup.reader(s.kafka.dead_letter_topic)
    letters.read_until(lambda r: len(r) >= len(refused), 30, "the refused feedback")
    for letter in letters.records:
        validate("kafka-dead-letter", letter.value)
        assert letter.value["source"]["topic"] == s.kafka.feedback_topic
        assert base64.b64decode(letter.value["original"]) == refused[letter.headers["error"]]
    by_code = {r.headers["error"]: r.value for r in letters.records}
    assert by_code["ERROR_NO_SUCH_CAPCHA_ID"]["task_id"] == "t-never"
    assert "'nobody', which is not configured" in by_code["ERROR_VALIDATION"]["reason"]

    def reported() -> bool:
        stats = sandbox.stats()
        return (stats["reports_bad"], stats["reports_good"]) == (3, 2)

    wait_until(reported, 30, 0.05, "three bad and two good reports at the sandbox")
    counted = app.runtime().state.acceptance.read("turnstile", site).acceptance["captchaai"]
    assert (round(counted.bad, 2), round(counted.good, 2), round(counted.scores, 2)) == (3, 2, 1)
    feedback_lag = lambda: total_lag(consumer_lag(s, topic=s.kafka.feedback_topic))  # noqa: E731
    wait_until(lambda: feedback_lag() == 0, 10, 0.2, "the feedback offsets committed")

    # Delivered again (as after a crash before the commits): no captcha is reported twice.
    bridge.stop()
    rewind(setup, s.kafka.feedback_topic)
    start_bridge(setup, "bridge-feedback-again")
    letters.read_until(lambda r: len(r) >= 2 * len(refused), 30, "the refused ones again")
    wait_until(lambda: feedback_lag() == 0, 30, 0.2, "the copies read")
    assert claims_stats(setup)["feedback_repeated"] == len(ids)
    assert reported()


def rewind(setup: KafkaSetup, topic: str | None = None) -> None:
    """Commit offset 0 for every partition of the (idle) bridge group on ``topic`` (default:
    the tasks topic)."""
    consumer = Consumer(consumer_config(setup.settings))
    topic = topic or setup.settings.kafka.tasks_topic
    feedback = topic == setup.settings.kafka.feedback_topic
    count = FEEDBACK_PARTITIONS if feedback else setup.partitions
    offsets = [TopicPartition(topic, p, 0) for p in range(count)]
    try:
        assert all(tp.error is None for tp in consumer.commit(offsets=offsets, asynchronous=False))
    finally:
        consumer.close()
