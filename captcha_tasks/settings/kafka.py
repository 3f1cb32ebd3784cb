"""The Kafka bridge's and the producer helper's settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .declare import check, client_config, setting


@dataclass(frozen=True)
class KafkaSettings:
    """Where Kafka is and which topics the bridge reads and writes (``settings.kafka``)."""

    bootstrap_servers: str = setting(
        "KAFKA_BOOTSTRAP_SERVERS",
        "the Kafka brokers of the bridge and the producer helper.",
        "localhost:9092",
    )
    tasks_topic: str = setting(
        "KAFKA_TASKS_TOPIC",
        "tasks to solve (JSON with task_id, method, sitekey, pageurl, ...).",
        "captcha-tasks",
    )
    results_topic: str = setting(
        "KAFKA_RESULTS_TOPIC", "one outcome per task, keyed by task_id.", "captcha-results"
    )
    dead_letter_topic: str = setting(
        "KAFKA_DEAD_LETTER_TOPIC",
        "unreadable messages and failed tasks, for inspection and replay.",
        "captcha-dead-letter",
    )
    feedback_topic: str = setting(
        "KAFKA_FEEDBACK_TOPIC",
        """reports on solved tokens (accepted or not, a v3 score), read by the bridge and
        counted as ``report()`` counts them.""",
        "captcha-feedback",
    )
    group_id: str = setting(
        "KAFKA_GROUP_ID", "the bridge's consumer group.", "captcha-tasks-bridge"
    )
    max_in_flight: int | None = setting(
        "KAFKA_MAX_IN_FLIGHT",
        """unfinished tasks per bridge before it pauses its partitions (unset: twice
        CAPTCHAAI_THREADS).""",
        None,
        parse=int,
    )
    result_ttl: float = setting(
        "KAFKA_RESULT_TTL",
        "seconds a published result stays in Redis to answer redeliveries.",
        86400.0,
        parse=float,
    )
    client_config: Mapping[str, Any] = setting(
        "KAFKA_CLIENT_CONFIG",
        "JSON object of extra librdkafka settings (SASL, TLS, ...).",
        factory=dict,
        parse=client_config,
        secret=True,
    )

    def __post_init__(self) -> None:
        check("KAFKA_BOOTSTRAP_SERVERS", bool(self.bootstrap_servers.strip()), "must be set")
        topics = {
            "KAFKA_TASKS_TOPIC": self.tasks_topic,
            "KAFKA_RESULTS_TOPIC": self.results_topic,
            "KAFKA_DEAD_LETTER_TOPIC": self.dead_letter_topic,
            "KAFKA_FEEDBACK_TOPIC": self.feedback_topic,
        }
        for var, topic in topics.items():
            check(var, bool(topic.strip()), "must not be empty")
            others = [v for v, t in topics.items() if v != var and t == topic]
            check(var, not others, f"must differ from {', '.join(others)}")
        check("KAFKA_GROUP_ID", bool(self.group_id.strip()), "must not be empty")
        check(
            "KAFKA_MAX_IN_FLIGHT",
            self.max_in_flight is None or self.max_in_flight >= 1,
            "must be at least 1",
        )
        check("KAFKA_RESULT_TTL", self.result_ttl > 0, "must be > 0")

    def in_flight_limit(self, threads: int) -> int:
        """Unfinished tasks one bridge holds before it pauses its partitions, with
        ``threads`` the primary's (CAPTCHAAI_THREADS)."""
        if self.max_in_flight is not None:
            return self.max_in_flight
        return 2 * threads
