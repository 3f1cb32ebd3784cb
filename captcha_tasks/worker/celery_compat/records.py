"""A solve's result record in Celery's result backend, and what runs after the solve.

* **The record** is written by the completion's script, not by Celery: :func:`encode`
  builds it as the backend's ``store_result`` would (its key, its encoding, its fields),
  :func:`decode` and :func:`stored` read it as ``AsyncResult`` does.
* **What runs after a solve** (``link``, ``link_error``, the rest of a ``chain``, the
  ``chord`` it is a part of) would be run by Celery's tracer when the solve's task
  returns, long before the outcome exists.  So ``solve.apply_async`` takes it out of the
  options (:func:`take_followups`) and the solve's message carries it in its own
  arguments, where Celery does not look: Celery never sees a follow-up on a solve's request
  and nothing is run twice.  Its task ids are fixed there (``Signature.freeze``), so the
  record lists them as the solve's ``children``, as Celery lists a task's linked tasks.
  The completion runs them with the outcome (:func:`run_followup`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from celery import Celery, signature, states
from celery.app.task import Context
from celery.canvas import Signature, maybe_signature

from ...state.lua import text

#: ``apply_async`` options that say what runs after a task, and the names Celery gives
#: them on a task's request (and a follow-up keeps them under).
FOLLOWUP_OPTIONS = {
    "link": "callbacks",
    "link_error": "errbacks",
    "chain": "chain",
    "chord": "chord",
}
#: What of a solve's request a follow-up needs besides: its group (a chord part), where
#: it is in the group, and the canvas it belongs to.
REQUEST_FIELDS = ("group", "group_index", "root_id", "parent_id")


# -- the record -------------------------------------------------------------------------------


def key(backend: Any, task_id: str) -> str:
    """The backend's key (and pub/sub channel) of ``task_id``'s result."""
    # Celery: the key-value backends' get_key_for_task (celery-task-meta-<id>).
    return text(backend.get_key_for_task(task_id))


def encode(
    backend: Any, task_id: str, state: str, value: Any, children: list[Any] | None = None
) -> str:
    """The encoded record of ``task_id`` in ``state`` with ``value``, as the backend's
    ``store_result`` writes it; ``children``: the tasks it started, as Celery lists them
    (``AsyncResult.as_tuple()``)."""
    # Celery: the fields of BaseBackend._get_result_meta, the result encoded by
    # encode_result (an exception as the serializer carries it) and the whole by encode.
    meta: dict[str, Any] = {
        "status": state,
        "result": backend.encode_result(value, state),
        "traceback": None,
        "children": list(children or ()),
        "date_done": datetime.now(UTC).isoformat() if state in states.READY_STATES else None,
        "task_id": task_id,
    }
    return text(backend.encode(meta))


def decode(backend: Any, record: str | bytes) -> tuple[str, Any]:
    """A record's state and value (the outcome, the exception, in-flight information)."""
    # Celery: decode_result is what the backend's reads of a record go through.
    meta = backend.decode_result(record)
    return str(meta["status"]), meta.get("result")


def stored(backend: Any, task_id: str) -> tuple[str, Any]:
    """What ``task_id``'s record says now (``PENDING`` when there is none)."""
    meta = backend.get_task_meta(task_id)
    return str(meta["status"]), meta.get("result")


# -- what runs after a solve ------------------------------------------------------------------


def take_followups(options: dict[str, Any]) -> dict[str, Any] | None:
    """Take what runs after the task out of ``apply_async``'s ``options`` (None when
    nothing does), with the ids of the tasks it starts fixed and listed as ``children``."""
    # Celery: Task.apply_async puts these options in the message, and the worker's tracer
    # runs the callbacks and the chain's next task when the task returns, with its return
    # value; a chord part is counted by the backend's mark_as_done at that return.
    taken = {
        field: _listed(options.pop(option, None)) for option, field in FOLLOWUP_OPTIONS.items()
    }
    taken = {field: value for field, value in taken.items() if value}
    if not taken:
        return None
    if "chord" in taken:
        taken["chord"] = taken["chord"][0]
    started = []
    if "callbacks" in taken:
        started += [sig.freeze() for sig in taken["callbacks"]]
    if "chain" in taken:
        started.append(taken["chain"][-1].freeze())  # a chain's tasks have their ids already
    # Celery: AsyncResult.children reads the record's children as result tuples.
    taken["children"] = [result.as_tuple() for result in started]
    return taken


def _listed(value: Any) -> list[Any]:
    if not value:
        return []
    return [maybe_signature(v) for v in (value if isinstance(value, list | tuple) else [value])]


def routed(app: Celery, sig: Signature) -> dict[str, Any]:
    """Where ``app`` would send ``sig``'s task: its router's options (``queue`` a kombu
    ``Queue``, ``exchange``, ``routing_key``)."""
    # Celery: app.amqp.router.route is what send_task routes a task with (the app's
    # task_routes, then its default queue).
    return dict(app.amqp.router.route(dict(sig.options), sig.task, sig.args, sig.kwargs))


def followup_of(carried: Mapping[str, Any] | None, request: Any) -> dict[str, Any] | None:
    """What runs after a solve, as its worker keeps it: what its message ``carried``
    (:func:`take_followups`), and where the solve stands in its canvas."""
    if not carried:
        return None
    # Celery: a task request's group, group_index, root_id and parent_id (its headers).
    found = {name: getattr(request, name, None) for name in REQUEST_FIELDS}
    return {**{k: v for k, v in found.items() if v is not None}, **carried}


def run_followup(
    app: Celery, task_id: str, followup: Mapping[str, Any], state: str, value: Any
) -> None:
    """Run what follows ``task_id``'s end in ``state`` with ``value`` (the outcome dict, or
    the exception stored), as Celery's tracer and backend do at a task's end."""
    # Celery: the backend's mark_as_* with the task's request (a Context) is what the
    # tracer calls at a task's end: with store_result=False, mark_as_done and
    # mark_as_revoked count the task's chord part (on_chord_part_return, by the request's
    # group, group_index and chord); mark_as_failure stores the record again, fails the
    # chain's later tasks (_fail_chain) and calls the errbacks.
    fields = {k: v for k, v in followup.items() if k != "children"}
    request = Context(id=task_id, delivery_info={}, **fields)
    backend = app.backend
    if state == states.SUCCESS:
        backend.mark_as_done(task_id, value, request=request, store_result=False)
        _dispatch(app, task_id, followup, value)
    elif state == states.REVOKED:
        backend.mark_as_revoked(task_id, str(value), request=request, store_result=False)
    else:
        backend.mark_as_failure(task_id, value, request=request, call_errbacks=True)


def _dispatch(app: Celery, task_id: str, followup: Mapping[str, Any], value: Any) -> None:
    """The callbacks (``link``) and the next task of a chain, with the outcome, each under
    the task id the solve's record lists."""
    # add_to_parent=False: the task running this (a poll round) is not their parent.
    options = {
        "parent_id": task_id,
        "root_id": followup.get("root_id") or task_id,
        "add_to_parent": False,
    }
    for callback in followup.get("callbacks") or []:
        _signature(app, callback).apply_async((value,), **options)
    chain = followup.get("chain") or []
    if chain:
        _signature(app, chain[-1]).apply_async((value,), chain=chain[:-1], **options)


def _signature(app: Celery, value: Any) -> Signature:
    return signature(value, app=app)
