"""The adapter between the core's decisions and the outside world, split by concern.

:class:`Runner` is what the tasks (:mod:`.tasks`), housekeeping and the callback receiver
call.  It does the I/O a step needs (Redis, the API), asks the core
(:mod:`captcha_tasks.core`) what it means, and carries the decision out, through its
parts:

* :mod:`.admitting`: route a submit and admit it at a provider;
* :mod:`.submitting`: call ``in.php``, register the captcha, submit again, hold a captcha
  paid for while Redis is away;
* :mod:`.rounds`: poll rounds, and provider callbacks;
* :mod:`.health`: circuits, 429 holds, the callback channel, bulk support;
* :mod:`.stash`: the stashed proxy and cookies, the pooled proxies;
* :mod:`.edges`: what they all act through, and :class:`~.completion.Completer`, the one
  completion path every ending takes.

Everything it talks to is handed to it: the settings, the Redis state and the API client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery

from .. import errors, faults
from ..core import steps
from ..core.channel import Heard
from ..core.decisions import Decision, Deliver, Fail
from ..core.job import BatchRef, Job
from ..core.outcome import from_pool
from ..core.rounds import Entry, RoundDue
from ..methods import SolveRequest, build_request
from ..providers.inphp import ProviderAPI
from ..settings import Settings
from ..state import State
from . import names
from .admitting import Admitter
from .completion import Events, no_events
from .edges import OUTAGES, Edges, Message
from .health import Health
from .results import dumps
from .rounds import Rounds
from .stash import Stash
from .submitting import Submitter


class Runner:
    """Runs the steps of solves for one Celery app, in one process.

    ``api`` gives a provider's API client (called with the provider's name, None for the
    primary, when a step needs it: only workers hold the keys); ``events`` sends a task
    event when a monitor (Flower) listens.

    Once a solve is accepted, nothing ends it in silence: an outage of Redis or the broker
    (:data:`~.edges.OUTAGES`) propagates, and the task retries the step once it is back
    (every step is idempotent); any other exception ends the solve through the one
    completion path with :class:`~captcha_tasks.errors.InternalError`
    (:meth:`~.edges.Edges.fail_inside`).  The exception is the stretch from ``in.php``'s
    captcha id to the board holding it: there an outage is waited out in place, up to the
    solve's deadline (:meth:`~.submitting.Submitter.holding`).
    """

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        state: State,
        api: Callable[..., ProviderAPI],
        events: Events = no_events,
    ) -> None:
        self.edges = Edges(app, settings, state, api, events)
        self.app, self.settings, self.state, self.api = app, settings, state, api
        self.events = events
        self.policy = self.edges.policy
        self.completer = self.edges.completer
        self.results = self.edges.results
        self.health = Health(self.edges)
        self.stash = Stash(state)
        self.rounds = Rounds(self.edges, self.health, self.stash)
        admitter = Admitter(self.edges)
        self.submitter = Submitter(self.edges, self.health, self.stash, admitter, self.rounds)

    def fail_inside(self, job: Job, exc: BaseException, step: str) -> None:
        """End ``job``'s solve with :class:`~captcha_tasks.errors.InternalError` (see
        :meth:`~.edges.Edges.fail_inside`)."""
        self.edges.fail_inside(job, exc, step)

    def revoked(
        self,
        solve_id: str,
        method: Any,
        batch: BatchRef | None,
        expired: bool,
        route: tuple[Any, Any] = (None, None),
        followup: dict[str, Any] | None = None,
    ) -> None:
        """A solve message Celery discarded before it ran (revoked, or past its
        ``expires``): the solve ends revoked (its batch line, the message no longer
        awaited; counted in the ``route``'s lane and tenant), and what its caller chained
        to it hears so (``followup``: a chord counts it as a part)."""
        if followup:
            self._keep(solve_id, followup)
        job = Job.unusable(solve_id, method, time.time(), batch, *route)
        self.completer.complete(job, Fail(errors.Revoked("expired" if expired else "revoked")))

    def _keep(self, solve_id: str, followup: dict[str, Any]) -> None:
        # Until the solve ends (the completion takes it in its atomic step).
        self.state.followups.keep(solve_id, dumps(followup), self.state.board.config.record_ttl_s)

    # -- solve -------------------------------------------------------------------------
    def solve(
        self,
        message: Message,
        kwargs: dict[str, Any],
        followup: dict[str, Any] | None = None,
        expires: float | None = None,
    ) -> None:
        """A caller's solve: answer from a pool, or submit (or park) its captcha.
        ``followup``: what the caller chained to it (see :mod:`.results`); ``expires``:
        when it may no longer be submitted."""
        batch = BatchRef.from_dict(kwargs.pop("_batch", None))
        lane, tenant = kwargs.get("lane"), kwargs.get("tenant")
        job = Job.unusable(message.id, kwargs.get("method"), time.time(), batch, lane, tenant)
        try:
            self._solve(message, kwargs, batch, followup, expires)
        except OUTAGES:
            raise
        except Exception as exc:
            self.fail_inside(job, exc, "solve")

    def _solve(
        self,
        message: Message,
        kwargs: dict[str, Any],
        batch: BatchRef | None,
        followup: dict[str, Any] | None,
        expires: float | None,
    ) -> None:
        solve_id = message.id
        if followup:
            self._keep(solve_id, followup)
        stashed = kwargs.pop("_secrets", None) or []
        secrets = self.stash.stashed(solve_id, stashed)
        now = time.time()
        route = steps.Route.of(kwargs, batch is not None)
        try:
            route.check()
            request = build_request(**kwargs, **secrets)
        except errors.ValidationError as exc:  # skipped the call-site check
            job = Job.unusable(solve_id, kwargs.get("method"), now, batch, route.lane, route.tenant)
            self.completer.complete(job, Fail(exc))
            return
        job = Job.new(
            solve_id,
            request,
            now,
            self.policy.solve_timeout,
            batch=batch,
            expires=expires,
            lane=route.lane,
            tenant=route.tenant,
            asked=route.asked,
            children=tuple(followup.get("children") or ()) if followup else (),
        )
        faults.point("solve")
        if self._from_pool(job, request, now):
            return
        self.submitter.run(job.with_secrets(stashed), message, request)

    def _from_pool(self, job: Job, request: SolveRequest, started: float) -> bool:
        """Answer the solve from a token pool that fits it, when one has a token.  (A
        revoked solve, or one of a cancelled batch, is not asked about here: that is the
        admission's decision alone, see :mod:`.admitting`.)"""
        if request.per_request:
            return False
        pools = self.state.pools
        spec = pools.find(request)
        if spec is None:
            return False
        try:
            record = pools.take(spec.name)
        except errors.PoolNotFound:  # removed since this process last read the definitions
            return False
        self.app.send_task(names.PREWARM, args=(spec.name,), ignore_result=True)
        if record is None:
            return False
        now = time.time()
        outcome = from_pool({**record, "method": request.method}, now - started, now)
        self.completer.complete(job, Deliver(outcome), source="pool")
        return True

    # -- the parts, as the tasks, housekeeping and the receiver call them ---------------
    def submit(self, job: Job, message: Message) -> None:
        """A submit message: a parked solve given a thread, a retry, a resubmit."""
        self.submitter.submit(job, message)

    def act_on_submit(self, job: Job, decision: Decision) -> None:
        """Carry out a submit step's decision."""
        self.submitter.act(job, decision)

    def resend(self, job: Job, delay: float, unclaim: bool) -> None:
        """Submit ``job`` again, now or after ``delay`` seconds."""
        self.submitter.resend(job, delay, unclaim)

    def poll_round(self, round_at_ms: int | None, provider: str | None = None) -> None:
        """One poll round at ``provider`` (None: the primary)."""
        self.rounds.poll_round(round_at_ms, provider)

    def publish_round(self, due: RoundDue | None, provider: str | None = None) -> None:
        """Send the poll round message a provider's board asked for."""
        self.edges.publish_round(due, provider)

    def answer_callback(self, entry: Entry, job: Job, code: str) -> bool | None:
        """The provider called back with ``code`` for the captcha of ``entry``."""
        return self.rounds.answer_callback(entry, job, code)

    def heard(self, items: Sequence[Heard | None], provider: str | None) -> None:
        """Tell ``provider``'s callback channel how answers came."""
        self.health.heard(items, provider)
