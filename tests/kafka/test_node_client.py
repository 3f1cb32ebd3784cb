"""The Node.js client example against the real Kafka broker, bridge, Celery worker and
sandbox; every message on the three topics of the run is checked against
``captcha_tasks/schemas/``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from contract import problems, validate
from kafka_broker import (  # noqa: F401  (the fixtures are used by name)
    KafkaSetup,
    kafka_broker_fixture,
    kafka_fixture,
    start_bridge_fixture,
)
from node_client import EXAMPLE, missing_node, node_modules
from system_parts import missing

from captcha_tasks.kafka.client import (
    Consumer,
    Producer,
    TopicPartition,
    consumer_config,
    producer_config,
)
from captcha_tasks.testing.processes import wait_until

pytestmark = pytest.mark.system

PAGE = "https://example.com/node"


@pytest.fixture(scope="session")
def node_path(output_dir: Path) -> str:
    problem = missing_node()
    if problem:
        missing("Node.js", problem)
    return str(node_modules(output_dir / "npm.log"))


@pytest.mark.timeout(240)
def test_node_client_solves_a_batch_through_kafka(
    node_path: str,
    kafka: Callable[..., KafkaSetup],
    start_bridge: Any,
    start_worker: Any,
    sandbox: Any,
    clean_state: None,
    tmp_path: Path,
) -> None:
    setup = kafka(partitions=3)
    s = setup.settings
    start_worker(concurrency=16, name="node-w1")
    start_bridge(setup, "bridge-node")
    # a message with no answer address, from another producer: a dead letter of its own
    poison = Producer(producer_config(s))
    poison.produce(s.kafka.tasks_topic, value=b"not json {", key=b"junk")
    assert poison.flush(10) == 0

    good = [{"method": "turnstile", "sitekey": f"0x4AAA{i}", "pageurl": PAGE} for i in range(8)]
    unknown = {"method": "hcaptcha", "sitekey": "k", "pageurl": PAGE}
    fatal = {"method": "turnstile", "sitekey": "k", "pageurl": PAGE, "proxy": "u:p@bad-proxy:1"}
    tasks = [*good[:3], unknown, *good[3:6], fatal, *good[6:]]
    source = tmp_path / "tasks.json"
    source.write_text(json.dumps(tasks))
    env = {**os.environ, **setup.env, "NODE_PATH": node_path, "WINDOW": "4"}
    node = shutil.which("node") or "node"
    run = subprocess.run(
        [node, str(EXAMPLE / "solve-batch.js"), str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    out = [json.loads(line) for line in run.stdout.splitlines()]
    by_index = {o["index"]: o for o in out}
    assert sorted(by_index) == list(range(len(tasks)))
    assert by_index[3]["error"] == "ERROR_VALIDATION"
    assert by_index[7]["error"] == "ERROR_PROXY_CONNECTION_FAILED"
    solved = [o for i, o in by_index.items() if i not in (3, 7)]
    assert all(o["status"] == "solved" for o in solved)
    assert len({o["token"] for o in solved}) == len(good)
    assert sandbox.verify(solved[0]["token"])["success"] is True
    assert "done: 8 solved, 2 failed" in run.stderr

    # The same messages, as every other consumer of the topics sees them.
    sent = raw_records(setup, s.kafka.tasks_topic, len(tasks) + 1)
    results = setup.reader(s.kafka.results_topic).read_until(
        lambda r: len(r) >= len(tasks), 30, "the results"
    )
    letters = setup.reader(s.kafka.dead_letter_topic).read_until(
        lambda r: len(r) >= 3, 30, "three dead letters"
    )
    node_tasks = {key: json.loads(value) for key, value in sent if key != "junk"}
    assert sorted(node_tasks) == sorted(o["task_id"] for o in out)
    for key, task in node_tasks.items():
        assert key == task["task_id"]
        if task["method"] == "hcaptcha":  # what the bridge refused, the schema refuses
            assert problems("kafka-task", task)
        else:
            validate("kafka-task", task)
    assert {r.key: r.value for r in results} == {
        o["task_id"]: {k: v for k, v in o.items() if k != "index"} for o in out
    }
    for record in results:
        validate("kafka-result", record.value)
    assert sorted(str(r.value["task_id"]) for r in letters) == sorted(
        ["None", by_index[3]["task_id"], by_index[7]["task_id"]]
    )
    for record in letters:
        validate("kafka-dead-letter", record.value)


def raw_records(setup: KafkaSetup, topic: str, count: int) -> list[tuple[str, bytes]]:
    """(key, value) of the first ``count`` messages of ``topic`` (values not decoded: the
    tasks topic holds a poison message)."""
    consumer = Consumer(consumer_config(setup.settings, group=f"raw-{uuid.uuid4().hex[:8]}"))
    found: list[tuple[str, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(setup.partitions)])

        def enough() -> bool:
            for message in consumer.consume(100, 0.2):
                if not message.error():
                    found.append(((message.key() or b"").decode(), message.value() or b""))
            return len(found) >= count

        wait_until(enough, 30, 0.01, f"{count} messages on {topic}")
    finally:
        consumer.close()
    return found
