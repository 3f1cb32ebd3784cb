"""The Celery tasks: thin shells over :class:`~.adapter.Runner`.

    solve(method, sitekey, pageurl, **params)   the caller's task; validated before queueing
      │ pool hit ─────────────────────────────────────────────► outcome on solve's id
      │ submit (in.php) ─► on the board ─► poll rounds ─────────► outcome on solve's id
      └ parked ─► a freed slot ─► submit(job) ─► (as above)

* ``solve`` answers from a pool or submits its captcha in the same task; a parked solve
  is resumed by a ``submit`` message when a thread frees.
* ``poll`` is a *round*: it asks for every captcha that is due (many per ``res.php?ids=``
  request), completes the finished ones and schedules the next round with a countdown.
  No task sleeps, and no task runs only to find that another one did its work.
* The outcome is stored on ``solve``'s task id by the completion path
  (:mod:`.completion`, in Celery's own record: :mod:`.results`), never by Celery's own
  result handling at the task's return: ``solve`` hands its message's end over (no
  result stored, no success event: :mod:`.celery_compat.messages`).  What the caller
  chained to it (``link``, ``link_error``, a chain, a chord) travels in the message's
  arguments, out of Celery's sight (:mod:`.celery_compat.records`), for the completion to
  run with the outcome.
* ``AsyncResult.revoke()`` and ``expires`` are honoured up to the moment of submission; a
  revoked solve already at the provider ends revoked, its answer discarded.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Task
from celery.signals import task_revoked

from .. import errors
from ..core.job import BatchRef, Job
from ..core.lanes import DEFAULT_TENANT, default_lane
from ..core.outcome import from_pool
from ..settings import Settings
from ..state.pools import PoolSpec
from . import housekeeping, names
from .adapter import Runner
from .app import App, app
from .callsite import normalize_solve_args, stash_secrets
from .canvas import route_followups
from .celery_compat.messages import OutageTask, hand_over
from .celery_compat.records import followup_of, take_followups
from .edges import OUTAGES, Message
from .redact import mask_params

log = logging.getLogger(__name__)

#: Task results are shown (worker log, Flower) cut at this many characters; outcome dicts
#: put the token last, so it is cut short or left out.
RESULT_REPR_MAX = 230


def runner(task: Task) -> Runner:
    """The runner of ``task``'s app in this process (see :meth:`~.app.App.runtime`)."""
    return task.app.runtime().runner  # type: ignore[no-any-return]


#: Every task of the package, as registered on each app: (function, options).
_OURS: list[tuple[Callable[..., Any], dict[str, Any]]] = []


def _ours(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``app.task(bind=True, shared=False, **options)``, kept for :func:`register_on`: each
    task works with the runtime of the app it runs on."""

    def register(fun: Callable[..., Any]) -> Any:
        _OURS.append((fun, {"bind": True, "shared": False, **options}))
        return app.task(bind=True, shared=False, **options)(fun)

    return register


def new_app(main: str, settings: Settings, **options: Any) -> App:
    """A second app of captcha-tasks in this process, with the package's tasks, working
    with ``settings``: its own broker, result backend, Redis keys and queues (a test, or
    an application that serves two deployments).  ``options`` go to Celery."""
    options.setdefault("set_as_current", False)
    other = App(main, settings=settings, **options)
    for fun, task_options in _OURS:
        other.task(**task_options)(fun)
    return other


class SolveTask(OutageTask):
    """``solve`` validates its arguments at the call site, before anything is queued."""

    resultrepr_maxsize = RESULT_REPR_MAX
    Request = "captcha_tasks.worker.celery_compat.messages:HandedOverRequest"

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        kwargs = dict(kwargs or {})
        batch = kwargs.pop("_batch", None)
        # A retry (after an outage) sends the message it ran again: what it carries
        # besides the request is kept as it was.
        asked = kwargs.pop("_asked", None)
        stashed = kwargs.pop("_secrets", None)
        carried = kwargs.pop("_followup", None)
        runtime = self.app.runtime()
        kwargs = normalize_solve_args(args or (), kwargs, runtime.settings)
        kwargs.setdefault("lane", default_lane(batch=batch is not None))
        kwargs.setdefault("tenant", DEFAULT_TENANT)
        # Flower and task events show this instead of the arguments: no proxy password,
        # no cookie values, no image body.
        options.setdefault("kwargsrepr", repr(mask_params(kwargs)))
        solve_id = options.setdefault("task_id", str(uuid.uuid4()))
        # Its wait for a thread counts from now (the metrics' wait_seconds).
        kwargs["_asked"] = asked if asked is not None else round(time.time(), 3)
        kwargs = stash_secrets(runtime.state, solve_id, kwargs)
        if stashed:
            kwargs["_secrets"] = stashed
        if batch is not None:
            kwargs["_batch"] = batch
        # What follows the solve is sent by a captcha worker: routed now, by the caller's app
        # (before Redis notes the message: a router that raises leaves nothing owed).
        route_followups(options, self.app)
        # ... and carried in the message's arguments, where Celery's tracer does not run it.
        followup = take_followups(options) or carried
        if followup:
            kwargs["_followup"] = followup
        runtime.state.pools.ensure_declared()  # this process's CAPTCHAAI_POOLS, before it solves
        # Until a worker starts it, the message is remembered in Redis: one lost between
        # the broker and a worker is sent again (captcha_tasks.worker.housekeeping).
        runtime.state.owed.expect(solve_id, json.dumps(kwargs, separators=(",", ":")))
        return super().apply_async((), kwargs, **options)


#: Longest wait between two tries of a step while Redis or the broker is away.
OUTAGE_BACKOFF_MAX_S = 10


@_ours(
    base=SolveTask,
    name=names.SOLVE,
    autoretry_for=OUTAGES,
    retry_backoff=True,
    retry_backoff_max=OUTAGE_BACKOFF_MAX_S,
    max_retries=None,
)
def solve(
    self: Task, method: str, sitekey: str | None = None, pageurl: str | None = None, **params: Any
) -> str:
    """Solve one captcha; its outcome dict (see :mod:`captcha_tasks.core.outcome`) is stored
    on this task's id when the solve ends (the message itself ends handed over)."""
    request = self.request
    followup = followup_of(params.pop("_followup", None), request)
    kwargs = {"method": method, "sitekey": sitekey, "pageurl": pageurl, **params}
    runner(self).solve(_message(self), kwargs, followup, _expires(request.expires))
    return hand_over(request)


def _expires(value: Any) -> float | None:
    """The ``expires`` of a task message as a Unix time (it carries ISO 8601)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value)).timestamp()


@task_revoked.connect
def _revoked(sender: Any = None, request: Any = None, expired: bool = False, **_: Any) -> None:
    # A solve message revoked (or expired) before it ran: Celery stored its REVOKED record
    # and counted its chord part; the solve's own bookkeeping ends here (its batch line,
    # the message no longer awaited).
    if getattr(sender, "name", None) != names.SOLVE or request is None:
        return
    kwargs = dict(getattr(request, "kwargs", None) or {})
    batch = BatchRef.from_dict(kwargs.get("_batch"))
    route = (kwargs.get("lane"), kwargs.get("tenant"))
    followup = followup_of(kwargs.get("_followup"), request)
    runner(sender).revoked(str(request.id), kwargs.get("method"), batch, expired, route, followup)


@_ours(
    base=OutageTask,
    name=names.SUBMIT,
    ignore_result=True,
    autoretry_for=OUTAGES,
    retry_backoff=True,
    retry_backoff_max=OUTAGE_BACKOFF_MAX_S,
    max_retries=None,
)
def submit(self: Task, job: dict[str, Any]) -> None:
    """Submit a solve's captcha: a parked solve given a thread, a retry, a resubmit."""
    runner(self).submit(Job.from_dict(job), _message(self))


@_ours(name=names.POLL, ignore_result=True)
def poll(self: Task, round_at_ms: int | None = None, provider: str | None = None) -> None:
    """One poll round at ``provider`` (None: the primary); it schedules the next while
    captchas are at the provider."""
    runner(self).poll_round(round_at_ms, provider)


def _message(task: Task) -> Message:
    # A retry (after an outage) is the same message again: its own claim is its own.
    request = task.request
    delivery = request.delivery_info or {}
    return Message(request.id, bool(delivery.get("redelivered")) or bool(request.retries))


@_ours(name=names.REPORT)
def report_task(
    self: Task,
    captcha_id: str,
    good: bool,
    provider: str | None = None,
    method: str | None = None,
    site: str | None = None,
    score: float | None = None,
) -> None:
    """Send ``reportgood`` / ``reportbad`` (or the JSON family's report of the captcha's
    ``method``) for a solved captcha to the provider that solved it (None: the primary),
    and count the report for the site's acceptance of that provider's tokens (when the
    result named its ``method`` and ``site``)."""
    runtime = self.app.runtime()
    if method and site:
        solver = _configured(runtime.settings, provider)
        if solver is not None:
            runtime.state.acceptance.report(solver, method, site, good, score)
    runtime.api(provider).report(captcha_id, good=good, method=method)


def _configured(settings: Settings, provider: str | None) -> str | None:
    try:
        return settings.providers.named(provider).name
    except KeyError:  # no longer configured: its counts would route nothing
        return None


def report(result: dict[str, Any], *, good: bool, score: float | None = None) -> Any:
    """Flag a solved token as accepted (``good=True``) or rejected by the target site, at
    the provider that solved it (the result's ``provider``).  The report also counts for
    the site's acceptance of that provider's tokens, which routes the site's next
    captchas (``CAPTCHAAI_ACCEPTANCE_MIN``); for reCAPTCHA v3, pass the ``score`` the site
    returned (0 to 1).

    Runs on a worker (which holds the API keys); returns the task's ``AsyncResult``.
    """
    captcha_id = result.get("captcha_id")
    if not captcha_id:
        raise errors.ValidationError("report() needs a solve result with a captcha_id")
    provider = result.get("provider")
    if provider is not None:
        known = [p.name for p in app.runtime().settings.providers.all]
        if provider not in known:
            raise errors.ValidationError(
                f"report(): the result names provider {provider!r}, which is not configured"
                f" (configured: {', '.join(known)})"
            )
    checked = _score(score)
    method, site = result.get("method"), result.get("site")
    method = method if isinstance(method, str) else None
    site = site if isinstance(site, str) else None
    return report_task.delay(str(captcha_id), bool(good), provider, method, site, checked)


def _score(score: Any) -> float | None:
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise errors.ValidationError(f"report(): score must be a number from 0 to 1, got {score!r}")
    return float(score)


@_ours(name=names.PREWARM)
def prewarm(self: Task, pool: str | None = None) -> dict[str, int]:
    """Beat's tick (and every take): top pools up.  Returns the refills started per pool."""
    run = runner(self)
    housekeeping.tick(run)
    pools = run.state.pools
    specs = [pools.get(pool)] if pool else pools.all()
    return {spec.name: housekeeping.top_up(run, spec) for spec in specs}


@_ours(name=names.CHECK_THREADS, ignore_result=True)
def check_threads(self: Task) -> dict[str, Any]:
    """Housekeeping: every provider's balance and view of our threads (see
    ``housekeeping.check_providers``)."""
    return housekeeping.check_providers(runner(self))


@_ours(name=names.PROBE, ignore_result=True)
def probe(self: Task, provider: str) -> bool | None:
    """Housekeeping: probe a provider out of rotation (see ``housekeeping.probe``)."""
    return housekeeping.probe(runner(self), provider)


def create_pool(
    name: str,
    method: str,
    sitekey: str,
    pageurl: str,
    *,
    size: int,
    ttl: float,
    min_remaining: float = 0.0,
    **params: Any,
) -> PoolSpec:
    """Declare a token pool from Python; it is registered in Redis for beat and workers."""
    spec = PoolSpec.from_dict(
        {
            "name": name,
            "method": method,
            "sitekey": sitekey,
            "pageurl": pageurl,
            "size": size,
            "ttl": ttl,
            "min_remaining": min_remaining,
            **params,
        }
    )
    app.runtime().state.pools.register(spec)
    return spec


def take_token(pool: str, min_remaining: float | None = None) -> dict[str, Any] | None:
    """Take one pooled token directly (no worker hop), or None when the pool is empty.

    The token comes in the outcome's shape (``source`` is ``"pool"``, ``expires_at`` what
    is left of its life), with ``remaining_s``: its seconds of life left.  Raises
    :class:`~captcha_tasks.state.pools.PoolNotFound` for an undeclared pool.
    """
    started = time.monotonic()
    record = app.runtime().state.pools.take(pool, min_remaining)
    # Nobody reads this refill's result: storing it would keep a record for an hour.
    prewarm.apply_async((pool,), ignore_result=True)
    if record is None:
        return None
    outcome = from_pool(record, time.monotonic() - started, time.time()).to_dict()
    token = outcome.pop("token")  # the token last, as in every outcome
    return {**outcome, "remaining_s": record["remaining_s"], "token": token}
