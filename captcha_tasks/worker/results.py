"""The Celery contract of a solve: how its outcome reaches Celery's result backend, how it
is read back, and what runs after it (the backend's formats and Celery's follow-up
machinery are :mod:`.celery_compat.records`'s).

* **The record.**  A solve's outcome is stored under ``solve``'s task id, in the Redis
  result backend's own key, encoding and channel (:meth:`Results.record`), by the one
  completion script: ``AsyncResult.get()``, ``GroupResult``, chords and Flower read it as if
  Celery had written it, ``AsyncResult.children`` lists the tasks linked to it.  While the
  solve is in flight the same key says where it is, in Celery's custom states
  (:data:`PARKED`, :data:`SUBMITTED` with its captcha id), so ``AsyncResult.state`` and
  ``.info`` say more than ``PENDING``.
* **The readers.**  :meth:`Results.read` decodes a record as ``get()`` does (the asyncio API
  and the Kafka bridge use it); only a ready state (``SUCCESS``, ``FAILURE``, ``REVOKED``)
  ends a wait.
* **What runs after.**  ``solve`` returns long before its outcome exists, so what the caller
  chained to it travels in its message's arguments, not where Celery's tracer would run
  it (``solve.apply_async``: :func:`~.celery_compat.records.take_followups`).  The solve
  keeps it in Redis for the completion, which runs it with the outcome
  (:func:`~.celery_compat.records.run_followup`): ``link`` and the next task of a
  ``chain`` receive the outcome dict, ``link_error`` and a failed chain get the typed
  error, a chord counts the solve as one of its parts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery, states
from celery.exceptions import TaskRevokedError

from .. import errors
from ..core.outcome import Failed
from .celery_compat import records

#: Custom in-flight states: waiting for a thread; at the provider (``info["captcha_id"]``).
PARKED = "PARKED"
SUBMITTED = "SUBMITTED"
#: The states that end a wait (Celery's ready states).
READY = states.READY_STATES
DEFAULT_TTL_S = 86400


@dataclass(frozen=True)
class StoredRecord:
    """A decoded record: its state, and the outcome (``SUCCESS``), the exception
    (``FAILURE``, ``REVOKED``) or the in-flight information."""

    state: str
    value: Any

    @property
    def ready(self) -> bool:
        return self.state in READY

    def outcome(self) -> dict[str, Any]:
        """The outcome dict, or the error raised: what ``AsyncResult.get()`` does."""
        if self.state == states.SUCCESS:
            return dict(self.value)
        if isinstance(self.value, BaseException):
            raise self.value
        raise errors.InternalError(f"the solve ended in state {self.state} without an outcome")

    def outcome_dict(self, method: str | None = None, elapsed_s: float | None = None) -> Any:
        """The outcome as a dict, failures included (batch lines, Kafka results)."""
        if self.state == states.SUCCESS:
            return dict(self.value)
        error = self.value
        if isinstance(error, TaskRevokedError):
            error = errors.Revoked(str(error) or "revoked")
        if not isinstance(error, errors.CaptchaTasksError):
            name = type(error).__name__
            error = errors.InternalError(f"the solve ended in state {self.state} ({name})")
        return Failed.from_exception(error, method, elapsed_s).to_dict()


class Results:
    """The result records of one Celery app (its Redis result backend)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.backend = app.backend

    @property
    def ttl_s(self) -> int:
        return int(self.backend.expires or DEFAULT_TTL_S)

    def key(self, task_id: str) -> str:
        """The backend's key (and pub/sub channel) of ``task_id``'s result."""
        return records.key(self.backend, task_id)

    def record(
        self, task_id: str, state: str, value: Any, children: list[Any] | None = None
    ) -> str:
        """The encoded record of ``task_id`` in ``state`` with ``value`` (an outcome dict,
        an exception, or in-flight information), as the backend's ``store_result`` writes
        it; ``children``: the tasks linked to it, as ``AsyncResult.children`` lists them."""
        return records.encode(self.backend, task_id, state, value, children)

    def ending(self, error: BaseException) -> tuple[str, BaseException]:
        """The state and stored exception of a solve that ended with ``error``: a revoked
        solve is Celery's ``REVOKED`` with ``TaskRevokedError``, as for any task."""
        if isinstance(error, errors.Revoked):
            return states.REVOKED, TaskRevokedError(error.message or "revoked")
        return states.FAILURE, error

    def read(self, record: str | bytes) -> StoredRecord:
        return StoredRecord(*records.decode(self.backend, record))

    def stored(self, task_id: str) -> StoredRecord:
        """What ``task_id``'s record says now (``PENDING`` when there is none)."""
        return StoredRecord(*records.stored(self.backend, task_id))


def dumps(followup: Mapping[str, Any]) -> str:
    return json.dumps(followup, separators=(",", ":"))
