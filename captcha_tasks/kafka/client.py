"""Kafka clients built from settings, the producer helper for scrapers, and consumer lag.

Needs the ``kafka`` extra (``pip install 'captcha-tasks[kafka]'``): importing this module
without confluent-kafka raises :class:`~captcha_tasks.errors.ConfigurationError` saying
so.  ``import captcha_tasks`` never imports it.

librdkafka settings are layered: our defaults, then ``KAFKA_CLIENT_CONFIG`` (SASL, TLS,
timeouts...), then what correctness depends on (bootstrap servers, the group, manual
commits, ``acks=all`` with idempotence), which always wins.  The settings' values are
never logged: ``KAFKA_CLIENT_CONFIG`` may hold passwords.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.lanes import check_lane, check_tenant
from ..errors import ConfigurationError, KafkaDeliveryError, KafkaUnavailable, ValidationError
from ..methods import build_request
from ..settings import Settings
from .messages import (
    FEEDBACK_RESULT_FIELDS,
    Feedback,
    check_score,
    check_task_id,
    feedback_value,
    task_value,
)

INSTALL_HINT = "Kafka support is not installed: pip install 'captcha-tasks[kafka]'"

try:
    from confluent_kafka import (
        Consumer,
        KafkaError,
        KafkaException,
        Message,
        Producer,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ConfigurationError(INSTALL_HINT) from exc

__all__ = [
    "Consumer",
    "KafkaError",
    "KafkaException",
    "Message",
    "Producer",
    "TopicPartition",
]

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("captcha_tasks.librdkafka")


class RepeatFilter(logging.Filter):
    """Let one of identical log lines through per ``every_s`` seconds: librdkafka logs a
    connection failure on each reconnect attempt, which would flood the log."""

    def __init__(self, every_s: float = 60.0) -> None:
        super().__init__()
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        text = record.getMessage()
        if now - self._last.get(text, -self.every_s) < self.every_s:
            return False
        if len(self._last) > 1000:
            self._last.clear()  # bounded memory; at worst one extra line per message
        self._last[text] = now
        return True


_librdkafka_log.addFilter(RepeatFilter())

#: Messages librdkafka prefetches per partition: a backlog stays on the brokers.
PREFETCH_MESSAGES = 1000


def _layered(settings: Settings, defaults: dict[str, Any], **required: Any) -> dict[str, Any]:
    return {
        "client.id": "captcha-tasks",
        **defaults,
        **settings.kafka.client_config,
        "bootstrap.servers": settings.kafka.bootstrap_servers,
        "logger": _librdkafka_log,
        **required,
    }


def consumer_config(settings: Settings, group: str | None = None) -> dict[str, Any]:
    """A consumer of the bridge's group that commits only what the bridge tells it."""
    defaults = {
        # Incremental rebalances: members keep their other partitions while one joins.
        "partition.assignment.strategy": "cooperative-sticky",
        "auto.offset.reset": "earliest",  # tasks produced before the first bridge count
        "queued.min.messages": PREFETCH_MESSAGES,
    }
    return _layered(
        settings,
        defaults,
        **{
            "group.id": group or settings.kafka.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        },
    )


def producer_config(settings: Settings) -> dict[str, Any]:
    """A producer whose acknowledged messages are on every in-sync replica, once."""
    return _layered(settings, {"linger.ms": 5}, **{"acks": "all", "enable.idempotence": True})


def admin_config(settings: Settings) -> dict[str, Any]:
    """An admin client of the same cluster (topics, group descriptions)."""
    return _layered(settings, {})


def _app_settings() -> Settings:
    # The default of the helpers below: the package app's settings at the call (those
    # app.use gave, else the environment's).
    from ..worker.app import app

    return app.settings()


# -- producer helper for scrapers ---------------------------------------------------------


class TaskProducer:
    """Publish solve tasks to ``KAFKA_TASKS_TOPIC`` (``acks=all``, idempotent).

    ``enqueue`` validates like ``solve.delay`` and returns at once; :meth:`flush` waits
    for the brokers and raises :class:`KafkaDeliveryError` naming the tasks they refused.
    Results arrive on ``KAFKA_RESULTS_TOPIC`` keyed by ``task_id``; :meth:`feedback`
    says whether the site accepted a result's token (``KAFKA_FEEDBACK_TOPIC``).
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or _app_settings()
        self._producer = Producer(producer_config(self.settings))
        self._failed: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def enqueue(
        self,
        task_id: str,
        method: str,
        sitekey: str | None = None,
        pageurl: str | None = None,
        **params: Any,
    ) -> str:
        """Queue one task; ``task_id`` must be unique (a UUID, for example).  ``tenant=``
        (one ``CAPTCHAAI_TENANTS`` declares) and ``lane=`` (default: bulk) travel with it."""
        lane, tenant = params.pop("lane", None), params.pop("tenant", None)
        route = {}
        if lane is not None:
            route["lane"] = check_lane(lane)
        if tenant is not None:
            route["tenant"] = check_tenant(tenant, self.settings.tenants.declared)
        request = build_request(method, sitekey, pageurl, **params)
        fields: dict[str, Any] = {"method": request.method}
        if request.sitekey is not None:
            fields["sitekey"] = request.sitekey
        if request.pageurl is not None:
            fields["pageurl"] = request.pageurl
        fields.update(request.params)
        fields.update(route)
        value = task_value(check_task_id(task_id), fields)
        self._produce(task_id, value)
        return task_id

    def feedback(
        self, result: Mapping[str, Any] | str, *, good: bool, score: float | None = None
    ) -> None:
        """Queue a report on a solved token, as ``report()`` sends one: ``result`` is the
        result read from ``KAFKA_RESULTS_TOPIC`` (any solved outcome dict will do), or
        its ``task_id``; ``good``: whether the site accepted the token; ``score``: the
        reCAPTCHA v3 score the site returned (0 to 1).  The bridge reports it to the
        provider that solved it and counts it for the site's acceptance."""
        message = feedback_of(result, good, score)
        key = message.task_id or (message.result or {})["captcha_id"]
        self._produce(key, feedback_value(message), self.settings.kafka.feedback_topic)

    def _produce(self, task_id: str, value: bytes, topic: str | None = None) -> None:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                with self._lock:
                    self._failed.append((task_id, err.str()))

        while True:
            try:
                self._producer.produce(
                    topic or self.settings.kafka.tasks_topic,
                    key=task_id.encode(),
                    value=value,
                    on_delivery=delivered,
                )
                break
            except BufferError:
                self._producer.poll(0.1)  # the local queue is full: let deliveries drain it
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued task is acknowledged; raise if any was refused."""
        left = self._producer.flush(timeout)
        with self._lock:
            failed, self._failed = self._failed, []
        if failed:
            ids = ", ".join(task_id for task_id, _ in failed[:5])
            raise KafkaDeliveryError(f"{len(failed)} task(s) not delivered ({ids}): {failed[0][1]}")
        if left:
            raise KafkaDeliveryError(f"{left} task(s) still unacknowledged after {timeout}s")

    def __enter__(self) -> TaskProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.flush()


def enqueue(
    task_id: str, method: str, sitekey: str | None = None, pageurl: str | None = None, **params: Any
) -> str:
    """Publish one task and wait for the brokers' acknowledgement (``acks=all``).

    Validates like ``solve.delay`` (raises :class:`~captcha_tasks.errors.ValidationError`
    before producing).  ``task_id`` must be unique per task across producers — a UUID is
    a good choice.  Each call opens (and closes) a producer: for many tasks, use
    :class:`TaskProducer` and flush once.
    """
    with TaskProducer() as producer:
        producer.enqueue(task_id, method, sitekey, pageurl, **params)
    return task_id


def feedback_of(result: Mapping[str, Any] | str, good: bool, score: float | None) -> Feedback:
    """The feedback message on ``result`` (a result dict, or a task id)."""
    if not isinstance(good, bool):
        raise ValidationError(f"good must be True or False, got {good!r}")
    checked = check_score(score)
    if isinstance(result, str):
        return Feedback(good, check_task_id(result), score=checked)
    if result.get("status", "solved") != "solved" or not result.get("captcha_id"):
        raise ValidationError("feedback needs a solved result (with a captcha_id)")
    fields = {k: str(result[k]) for k in FEEDBACK_RESULT_FIELDS if result.get(k) is not None}
    task_id = result.get("task_id")
    return Feedback(good, check_task_id(task_id) if task_id else None, fields, checked)


def send_feedback(
    result: Mapping[str, Any] | str, *, good: bool, score: float | None = None
) -> None:
    """Publish one report on a solved token to ``KAFKA_FEEDBACK_TOPIC`` and wait for the
    brokers' acknowledgement (see :meth:`TaskProducer.feedback`); for many, use a
    :class:`TaskProducer` and flush once."""
    with TaskProducer() as producer:
        producer.feedback(result, good=good, score=score)


# -- topics and lag -----------------------------------------------------------------------


#: Partitions of the feedback topic that :func:`create_topics` makes.  The bridges' group
#: balances the partitions of both its topics together: a feedback topic as wide as the
#: tasks topic could leave a bridge holding feedback partitions only, and the tasks with
#: fewer bridges.  Reports are few (one per checked token) and need no order: one is enough.
FEEDBACK_PARTITIONS = 1


def create_topics(
    settings: Settings | None = None,
    *,
    partitions: int = 6,
    replication_factor: int = 1,
    timeout: float = 30.0,
) -> list[str]:
    """Create the tasks, results and dead-letter topics (``partitions`` each) and the
    feedback topic (:data:`FEEDBACK_PARTITIONS`); returns those that were created."""
    settings = settings or _app_settings()
    admin = AdminClient(admin_config(settings))
    sizes = {
        settings.kafka.tasks_topic: partitions,
        settings.kafka.results_topic: partitions,
        settings.kafka.dead_letter_topic: partitions,
        settings.kafka.feedback_topic: FEEDBACK_PARTITIONS,
    }
    futures = admin.create_topics(
        [NewTopic(name, size, replication_factor) for name, size in sizes.items()],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaUnavailable(f"could not create topic {name}: {exc}") from None
        else:
            created.append(name)
    return created


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    #: The group's committed offset (None: nothing committed yet).
    committed: int | None
    #: The earliest and the next offset of the partition.
    start: int
    end: int

    @property
    def lag(self) -> int:
        """Messages not yet processed by the group (a new group starts at the earliest)."""
        position = self.start if self.committed is None else max(self.committed, self.start)
        return max(0, self.end - position)


def consumer_lag(
    settings: Settings | None = None,
    *,
    group: str | None = None,
    topic: str | None = None,
    timeout: float = 10.0,
) -> list[PartitionLag]:
    """Per partition of the tasks topic: the group's committed offset, the end, the lag."""
    settings = settings or _app_settings()
    topic = topic or settings.kafka.tasks_topic
    # A consumer that never subscribes reads the group's offsets without joining it.
    consumer = Consumer(consumer_config(settings, group))
    try:
        partitions = _partitions(consumer, topic, timeout)
        wanted = [TopicPartition(topic, p) for p in partitions]
        committed = {tp.partition: tp.offset for tp in consumer.committed(wanted, timeout)}
        return [
            _lag_of(consumer, topic, number, committed.get(number, -1), timeout)
            for number in partitions
        ]
    except KafkaException as exc:
        raise KafkaUnavailable(f"could not read offsets of {topic}: {exc}") from None
    finally:
        consumer.close()


def _partitions(consumer: Consumer, topic: str, timeout: float) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise KafkaUnavailable(f"topic {topic} does not exist or has no partitions")
    return sorted(metadata.partitions)


def _lag_of(
    consumer: Consumer, topic: str, number: int, committed: int, timeout: float
) -> PartitionLag:
    start, end = consumer.get_watermark_offsets(
        TopicPartition(topic, number), timeout=timeout, cached=False
    )
    return PartitionLag(number, committed if committed >= 0 else None, start, end)


def total_lag(lags: Iterable[PartitionLag]) -> int:
    """The group's lag over every partition."""
    return sum(item.lag for item in lags)
