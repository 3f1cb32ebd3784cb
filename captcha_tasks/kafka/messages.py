"""The bridge's four Kafka message shapes, as pure functions (no Kafka client here).

``captcha-tasks`` (key: ``task_id``)::

    {"task_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "method": "turnstile",
     "sitekey": "0x4AAA...", "pageurl": "https://example.com/login", ...extra solve parameters,
     "tenant": "crawler", "lane": "bulk"}

``tenant`` (default ``default``) and ``lane`` (default ``bulk``) are optional.

``captcha-results`` (key: ``task_id``): the outcome dict of :mod:`captcha_tasks.core.outcome`
plus ``task_id``::

    {"status": "solved", "token": "...", ..., "task_id": "1b4e28ba-..."}

``captcha-dead-letter`` (key: the original message's key; headers ``reason`` and ``error``)::

    {"reason": "not valid JSON: ...", "error": "ERROR_BAD_MESSAGE", "task_id": null,
     "original": "<base64 of the original value>", "task": null, "outcome": null,
     "source": {"topic": "captcha-tasks", "partition": 3, "offset": 1207},
     "dead_at": "2026-11-30T14:20:31.120Z"}

``captcha-feedback`` (key: ``task_id``, or ``captcha_id``): a report on a solved token, for
the provider that solved it and the site's acceptance, as ``report()`` sends it::

    {"task_id": "1b4e28ba-...", "good": false}
    {"captcha_id": "7000001", "provider": "captchaai", "method": "userrecaptcha",
     "site": "example.com#6Le...", "good": true, "score": 0.3}

It names its result by ``task_id`` (the bridge reads the result it published, kept for
``KAFKA_RESULT_TTL``) or by the result's own fields (``captcha_id`` with ``provider``,
``method`` and ``site``: what ``report()`` reads from a result); ``score`` is the
reCAPTCHA v3 score the site returned (0 to 1).  One the bridge cannot record goes to
``captcha-dead-letter``, with its ``source`` on the feedback topic.

``task`` is the decoded task when there was one and ``outcome`` the failed outcome that
was also published on ``captcha-results``.  Replaying is producing ``original`` (decoded)
to ``captcha-tasks`` again.

``task_id`` must be unique per task across every producer of the topic (a UUID is a good
choice): the bridge answers a redelivered task from Redis by it, so two different tasks
with one id would get one answer.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import Any

from ..core.outcome import iso
from ..errors import BadMessage

#: Longest accepted ``task_id`` (it is part of a Redis key and the Kafka message key).
TASK_ID_MAX = 200


@dataclass(frozen=True)
class TaskMessage:
    """A decoded task: its id and the keyword arguments for ``solve`` (not yet validated)."""

    task_id: str
    fields: dict[str, Any]

    @property
    def method(self) -> str | None:
        method = self.fields.get("method")
        return method if isinstance(method, str) else None


@dataclass(frozen=True)
class Source:
    """Where a consumed message came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``source`` field of a dead letter."""
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}


@dataclass(frozen=True)
class Feedback:
    """A decoded feedback message: the result it is about (``task_id``, or the result's
    own fields) and what the site said."""

    good: bool
    task_id: str | None = None
    #: The result's fields ``report()`` reads (captcha_id, provider, method, site).
    result: dict[str, str] | None = None
    score: float | None = None


#: The result fields a feedback message may carry, as report() reads them from a result.
FEEDBACK_RESULT_FIELDS = ("captcha_id", "provider", "method", "site")
FEEDBACK_FIELDS = frozenset({"task_id", "good", "score", *FEEDBACK_RESULT_FIELDS})


def check_task_id(task_id: object) -> str:
    """The task id if it is usable, else :class:`BadMessage` naming what is wrong."""
    if not isinstance(task_id, str) or not task_id.strip():
        raise BadMessage("task_id is missing or not a non-empty string")
    if len(task_id) > TASK_ID_MAX:
        raise BadMessage(f"task_id is longer than {TASK_ID_MAX} characters")
    return task_id


def parse_task(value: bytes | None) -> TaskMessage:
    """Decode a ``captcha-tasks`` message; raises :class:`BadMessage` when it has no answer
    address.  The solve fields are checked later, by ``solve``'s own validation."""
    data = _object(value)
    task_id = check_task_id(data.pop("task_id", None))
    return TaskMessage(task_id, data)


def _object(value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise BadMessage("empty message (no value)")
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadMessage(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadMessage(f"expected a JSON object, got {type(data).__name__}")
    return data


def parse_feedback(value: bytes | None) -> Feedback:
    """Decode a ``captcha-feedback`` message; raises :class:`BadMessage` naming what is
    wrong (the checks of ``kafka-feedback.schema.json``)."""
    data = _object(value)
    unknown = sorted(set(data) - FEEDBACK_FIELDS)
    if unknown:
        raise BadMessage(f"unknown field(s): {', '.join(unknown)}")
    good = data.get("good")
    if not isinstance(good, bool):
        raise BadMessage("good is missing or not true/false")
    task_id = check_task_id(data["task_id"]) if "task_id" in data else None
    result = _result_fields(data)
    if task_id is None and result is None:
        raise BadMessage("names no result: give its task_id or its captcha_id")
    return Feedback(good, task_id, result, check_score(data.get("score")))


def _result_fields(data: dict[str, Any]) -> dict[str, str] | None:
    for name in FEEDBACK_RESULT_FIELDS:
        if name in data and (not isinstance(data[name], str) or not data[name].strip()):
            raise BadMessage(f"{name} is not a non-empty string")
    if "captcha_id" not in data:
        named = [name for name in FEEDBACK_RESULT_FIELDS if name in data]
        if named:
            raise BadMessage(f"{', '.join(named)} without the captcha_id they go with")
        return None
    return {name: data[name] for name in FEEDBACK_RESULT_FIELDS if name in data}


def check_score(score: object) -> float | None:
    """A v3 score if it is one (a number from 0 to 1), else :class:`BadMessage`."""
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise BadMessage(f"score must be a number from 0 to 1, got {score!r}")
    return float(score)


def feedback_value(feedback: Feedback) -> bytes:
    """The ``captcha-feedback`` message value for a report."""
    data: dict[str, Any] = {}
    if feedback.task_id is not None:
        data["task_id"] = check_task_id(feedback.task_id)
    data.update(feedback.result or {})
    data["good"] = feedback.good
    if feedback.score is not None:
        data["score"] = feedback.score
    value = encode(data)
    parse_feedback(value)  # what the bridge would refuse is refused here, before sending
    return value


def task_value(task_id: str, fields: dict[str, Any]) -> bytes:
    """The ``captcha-tasks`` message value for a task."""
    return encode({"task_id": check_task_id(task_id), **fields})


def result_value(task_id: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """The ``captcha-results`` message: the outcome dict plus ``task_id``."""
    return {**outcome, "task_id": task_id}


def dead_letter(
    reason: str,
    error: str,
    source: Source,
    original: bytes | None,
    *,
    task: TaskMessage | None = None,
    outcome: dict[str, Any] | None = None,
    task_id: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``captcha-dead-letter`` message for a message or task that could not be solved
    (or a feedback message that could not be recorded: its ``task_id``, if it named one)."""
    return {
        "reason": reason,
        "error": error,
        "task_id": task.task_id if task else task_id,
        "original": base64.b64encode(original or b"").decode("ascii"),
        "task": {"task_id": task.task_id, **task.fields} if task else None,
        "outcome": outcome,
        "source": source.to_dict(),
        "dead_at": iso(time.time() if now is None else now),
    }


Headers = list[tuple[str, str | bytes | None]]


def dead_letter_headers(letter: dict[str, Any]) -> Headers:
    """Headers that let a tool filter dead letters without decoding them."""
    return [("reason", str(letter["reason"]).encode()), ("error", str(letter["error"]).encode())]


def encode(data: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON, as every message of the bridge is written."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def decode(value: bytes | str) -> dict[str, Any]:
    """A JSON object written by :func:`encode`."""
    data = json.loads(value)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data
