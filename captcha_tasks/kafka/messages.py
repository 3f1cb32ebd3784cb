"""The bridge's three Kafka message shapes, as pure functions (no Kafka client here).

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
    if value is None:
        raise BadMessage("empty message (no value)")
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadMessage(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadMessage(f"expected a JSON object, got {type(data).__name__}")
    task_id = check_task_id(data.pop("task_id", None))
    return TaskMessage(task_id, data)


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
    now: float | None = None,
) -> dict[str, Any]:
    """The ``captcha-dead-letter`` message for a message or task that could not be solved."""
    return {
        "reason": reason,
        "error": error,
        "task_id": task.task_id if task else None,
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
