"""What a caller chains to a solve goes where the caller's app would send it.

A solve ends on a captcha worker, and that worker sends what was chained to it (the next
task of a ``chain``, a ``link``, a ``link_error``, a ``chord``'s body).  Celery routes a
task when it is sent, with the sending app's routes: the captcha worker's app knows
nothing of the caller's tasks and would send ``myapp.use_token`` to its own default queue,
where no worker knows it (``Received unregistered task``).

So the caller's process routes each follow-up when the solve is applied
(:func:`route_followups`, from ``solve.apply_async``): with the app the signature's task
belongs to (its ``task_routes``, its default queue), and freezes the queue, exchange and
routing key into the signature's options, where every later sender keeps them.  A
follow-up the caller routed itself (``.set(queue=...)``) and the package's own tasks are
left as they are.  Public Celery API is used (``Signature.app``, ``Signature.set``), and
the app's router through the Celery boundary (:func:`.celery_compat.records.routed`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.canvas import Signature, maybe_signature

from .celery_compat.records import routed

#: Options that say where a task goes: a signature with one of them is routed already.
ROUTED_BY = ("queue", "exchange", "routing_key")
#: The names of the package's own tasks begin so (a shared task is in every app's
#: registry, so being registered in ours says nothing).
OUR_TASKS = "captcha_tasks."


def route_followups(options: dict[str, Any], ours: Celery) -> None:
    """Freeze the route of each follow-up in ``options`` (``apply_async``'s: ``link``,
    ``link_error``, ``chain``, ``chord``) that is not a task of ``ours``, as its own app
    routes it."""
    route = _router(ours)
    for name in ("link", "link_error"):
        value = options.get(name)
        if value:
            listed = value if isinstance(value, list | tuple) else [value]
            options[name] = [route(sig) for sig in listed]
    if options.get("chain"):
        options["chain"] = [route(sig) for sig in options["chain"]]
    if options.get("chord"):
        options["chord"] = route(options["chord"])


def _router(ours: Celery) -> Callable[[Any], Any]:
    def route(value: Any) -> Any:
        sig = maybe_signature(value)
        if not isinstance(sig, Signature):
            return value
        kwargs = sig.kwargs
        if sig.task in ("celery.group", "celery.chain"):
            # a group's or a chain's tasks, each routed (copies of dicts: written back)
            kwargs["tasks"] = [route(part) for part in kwargs.get("tasks") or ()]
        elif sig.task == "celery.chord":
            kwargs["header"] = route(kwargs.get("header"))
            kwargs["body"] = route(kwargs.get("body"))
        else:
            _freeze_route(sig, ours)
        return sig

    return route


def _freeze_route(sig: Signature, ours: Celery) -> None:
    if any(sig.options.get(name) for name in ROUTED_BY):
        return  # the caller chose where it goes
    owner = sig.app  # the app the task was declared on (else the caller's current app)
    if owner is ours or sig.task.startswith(OUR_TASKS):
        return  # ours: our workers route it with the deployment's settings
    found = routed(owner, sig)
    queue = found.get("queue")
    if queue is None:
        return
    exchange = found.get("exchange") or queue.exchange
    exchange_name = getattr(exchange, "name", exchange)
    sig.set(
        queue=queue.name,
        exchange=exchange_name or "",
        routing_key=found.get("routing_key") or queue.routing_key or queue.name,
    )
