"""Kafka test harness: a real single-node Apache Kafka broker (KRaft) for the session,
topics and a consumer group per test, bridge processes, and a reader of output topics.

Import the fixtures into a test module (conftest.py belongs to the core suite)::

    from kafka_broker import kafka_broker_fixture, kafka_fixture, start_bridge_fixture

The broker's jars come from Maven Central on the first run and are cached (see
:mod:`harness.kafka_broker`).  Without Java 17+ or Maven the tests that need the
broker are skipped with the reason; on CI (``CI`` set) that is a failure instead, so the
suite cannot silently stop testing Kafka.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from system_parts import missing

from captcha_tasks.kafka.client import (
    Consumer,
    TopicPartition,
    admin_config,
    consumer_config,
    create_topics,
)
from captcha_tasks.settings import Settings
from captcha_tasks.testing.processes import wait_until
from harness.kafka_broker import BridgeProcess, KafkaBroker, missing_tools

#: Quick failure detection for the tests that kill a bridge (the broker's minimum).
TEST_CLIENT_CONFIG = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


@pytest.fixture(scope="session", name="kafka_broker")
def kafka_broker_fixture(output_dir: Path) -> Iterator[KafkaBroker]:
    """One broker for the whole session, stopped and deleted at the end."""
    problem = missing_tools()
    if problem:
        missing("Kafka broker", problem)
    broker = KafkaBroker(log_dir=output_dir)
    try:
        broker.start()
    except BaseException:
        broker.stop()
        raise
    yield broker
    broker.stop()


@dataclass
class KafkaSetup:
    """One test's topics and group: its settings and the environment for bridges."""

    settings: Settings
    env: dict[str, str]
    partitions: int
    readers: list[TopicReader] = field(default_factory=list)

    def reader(self, topic: str) -> TopicReader:
        """A reader of ``topic`` from its beginning, closed after the test."""
        reader = TopicReader(self.settings, topic)
        self.readers.append(reader)
        return reader


@pytest.fixture(name="kafka")
def kafka_fixture(
    kafka_broker: KafkaBroker, env: dict[str, str]
) -> Iterator[Callable[..., KafkaSetup]]:
    """Factory: fresh topics (``partitions`` each) and a fresh group for this test."""
    setups: list[KafkaSetup] = []

    def make(partitions: int = 6, **settings: Any) -> KafkaSetup:
        suffix = uuid.uuid4().hex[:8]
        own = {
            "KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
            "KAFKA_TASKS_TOPIC": f"tasks-{suffix}",
            "KAFKA_RESULTS_TOPIC": f"results-{suffix}",
            "KAFKA_DEAD_LETTER_TOPIC": f"dead-{suffix}",
            "KAFKA_FEEDBACK_TOPIC": f"feedback-{suffix}",
            "KAFKA_GROUP_ID": f"bridge-{suffix}",
            "KAFKA_CLIENT_CONFIG": json.dumps(TEST_CLIENT_CONFIG),
            **{k: str(v) for k, v in settings.items()},
        }
        full = {**env, **own}  # on top of the test module's settings
        resolved = Settings.from_env(full)
        create_topics(resolved, partitions=partitions)
        setups.append(KafkaSetup(resolved, full, partitions))
        return setups[-1]

    yield make
    for setup in setups:
        for reader in setup.readers:
            reader.close()


@pytest.fixture(name="start_bridge")
def start_bridge_fixture(output_dir: Path) -> Iterator[Callable[..., BridgeProcess]]:
    """Factory for bridge processes; every one is stopped after the test."""
    started: list[BridgeProcess] = []

    def start(setup: KafkaSetup, name: str, *args: str) -> BridgeProcess:
        proc = BridgeProcess(name, setup.env, output_dir, args)
        started.append(proc)
        return proc.start()

    yield start
    for proc in started:
        proc.stop()


@dataclass
class Record:
    partition: int
    offset: int
    key: str | None
    value: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class TopicReader:
    """Reads a whole topic from the beginning, without a consumer group."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.topic = topic
        config = consumer_config(settings, group=f"reader-{uuid.uuid4().hex[:8]}")
        self.consumer = Consumer(config)
        metadata = self.consumer.list_topics(topic, timeout=10).topics[topic]
        self.consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
        self.records: list[Record] = []

    def poll(self, timeout: float = 0.2) -> list[Record]:
        """Everything that arrived since the last call."""
        new = []
        for message in self.consumer.consume(1000, timeout):
            if message.error():
                continue
            key = message.key()
            headers = {k: (v or b"").decode() for k, v in message.headers() or []}
            new.append(
                Record(
                    message.partition() or 0,
                    message.offset() or 0,
                    key.decode() if key is not None else None,
                    json.loads(message.value() or b"null"),
                    headers,
                )
            )
        self.records.extend(new)
        return new

    def read_until(
        self, done: Callable[[list[Record]], bool], timeout: float, what: str
    ) -> list[Record]:
        """Poll until ``done(records so far)``; TimeoutError naming ``what`` otherwise."""

        def caught_up() -> bool:
            self.poll()
            return done(self.records)

        wait_until(caught_up, timeout, 0.01, what)
        return self.records

    def close(self) -> None:
        self.consumer.close()


def group_members(settings: Settings) -> dict[str, list[int]]:
    """Member id -> assigned partitions of the tasks topic in the bridge group (empty while
    rebalancing); the members also hold the feedback topic's."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_config(settings))
    future = admin.describe_consumer_groups([settings.kafka.group_id])[settings.kafka.group_id]
    group = future.result(10)
    if str(group.state).rsplit(".", 1)[-1] != "STABLE":
        return {}
    return {
        member.member_id: sorted(
            tp.partition
            for tp in member.assignment.topic_partitions
            if tp.topic == settings.kafka.tasks_topic
        )
        for member in group.members
    }


def wait_for_members(setup: KafkaSetup, count: int, timeout: float = 60) -> dict[str, list[int]]:
    """Wait until ``count`` members share every partition, each holding some."""
    found: dict[str, list[int]] = {}

    def settled() -> bool:
        found.clear()
        found.update(group_members(setup.settings))
        owned = sorted(p for parts in found.values() for p in parts)
        return (
            len(found) == count and all(found.values()) and owned == list(range(setup.partitions))
        )

    wait_until(settled, timeout, 0.2, f"{count} bridges sharing the partitions")
    return found
