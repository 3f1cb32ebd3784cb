"""The Kafka bridge: ``captcha-tasks`` in, Celery ``solve`` in the middle, one outcome out.

One :class:`Bridge` is one member of the ``KAFKA_GROUP_ID`` consumer group, in one thread:

    consume ──► parse ──► validate ──► claim (Redis) ──► solve.apply_async ─┐
       ▲                                                                    │ Celery
       │ pause at KAFKA_MAX_IN_FLIGHT                                       ▼ workers
    commit ◄── contiguous offsets ◄── delivery ack ◄── produce ◄── result (one MGET per loop)

* **Many in flight per partition.**  Messages are dispatched as they arrive; the only bound
  is the number of unfinished messages (``KAFKA_MAX_IN_FLIGHT``, default twice the plan's
  threads).  At the bound every assigned partition is paused, so the backlog stays in
  Kafka; the thread limiter (not the partition count) decides how many captchas run.
* **Results** are found by one ``MGET`` of the in-flight solves' result keys per loop turn
  (the consumer poll timeout is short while solves are in flight), never one poll per task.
* **Offsets** are committed per partition up to the oldest message not yet answered, after
  the brokers acknowledged the answer (:mod:`captcha_tasks.kafka.offsets`).
* **Duplicates**: a redelivered task is claimed by ``task_id`` before dispatch
  (:mod:`captcha_tasks.kafka.claims`): a stored answer is published again, a solve that
  another bridge dispatched is waited for (its Celery id), not paid for twice.
* **Dead letters**: a message without a ``task_id`` goes to ``KAFKA_DEAD_LETTER_TOPIC``
  alone; a task that fails validation or fails its solve gets its failed outcome on
  ``KAFKA_RESULTS_TOPIC`` and a copy, with the original task, on the dead-letter topic.
* **Feedback**: the same consumer reads ``KAFKA_FEEDBACK_TOPIC``, reports on solved
  tokens, and hands each to ``report()`` (:mod:`captcha_tasks.kafka.feedback`); its
  partitions are never paused (a report is queued at once) and their offsets are
  committed by the same rule.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.lanes import BULK
from ..core.outcome import Failed
from ..errors import (
    BadMessage,
    CaptchaTasksError,
    ConfigurationError,
    KafkaDeliveryError,
    StoreUnavailable,
    ValidationError,
)
from ..settings import Settings
from ..state import State
from ..worker.app import app
from ..worker.callsite import normalize_solve_args
from ..worker.results import Results
from ..worker.tasks import solve
from .claims import Claim, ClaimStore
from .client import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
    consumer_config,
    producer_config,
)
from .feedback import FeedbackReader
from .messages import (
    Headers,
    Source,
    TaskMessage,
    dead_letter,
    dead_letter_headers,
    decode,
    encode,
    parse_task,
    result_value,
)
from .offsets import OffsetTracker, Pending

log = logging.getLogger(__name__)

#: Seconds between looks while Redis is unreachable: from the first, doubling to the last.
REDIS_WAIT_S = (0.5, 5.0)
#: Consumer poll timeout while solves are in flight: the delay before a result is seen.
BUSY_POLL_S = 0.02
#: ... and while nothing is in flight (a message still returns as soon as it arrives).
IDLE_POLL_S = 0.5
#: Seconds between asynchronous offset commits.
COMMIT_EVERY_S = 0.5
#: Seconds a revoke waits for answers being delivered, so their offsets can be committed.
REVOKE_FLUSH_S = 5.0


@dataclass
class Received:
    """A consumed message: where it came from, its bytes, its offset bookkeeping."""

    source: Source
    value: bytes | None
    pending: Pending


@dataclass
class Wait:
    """A solve this bridge waits for, and the messages it answers."""

    task: TaskMessage
    kwargs: dict[str, Any]
    celery_id: str
    messages: list[Received]
    #: Monotonic time after which the claim is looked at again (taken over if stale).
    recheck_at: float
    started: float = field(default_factory=time.monotonic)


class ResultWatcher:
    """Outcomes of many Celery solves with one Redis round trip (``MGET`` of their
    result keys), instead of one poll per ``AsyncResult``."""

    def __init__(self, results: Results) -> None:
        if not hasattr(results.backend, "mget"):
            raise ConfigurationError("the Kafka bridge needs Celery's Redis result backend")
        self.results = results

    def ready(self, waits: Mapping[str, Wait]) -> dict[str, dict[str, Any]]:
        """Celery id -> outcome dict, for the solves that have finished."""
        if not waits:
            return {}
        ids = list(waits)
        raw = self.results.backend.mget([self.results.key(i) for i in ids])
        done: dict[str, dict[str, Any]] = {}
        for celery_id, value in zip(ids, raw, strict=True):
            if value is None:
                continue
            read = self.results.read(value)
            if read.ready:
                wait = waits[celery_id]
                elapsed = round(time.monotonic() - wait.started, 3)
                done[celery_id] = read.outcome_dict(wait.task.method, elapsed)
        return done


class Bridge:
    """One member of the bridge's consumer group; :meth:`run` until ``stop`` is set."""

    def __init__(
        self,
        settings: Settings,
        state: State,
        *,
        max_in_flight: int | None = None,
        consumer: Consumer | None = None,
        producer: Producer | None = None,
        claims: ClaimStore | None = None,
    ) -> None:
        self.settings = s = settings
        self.topic = s.kafka.tasks_topic
        self.limit = max_in_flight or s.kafka.in_flight_limit(s.providers.threads)
        # Resume a little below the bound, so partitions do not flap on every answer.
        self.resume_at = self.limit - max(1, self.limit // 4)
        self.consumer = consumer or Consumer(consumer_config(s))
        self.producer = producer or Producer(producer_config(s))
        self.claims = claims or ClaimStore.for_settings(state.db, s)
        self.master_changes = state.master_changes
        self.results = ResultWatcher(Results(app))
        self.tracker = OffsetTracker()
        self.feedback = FeedbackReader(
            s.kafka.feedback_topic, self.claims, self._letter, s.providers.name
        )
        self.waits: dict[str, Wait] = {}  # Celery id -> wait
        self._by_task: dict[str, str] = {}  # task id -> Celery id, for duplicate messages
        self.assigned: set[int] = set()
        self.paused: set[int] = set()
        self._last_commit = 0.0
        self._delivery_error: KafkaDeliveryError | None = None

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event, drain_timeout: float = 10.0) -> None:
        """Consume, dispatch and answer until ``stop`` is set; then finish what is in
        flight for up to ``drain_timeout`` seconds and leave the group (what is left is
        redelivered to the other members, who wait for its solves)."""
        self.consumer.subscribe(
            [self.topic, self.feedback.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        s = self.settings
        log.info(
            "kafka bridge consuming %s and %s (group %s, brokers %s) -> %s / %s, max in flight %d",
            self.topic,
            self.feedback.topic,
            s.kafka.group_id,
            s.kafka.bootstrap_servers,
            s.kafka.results_topic,
            s.kafka.dead_letter_topic,
            self.limit,
        )
        try:
            while not stop.is_set():
                self.step()
            self._drain(drain_timeout)
        finally:
            self.close()

    def step(self) -> None:
        """One turn: take messages, collect finished solves, deliver, commit, pause."""
        self._take_messages()
        self._collect()
        self._recheck(time.monotonic())
        self.producer.poll(0)
        if self._delivery_error is not None:
            raise self._delivery_error
        self._commit()
        self._back_pressure()
        with contextlib.suppress(StoreUnavailable):  # counted with the next report
            self.master_changes.report("kafka")

    def _take_messages(self) -> None:
        timeout = BUSY_POLL_S if self.waits else IDLE_POLL_S
        first = self.consumer.poll(timeout)
        if first is None:
            return
        room = self.limit - self.tracker.pending_count() - 1
        batch = [first, *self.consumer.consume(room, 0)] if room > 0 else [first]
        for message in batch:
            self._handle(message)

    def _drain(self, timeout: float) -> None:
        self._pause(self.assigned)
        feedback = sorted(self.feedback.assigned)
        if feedback:
            self.consumer.pause([TopicPartition(self.feedback.topic, p) for p in feedback])
        deadline = time.monotonic() + timeout
        while self.waits and time.monotonic() < deadline:
            self.consumer.poll(BUSY_POLL_S)  # serve rebalances and heartbeats, no messages
            self._collect()
            self.producer.poll(0)
        if self.waits:
            log.info("leaving %d solve(s) in flight to the group's other members", len(self.waits))

    def close(self) -> None:
        """Deliver what is being delivered, commit what is safe, leave the group."""
        self.producer.flush(REVOKE_FLUSH_S)
        self._commit(force=True, sync=True)
        self.consumer.close()  # revokes our partitions (committing again) and leaves
        self.producer.flush(REVOKE_FLUSH_S)

    # -- one message ---------------------------------------------------------------------

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.fatal():
                raise KafkaException(error)
            log.warning("consumer error: %s", error)
            return
        number, offset = message.partition(), message.offset()
        if number is None or offset is None:
            return
        if message.topic() == self.feedback.topic:
            if number in self.feedback.assigned:
                self.feedback.handle(number, offset, message.key(), message.value())
            return
        if number not in self.assigned:
            return  # revoked since it was fetched: its next owner reads it
        received = Received(
            Source(self.topic, number, offset, message.key()),
            message.value(),
            self.tracker.track(number, offset),
        )
        try:
            task = parse_task(received.value)
        except BadMessage as exc:
            self._dead_letter_only(received, exc)
            return
        try:
            kwargs = normalize_solve_args((), dict(task.fields), self.settings)
        except ValidationError as exc:
            self._invalid(received, task, exc)
            return
        kwargs.setdefault("lane", BULK)  # a pipeline's work, unless the task names a lane
        self._claim(task, kwargs, [received])

    def _dead_letter_only(self, received: Received, exc: BadMessage) -> None:
        log.warning("dead letter %s: %s", _where(received), exc.message)
        letter = dead_letter(exc.message, exc.code, received.source, received.value)
        self.claims.count("dead_letters")
        self._publish([received], key=received.source.key, result=None, letter=letter)

    def _letter(self, source: Source, value: bytes | None, pending: Pending, letter: Any) -> None:
        # A feedback message's dead letter: its offset is finished once the letter is acked.
        received = Received(source, value, pending)
        self._publish([received], key=source.key, result=None, letter=letter)

    def _invalid(self, received: Received, task: TaskMessage, exc: CaptchaTasksError) -> None:
        # Validation is deterministic, so a redelivery answers the same: nothing to store.
        log.warning("task %s is invalid: %s", task.task_id, exc)
        outcome = Failed.from_exception(exc, task.method, 0.0).to_dict()
        letter = dead_letter(
            exc.message, exc.code, received.source, received.value, task=task, outcome=outcome
        )
        self.claims.count("invalid")
        result = result_value(task.task_id, outcome)
        self._publish([received], key=task.task_id.encode(), result=result, letter=letter)

    def _claim(
        self,
        task: TaskMessage,
        kwargs: dict[str, Any],
        messages: list[Received],
        give_up_on: str = "",
    ) -> None:
        known = self._by_task.get(task.task_id)
        if known is not None:  # the same task twice in our hands: one solve answers both
            self.waits[known].messages.extend(messages)
            self.claims.count("duplicates")
            return
        claim = self.claims.claim(task.task_id, uuid.uuid4().hex, give_up_on=give_up_on)
        if claim.state == "done":
            self._republish(task, claim, messages)
        elif claim.ours:
            if claim.state == "takeover":
                log.warning("task %s: taking over claim %s", task.task_id, give_up_on)
                self.claims.count("takeovers")
            self._dispatch(task, kwargs, claim.celery_id, messages)
        else:
            if not give_up_on:
                self.claims.count("waited")
            self._wait(Wait(task, kwargs, claim.celery_id, messages, _at(claim.trust_s)))

    def _dispatch(
        self, task: TaskMessage, kwargs: dict[str, Any], celery_id: str, messages: list[Received]
    ) -> None:
        try:
            solve.apply_async(kwargs=kwargs, task_id=celery_id)
        except Exception:
            self.claims.release(task.task_id, celery_id)
            raise
        self.claims.dispatched(task.task_id, celery_id)
        self.claims.count("dispatched")
        self._wait(Wait(task, kwargs, celery_id, messages, _at(self.claims.solve_grace_s)))

    def _wait(self, wait: Wait) -> None:
        self.waits[wait.celery_id] = wait
        self._by_task[wait.task.task_id] = wait.celery_id

    def _republish(self, task: TaskMessage, claim: Claim, messages: list[Received]) -> None:
        log.info("task %s was answered before; publishing its stored result again", task.task_id)
        self.claims.count("republished")
        letter = decode(claim.dead_letter) if claim.dead_letter else None
        result = decode(claim.result)
        self._publish(messages, key=task.task_id.encode(), result=result, letter=letter)

    # -- answers -------------------------------------------------------------------------

    def _collect(self) -> None:
        for celery_id, outcome in self.results.ready(self.waits).items():
            wait = self.waits.pop(celery_id)
            self._by_task.pop(wait.task.task_id, None)
            self._answer(wait, outcome)

    def _answer(self, wait: Wait, outcome: dict[str, Any]) -> None:
        task = wait.task
        result = result_value(task.task_id, outcome)
        letter = None
        if outcome.get("status") == "failed":
            first = wait.messages[0]
            reason = f"solve failed: {outcome.get('message') or outcome.get('error')}"
            letter = dead_letter(
                reason,
                str(outcome.get("error")),
                first.source,
                first.value,
                task=task,
                outcome=outcome,
            )
            self.claims.count("failed")
        # Stored before it is produced: a crash in between re-publishes the same answer.
        kept = self.claims.complete(
            task.task_id, encode(result).decode(), encode(letter).decode() if letter else ""
        )
        if not kept.stored:  # answered by another bridge meanwhile: repeat its answer
            self.claims.count("answered_twice")
            result = decode(kept.result)
            letter = decode(kept.dead_letter) if kept.dead_letter else None
        self._publish(wait.messages, key=task.task_id.encode(), result=result, letter=letter)

    def _recheck(self, now: float) -> None:
        stale = [w for w in self.waits.values() if w.recheck_at <= now]
        for wait in stale:
            # Its result was looked for in this turn's MGET and was not there.
            del self.waits[wait.celery_id]
            self._by_task.pop(wait.task.task_id, None)
            self._claim(wait.task, wait.kwargs, wait.messages, give_up_on=wait.celery_id)

    def _publish(
        self,
        messages: list[Received],
        *,
        key: bytes | None,
        result: dict[str, Any] | None,
        letter: dict[str, Any] | None,
    ) -> None:
        s = self.settings
        sends: list[tuple[str, bytes, Headers]] = []
        if result is not None:
            sends.append((s.kafka.results_topic, encode(result), []))
        if letter is not None:
            sends.append((s.kafka.dead_letter_topic, encode(letter), dead_letter_headers(letter)))
        acked = _Acks(self, messages, len(sends))
        for topic, value, headers in sends:
            self._produce(topic, key, value, headers, acked)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Headers,
        acked: _Acks,
    ) -> None:
        while True:
            try:
                self.producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=acked.delivered
                )
                return
            except BufferError:
                self.producer.poll(0.1)  # the local queue is full: let deliveries drain it

    def delivered(self, messages: Iterable[Received]) -> None:
        for received in messages:
            if received.source.topic == self.feedback.topic:
                self.feedback.tracker.finish(received.pending)
            else:
                self.tracker.finish(received.pending)

    def _delivery_failed(self, error: KafkaError) -> None:
        # librdkafka has retried for delivery.timeout.ms already.  Stop: the offsets of the
        # unanswered tasks stay uncommitted, and their next owner answers them from Redis.
        if self._delivery_error is None:
            self._delivery_error = KafkaDeliveryError(f"an answer was not delivered: {error.str()}")

    # -- offsets, pausing, rebalances ----------------------------------------------------

    def _commit(
        self,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        force: bool = False,
        sync: bool = False,
    ) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < COMMIT_EVERY_S:
            return
        self._last_commit = now
        chosen = None if partitions is None else list(partitions)
        points = {
            topic: tracker.commit_points(
                None if chosen is None else {tp.partition for tp in chosen if tp.topic == topic},
                changed_only=not force,
            )
            for topic, tracker in self._trackers()
        }
        offsets = [TopicPartition(t, n, o) for t, found in points.items() for n, o in found.items()]
        if not offsets:
            return
        try:
            self._send_commit(offsets, sync)
        except KafkaException as exc:
            # Not fatal: the messages are redelivered and answered from Redis.
            log.warning("offset commit failed: %s", exc)
            return
        for topic, tracker in self._trackers():
            tracker.mark_committed(points[topic])

    def _trackers(self) -> list[tuple[str, OffsetTracker]]:
        return [(self.topic, self.tracker), (self.feedback.topic, self.feedback.tracker)]

    def _send_commit(self, offsets: list[TopicPartition], sync: bool) -> None:
        if not sync:
            self.consumer.commit(offsets=offsets, asynchronous=True)
            return
        for tp in self.consumer.commit(offsets=offsets, asynchronous=False):
            if tp.error is not None:
                raise KafkaException(tp.error)

    def _back_pressure(self) -> None:
        pending = self.tracker.pending_count()
        if pending >= self.limit:
            self._pause(self.assigned - self.paused)
        elif self.paused and pending <= self.resume_at:
            self._resume(self.paused & self.assigned)
            self.paused.clear()

    def _pause(self, partitions: set[int]) -> None:
        if partitions:
            self.consumer.pause([TopicPartition(self.topic, p) for p in sorted(partitions)])
            self.paused |= partitions

    def _resume(self, partitions: set[int]) -> None:
        if partitions:
            self.consumer.resume([TopicPartition(self.topic, p) for p in sorted(partitions)])

    def _split(self, partitions: list[TopicPartition]) -> tuple[set[int], set[int]]:
        """The partition numbers of the tasks topic, and of the feedback topic."""
        tasks = {tp.partition for tp in partitions if tp.topic == self.topic}
        feedback = {tp.partition for tp in partitions if tp.topic == self.feedback.topic}
        return tasks, feedback

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers, feedback = self._split(partitions)
        self.assigned |= numbers
        self.feedback.assigned |= feedback
        log.info(
            "partitions assigned: %s, feedback %s (now %s, feedback %s)",
            sorted(numbers),
            sorted(feedback),
            sorted(self.assigned),
            sorted(self.feedback.assigned),
        )

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers, feedback = self._split(partitions)
        log.info("partitions revoked: %s, feedback %s", sorted(numbers), sorted(feedback))
        # Answers on their way count: wait for their acknowledgements, then commit.
        self.producer.flush(REVOKE_FLUSH_S)
        self._commit(partitions, force=True, sync=True)
        self._forget(numbers, feedback)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers, feedback = self._split(partitions)
        log.warning(
            "partitions lost (no commit possible): %s, feedback %s",
            sorted(numbers),
            sorted(feedback),
        )
        self._forget(numbers, feedback)

    def _forget(self, numbers: set[int], feedback: set[int]) -> None:
        """Stop working for revoked partitions: their next owner waits for these solves."""
        for celery_id, wait in list(self.waits.items()):
            wait.messages = [m for m in wait.messages if m.source.partition not in numbers]
            if not wait.messages:
                del self.waits[celery_id]
                self._by_task.pop(wait.task.task_id, None)
        self.tracker.forget(numbers)
        self.assigned -= numbers
        self.paused -= numbers
        self.feedback.tracker.forget(feedback)
        self.feedback.assigned -= feedback


class _Acks:
    """Counts the acknowledgements one answer needs; finishes its messages at the last."""

    def __init__(self, bridge: Bridge, messages: list[Received], expected: int) -> None:
        self.bridge = bridge
        self.messages = messages
        self.left = expected

    def delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.bridge._delivery_failed(error)
            return
        self.left -= 1
        if self.left == 0:
            self.bridge.delivered(self.messages)


def _at(seconds: float) -> float:
    return time.monotonic() + seconds


def _where(received: Received) -> str:
    source = received.source
    return f"{source.topic}[{source.partition}]@{source.offset}"


def run_bridge(
    settings: Settings,
    state: State,
    *,
    stop: threading.Event | None = None,
    max_in_flight: int | None = None,
    drain_timeout: float = 10.0,
) -> None:
    """Run one bridge member until ``stop`` is set (the CLI sets it on SIGTERM / SIGINT).

    Redis going away (a restart, a failover) does not end it: the member leaves the group
    with what is safe committed, waits for Redis, and joins again; the tasks it had in hand
    are delivered again and their claims in Redis say which solves already run."""
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            bridge = Bridge(settings, state, max_in_flight=max_in_flight)
            bridge.run(stop, drain_timeout=drain_timeout)
            return
        except StoreUnavailable as exc:
            log.warning("Redis is unavailable (%s): left the group until it is back", exc)
            _wait_for_redis(state, stop)


def _wait_for_redis(state: State, stop: threading.Event) -> None:
    wait = REDIS_WAIT_S[0]
    while not stop.wait(wait):  # back-off between looks while Redis is away
        try:
            state.db.ping()
        except StoreUnavailable:
            wait = min(REDIS_WAIT_S[1], wait * 2)
            continue
        log.warning("Redis is back: joining the group again")
        return
