"""The Celery contract of a solve, in one module: how its outcome reaches Celery's result
backend, how it is read back, and what runs after it.

* **The record.**  A solve's outcome is stored under ``solve``'s task id, in the Redis
  result backend's own key, encoding and channel (:meth:`Results.record`), by the one
  completion script: ``AsyncResult.get()``, ``GroupResult``, chords and Flower read it as if
  Celery had written it.  While the solve is in flight the same key says where it is, in
  Celery's custom states (:data:`PARKED`, :data:`SUBMITTED` with its captcha id), so
  ``AsyncResult.state`` and ``.info`` say more than ``PENDING``.
* **The readers.**  :meth:`Results.read` decodes a record as ``get()`` does (the asyncio API
  and the Kafka bridge use it); only a ready state (``SUCCESS``, ``FAILURE``, ``REVOKED``)
  ends a wait.
* **What runs after.**  ``solve`` returns long before its outcome exists, so Celery's own
  handling of a task's callbacks, chain and chord part (at the task's return) would hand
  them ``None``.  The solve reads them off its request instead (:func:`followup_of`), keeps
  them in Redis for the completion (its message ends handed over: ``tasks.hand_over``), which runs
  them with the outcome
  (:func:`run_followup`): ``link`` and the next task of a ``chain`` receive the outcome
  dict, ``link_error`` and a failed chain get the typed error, a chord counts the solve as
  one of its parts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import Celery, group, signature, states
from celery.app.task import Context
from celery.exceptions import TaskRevokedError

from .. import errors
from ..core.outcome import Failed
from ..state.lua import text

#: Custom in-flight states: waiting for a thread; at the provider (``info["captcha_id"]``).
PARKED = "PARKED"
SUBMITTED = "SUBMITTED"
#: The states that end a wait (Celery's ready states).
READY = states.READY_STATES
DEFAULT_TTL_S = 86400
#: The parts of a task request that say what runs after it.
FOLLOWUP_FIELDS = ("callbacks", "errbacks", "chain", "chord", "group", "group_index")


@dataclass(frozen=True)
class Read:
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
        return text(self.backend.get_key_for_task(task_id))

    def record(
        self,
        task_id: str,
        state: str,
        value: Any,
        followup: Mapping[str, Any] | None = None,
    ) -> str:
        """The encoded record of ``task_id`` in ``state`` with ``value`` (an outcome dict,
        an exception, or in-flight information), as the backend's ``store_result`` writes
        it."""
        ready = state in READY
        meta: dict[str, Any] = {
            "status": state,
            "result": self.backend.encode_result(value, state),
            "traceback": None,
            "children": [],
            "date_done": datetime.now(UTC).isoformat() if ready else None,
            "task_id": task_id,
        }
        if followup and followup.get("group"):
            meta["group_id"] = followup["group"]
        if followup and followup.get("parent_id"):
            meta["parent_id"] = followup["parent_id"]
        return text(self.backend.encode(meta))

    def ending(self, error: BaseException) -> tuple[str, BaseException]:
        """The state and stored exception of a solve that ended with ``error``: a revoked
        solve is Celery's ``REVOKED`` with ``TaskRevokedError``, as for any task."""
        if isinstance(error, errors.Revoked):
            return states.REVOKED, TaskRevokedError(error.message or "revoked")
        return states.FAILURE, error

    def read(self, record: str | bytes) -> Read:
        meta = self.backend.decode_result(record)
        return Read(str(meta["status"]), meta.get("result"))

    def stored(self, task_id: str) -> Read:
        """What ``task_id``'s record says now (``PENDING`` when there is none)."""
        meta = self.backend.get_task_meta(task_id)
        return Read(str(meta["status"]), meta.get("result"))


# -- what runs after a solve ------------------------------------------------------------------


def followup_of(request: Any) -> dict[str, Any] | None:
    """What Celery would run after ``request``'s task (its callbacks, chain, chord part);
    None when there is nothing."""
    found = {name: getattr(request, name, None) for name in FOLLOWUP_FIELDS}
    if not any(found.get(name) for name in ("callbacks", "errbacks", "chain", "chord", "group")):
        return None
    found.update(root_id=getattr(request, "root_id", None))
    found.update(parent_id=getattr(request, "parent_id", None))
    return {k: v for k, v in found.items() if v is not None}


def dumps(followup: Mapping[str, Any]) -> str:
    return json.dumps(followup, separators=(",", ":"))


def run_followup(
    app: Celery, task_id: str, followup: Mapping[str, Any], state: str, value: Any
) -> None:
    """Run what follows ``task_id``'s end in ``state`` with ``value`` (the outcome dict, or
    the exception stored), as Celery's tracer and backend do at a task's end."""
    request = Context(id=task_id, delivery_info={}, **followup)
    backend = app.backend
    if state == states.SUCCESS:
        backend.mark_as_done(task_id, value, request=request, store_result=False)
        _dispatch(app, task_id, followup, value)
    elif state == states.REVOKED:
        backend.mark_as_revoked(task_id, str(value), request=request, store_result=False)
    else:
        # Stores the solve's record again (the same content) so that a failed chain's
        # later tasks are marked failed too, then runs the errbacks.
        backend.mark_as_failure(task_id, value, request=request, call_errbacks=True)


def _dispatch(app: Celery, task_id: str, followup: Mapping[str, Any], value: Any) -> None:
    """The callbacks (``link``) and the next task of a chain, with the outcome."""
    options = {"parent_id": task_id, "root_id": followup.get("root_id") or task_id}
    callbacks = followup.get("callbacks") or []
    if len(callbacks) == 1:
        signature(callbacks[0], app=app).apply_async((value,), **options)
    elif callbacks:
        group([signature(c, app=app) for c in callbacks], app=app).apply_async((value,), **options)
    chain = followup.get("chain") or []
    if chain:
        signature(chain[-1], app=app).apply_async((value,), chain=chain[:-1], **options)
