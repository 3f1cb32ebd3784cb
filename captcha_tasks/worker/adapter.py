"""The one adapter between step decisions and the outside world.

:class:`Runner` does the I/O a step needs (Redis, the API), asks :mod:`.steps` what it
means, and carries the decision out: Celery messages for submits and poll rounds,
board scripts for polls, and :class:`~.completion.Completer` for every ending.  The tasks
in :mod:`.tasks` are one line each on top of it.  Everything it talks to is handed to it:
the settings, the Redis state and the API client.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from celery import Celery
from kombu.exceptions import OperationalError

from .. import errors, faults, pingback
from ..client import NOT_READY, Answer, CaptchaAIClient, NotReady, callback_answer
from ..connections import UNREACHABLE
from ..methods import SolveRequest, build_request, default_wait
from ..outcome import Solved, parse_iso
from ..settings import Settings
from ..state import State
from ..state.board import Again, Entry, RoundDue
from ..state.channel import DEGRADED, DOWN, UP, Channel, Heard
from ..state.limiter import Admission
from ..state.proxies import split
from ..state.timing import Timing
from . import names, steps
from .completion import Completer, Done, Events, no_events
from .job import BatchRef, Job
from .results import PARKED, SUBMITTED, dumps
from .steps import (
    Decision,
    Deliver,
    Fail,
    Policy,
    PollAt,
    Reply,
    Resubmit,
    Stop,
    Submit,
    SubmitAt,
)

log = logging.getLogger(__name__)

#: Most captchas one poll round takes (one bulk request answers 100).
ROUND_MOST = 500
BULK_IDS = 100
#: Concurrent single-id ``res.php`` requests of one round.
SINGLE_POLLS = 8
#: Seconds a process trusts what it last read about the API's bulk support.
BULK_CHECK_S = 5.0
#: An outage of Redis or the broker: not the end of a solve; its step is retried later.
OUTAGES = (errors.StoreUnavailable, OperationalError, *UNREACHABLE)
#: The attribute naming the step an exception was raised in (see :func:`at_step`).
STEP_ATTRIBUTE = "captcha_tasks_step"
#: Seconds between tries, from the first doubling to the last, while a captcha paid for
#: waits for Redis to take it (see :meth:`Runner.holding`).
HOLD_WAIT_S = (0.2, 1.0)

T = TypeVar("T")


@contextlib.contextmanager
def at_step(name: str) -> Iterator[None]:
    """Name the step in which an exception (no outage) is raised, for its error."""
    try:
        yield
    except OUTAGES:
        raise
    except Exception as exc:
        if not hasattr(exc, STEP_ATTRIBUTE):
            setattr(exc, STEP_ATTRIBUTE, name)
        raise


def policy(settings: Settings) -> Policy:
    return Policy(
        solve_timeout=settings.solve_timeout,
        poll_interval=settings.poll_interval,
        bulk_interval=settings.bulk_window_s,
        transport_retries=settings.transport_retries,
        max_resubmits=settings.max_resubmits,
        token_lifetimes=dict(settings.token_lifetimes),
        pingback_fallback=settings.pingback_fallback_poll if settings.pingback else None,
        overflow_after=settings.overflow_after,
    )


@dataclass(frozen=True)
class Message:
    """The task message a step runs for: its id, and whether the broker delivered it again
    because the worker that had it died."""

    id: str
    redelivered: bool = False


class Runner:
    """Runs the steps of solves for one Celery app, in one process.

    ``api`` gives a provider's API client (called with the provider's name, None for the
    primary, when a step needs it: only workers hold the keys); ``events`` sends a task
    event when a monitor (Flower) listens.

    Once a solve is accepted, nothing ends it in silence: an outage of Redis or the broker
    (:data:`OUTAGES`) propagates, and the task retries the step once it is back (every
    step is idempotent); any other exception ends the solve through the one completion
    path with :class:`~captcha_tasks.errors.InternalError` (:meth:`fail_inside`).  The
    exception is the stretch from ``in.php``'s captcha id to the board holding it: there
    an outage is waited out in place (:meth:`holding`).
    """

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        state: State,
        api: Callable[..., CaptchaAIClient],
        events: Events = no_events,
    ) -> None:
        self.app = app
        self.settings = settings
        self.state = state
        self.api = api
        self.events = events
        self.policy = policy(settings)
        self.completer = Completer(app, settings, state, events)
        self.results = self.completer.results
        self._executor: ThreadPoolExecutor | None = None
        self._bulk_checked: dict[str, tuple[float, bool]] = {}
        #: Providers this process saw a request fail at since their last success.
        self._failing: set[str] = set()

    def fail_inside(self, job: Job, exc: BaseException, step: str) -> None:
        """End ``job``'s solve with :class:`~captcha_tasks.errors.InternalError`: ``exc`` (no
        outage) was raised while ``step`` worked it.  The error names the exception's type,
        never its message (which could carry a proxy password)."""
        step = getattr(exc, STEP_ATTRIBUTE, step)
        log.error(
            "solve %s: %s in %s; it ends with ERROR_INTERNAL",
            job.solve_id,
            type(exc).__name__,
            step,
            exc_info=exc,
        )
        error = errors.InternalError(f"{type(exc).__name__} in {step}", captcha_id=job.captcha_id)
        self.completer.complete(job, Fail(error))

    def revoked(
        self,
        solve_id: str,
        method: Any,
        batch: BatchRef | None,
        expired: bool,
        route: tuple[Any, Any] = (None, None),
    ) -> None:
        """A solve message Celery discarded before it ran (revoked, or past its
        ``expires``): the solve ends revoked (its batch line, the message no longer
        awaited; counted in the ``route``'s lane and tenant)."""
        job = Job.unusable(solve_id, method, time.time(), batch, *route)
        self.completer.complete(job, Fail(errors.Revoked("expired" if expired else "revoked")))

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
            ttl = self.state.board.config.record_ttl_s
            self.state.followups.keep(solve_id, dumps(followup), ttl)
        stashed = kwargs.pop("_secrets", None) or []
        secrets = self._stashed(solve_id, stashed)
        now = time.time()
        route = steps.Route.of(kwargs, batch is not None)
        try:
            route.check()
            request = build_request(**kwargs, **secrets)
        except errors.ValidationError as exc:  # skipped the call-site check
            job = Job.unusable(solve_id, kwargs.get("method"), now, batch, route.lane, route.tenant)
            self.completer.complete(job, Fail(exc))
            return
        timeout = self.policy.solve_timeout
        job = Job.new(
            solve_id,
            request,
            now,
            timeout,
            batch=batch,
            expires=expires,
            lane=route.lane,
            tenant=route.tenant,
            asked=route.asked,
        )
        faults.point("solve")
        if self._from_pool(job, request, now):
            return
        self._submit(job.with_secrets(stashed), message, request)

    def _from_pool(self, job: Job, request: SolveRequest, started: float) -> bool:
        if request.per_request:
            return False
        pools = self.state.pools
        spec = pools.find(request)
        if spec is None or self._cancelled(job):
            return False
        try:
            record = pools.take(spec.name)
        except errors.PoolNotFound:  # removed since this process last read the definitions
            return False
        self.app.send_task(names.PREWARM, args=(spec.name,))
        if record is None:
            return False
        now = time.time()
        outcome = Solved(
            token=record["token"],
            captcha_id=str(record["captcha_id"]),
            method=request.method,
            source="pool",
            elapsed_s=round(now - started, 3),
            solved_at=parse_iso(record["solved_at"]),
            expires_at=now + float(record["remaining_s"]),
            user_agent=record.get("user_agent"),
            provider=record.get("provider"),
        )
        self.completer.complete(job, Deliver(outcome), source="pool")
        return True

    # -- submit ------------------------------------------------------------------------
    def submit(self, job: Job, message: Message) -> None:
        """A submit message: a parked solve given a thread, a retry, a resubmit."""
        try:
            self._submit(job, message)
        except OUTAGES:
            raise
        except Exception as exc:
            self.fail_inside(job, exc, "submit")

    def _submit(self, job: Job, message: Message, request: SolveRequest | None = None) -> None:
        """Admit the job's submit (for task ``message``) at the provider it goes to, and
        call ``in.php`` there when it holds a slot.  ``request``: the job's full request
        (with its stashed proxy and cookies), when the caller has it at hand."""
        now = time.time()
        decision: Decision | None = steps.before_submit(job, now)
        if decision is None:
            with at_step("admit"):
                job, decision = self._admit(job, message, now)
        if isinstance(decision, Submit):
            with at_step("in_php"):
                decision = self._call_in_php(job, request)
            if isinstance(decision, PollAt):
                # A captcha id paid for: registering it is waited out, never retried.
                polled = decision.job
                self.holding(
                    polled, str(polled.captcha_id), lambda: self.act_on_submit(job, decision)
                )
                return
        self.act_on_submit(job, decision)

    def holding(self, job: Job, captcha_id: str, call: Callable[[], T]) -> T:
        """``call``, tried again for as long as Redis (or the broker) is away: from
        ``in.php``'s answer until the board holds it, ``captcha_id`` (paid for) lives only
        in this process.  The task's own retry would start again from the admission and
        pay again; with Redis down it cannot even be published (Celery rejects the
        message: the solve ends in silence, or its redelivery pays again).  There is no
        bound: a ``solve`` message run again starts a new deadline and would pay again,
        while a captcha registered late is polled at once, and its solve ends (solved, or
        ``ERROR_SOLVE_TIMEOUT``) through the completion.  Only the process's death loses it
        (its message, redelivered, pays again: the crash cost the failover guide lists)."""
        wait, told = HOLD_WAIT_S[0], False
        while True:
            try:
                found = call()
            except OUTAGES as exc:
                if not told:
                    log.warning(
                        "solve %s: Redis is unavailable (%s); captcha %s at %s waits here for"
                        " it to be registered",
                        job.solve_id,
                        exc,
                        captcha_id,
                        job.provider,
                    )
                    told = True
                time.sleep(wait)  # the captcha must not leave this process unregistered
                wait = min(HOLD_WAIT_S[1], wait * 2)
            else:
                if told:
                    log.warning(
                        "solve %s: Redis is back; captcha %s goes on", job.solve_id, captcha_id
                    )
                return found

    def _admit(self, job: Job, message: Message, now: float) -> tuple[Job, Decision]:
        """Route the submit and admit it there; a provider that went out of rotation since
        this process last looked turns it away, and it is routed again."""
        circuits = self.state.circuits
        for _ in range(len(self.state.providers) + 1):
            route = steps.route(job, self.settings.all_providers, circuits.view(), now)
            if not isinstance(route, steps.Destination):
                circuits.forget()  # no provider: make sure of it before saying so
                route = steps.route(job, self.settings.all_providers, circuits.view(), now)
                if not isinstance(route, steps.Destination):
                    return job, route
            job, admission = self._admit_routed(job, route, message, now)
            if admission.status != "down":
                break
            circuits.forget()
        else:
            return job, Fail(errors.ProviderDown("every provider went out of rotation"))
        faults.point("admit")
        if admission.status == "parked" and self._for_caller(job):
            self.events("task-parked", job.solve_id)
        if admission.status == "deferred" and admission.warn:
            log.warning(
                "provider %s: submits wait for its %s budget, not for threads: the budget"
                " limits throughput (captcha_tasks_budget_waits_total)",
                job.provider,
                admission.budget,
            )
        return job, steps.on_admission(job, admission, now)

    def _admit_routed(
        self, job: Job, route: steps.Destination, message: Message, now: float
    ) -> tuple[Job, Admission]:
        """Admit at the route's overflow providers when the wait at home would be too
        long, else at home; a job that held something at another provider lets it go."""
        spill = route.overflow if self.policy.overflow_after and job.pool is None else ()
        if spill:
            limit = self._park_limit(job, route.home)
            moved, admission = self._admit_at(route.home, job, message, now, park_limit=limit)
            if admission.status != "full":
                return moved, admission
            for name in spill:
                moved, admission = self._admit_at(name, job, message, now, park_limit=0)
                if admission.status not in ("full", "down"):
                    return moved, admission
        return self._admit_at(route.home, job, message, now)

    def _admit_at(
        self, name: str, job: Job, message: Message, now: float, park_limit: int | None = None
    ) -> tuple[Job, Admission]:
        if job.provider is not None and job.provider != name:
            # Moving on: what it held at the provider it leaves goes to that one's queue.
            self.completer.publish(self.state.provider(job.provider).limiter.release(job.solve_id))
        job = job.at(name)
        admission = self.state.provider(name).limiter.admit(
            job.solve_id,
            job.to_json(),
            attempt=job.attempt,
            deadline_in_s=job.deadline - now,
            lane=job.lane_name,
            tenant=job.tenant_name,
            asked_at=job.asked if job.asked is not None else job.started,
            batch_id=job.batch.id if job.batch else None,
            message_id=message.id,
            redelivered=message.redelivered,
            result=self._in_flight(job, PARKED, {}),
            park_limit=park_limit,
        )
        self.completer.publish(admission.handout)
        return job, admission

    def _park_limit(self, job: Job, home: str) -> int:
        capacity = self.state.provider(home).limiter.config.capacity
        typical = self._timing(job.at(home)).typical
        return steps.park_limit(capacity, typical, float(self.policy.overflow_after or 0))

    def _call_in_php(self, job: Job, request: SolveRequest | None) -> Decision:
        reply: str | errors.CaptchaTasksError
        try:
            full = self._with_pool_proxy(request or self._full_request(job), job)
            faults.point("in_php")
            reply = self.api(job.provider).submit(full, self._pingback(job))
        except errors.StoreUnavailable:
            raise  # an outage, not an answer: the step runs again once Redis is back
        except errors.CaptchaTasksError as exc:
            reply = exc
            self._hold_account(exc, job.provider)
            if isinstance(exc, errors.NoSlotError):
                self.state.provider(job.provider).limiter.count_no_slot()
        if isinstance(reply, str):  # paid for: see holding
            captcha_id = reply
            return self.holding(job, captcha_id, lambda: self._on_reply(job, captcha_id))
        return self._on_reply(job, reply)

    def _on_reply(self, job: Job, reply: str | errors.CaptchaTasksError) -> Decision:
        down = self._answered(job.provider, reply if not isinstance(reply, str) else None)
        timing = self._timing(job)
        now, bulk, channel = time.time(), self._bulk(job.provider), self._channel(job.provider)
        return steps.on_submitted(job, reply, now, timing, self.policy, bulk, down, channel)

    def _answered(self, provider: str | None, error: errors.CaptchaTasksError | None) -> bool:
        """Record how a request to ``provider`` went (``error``: None when it answered);
        True when the provider is out of rotation now."""
        name = self.state.provider(provider).name
        circuits = self.state.circuits
        kind = steps.failure_kind(error) if error is not None else None
        if kind is None:
            if name in self._failing or circuits.view()[name].failures:
                self._failing.discard(name)
                circuits.succeeded(name)
            return False
        assert error is not None
        self._failing.add(name)
        failed = circuits.failed(name, error.code, kind)  # type: ignore[arg-type]
        if failed.opened:
            spec = self.state.provider(name).spec
            others = [p.name for p in self.settings.all_providers if p.name != name]
            log.warning(
                "provider %s is out of rotation: %s%s; new captchas go to %s until a probe"
                " finds it back",
                name,
                error.code,
                f" (check {spec.key_env})" if kind == "key" else "",
                ", ".join(others) or "no other provider",
            )
        return failed.open

    @staticmethod
    def _for_caller(job: Job) -> bool:
        """Whether a caller waits on the solve's own result (not a batch, not a refill)."""
        return job.pool is None and job.batch is None

    def _in_flight(self, job: Job, state: str, info: dict[str, Any]) -> tuple[str, str, int] | None:
        """The result record that says where a caller's solve is (key, record, TTL)."""
        if not self._for_caller(job):
            return None
        record = self.results.record(job.solve_id, state, info)
        return self.results.key(job.solve_id), record, self.results.ttl_s

    def act_on_submit(self, job: Job, decision: Decision) -> None:
        """Carry out a submit step's decision."""
        if isinstance(decision, PollAt):
            with at_step("register"):
                self._register(decision)
        elif isinstance(decision, SubmitAt):
            if decision.error is not None:
                log.info("solve %s: %s; submitting again", job.solve_id, decision.error.code)
            self._count(decision.error, provider=job.provider)
            self.resend(decision.job, decision.at - time.time(), not decision.keep_claim)
        elif isinstance(decision, Resubmit):
            self._count(decision.error, provider=job.provider)
            self.state.stats.count_resubmit(decision.reason)
            self._replace_proxy(job, decision)
            self.resend(decision.job, 0.0, unclaim=True)
        elif isinstance(decision, Deliver | Fail):
            self.completer.complete(job, decision)
        elif isinstance(decision, Stop):
            log.info("solve %s: %s", job.solve_id, decision.reason)

    def _register(self, decision: PollAt) -> None:
        job = decision.job
        faults.point("register")
        info = {"captcha_id": job.captcha_id, "attempt": job.attempt, "provider": job.provider}
        registered = self.state.provider(job.provider).board.register(
            job.solve_id,
            job.attempt,
            str(job.captcha_id),
            job.to_json(),
            decision.at - time.time(),
            result=self._in_flight(job, SUBMITTED, info),
        )
        if self._for_caller(job):
            self.events("task-submitted", job.solve_id, **info)
        self.publish_round(registered.round, job.provider)
        if registered.early is not None:
            # its callback came before it was on the board: taken from Redis, applied now
            entry = Entry(str(job.captcha_id), job.to_json(), None, 0)
            self.answer_callback(entry, job, registered.early)

    # -- provider callbacks ------------------------------------------------------------
    def answer_callback(self, entry: Entry, job: Job, code: str) -> bool | None:
        """The provider called back with ``code`` for the captcha of ``entry`` (its job
        ``job``, at its provider): end it as a poll reading the same answer would.  None:
        the code ends nothing (changes nothing); False: something else ended the captcha
        first."""
        answer = callback_answer(code, entry.captcha_id)
        now = time.time()
        decision = steps.on_callback(job, answer, entry.polled_at, now, self.policy)
        if decision is None:
            return None
        if isinstance(decision, Resubmit):
            done = self.retire(entry, job, decision, now)
        else:
            done = self.completer.complete(job, decision, source="pingback")
        if done:
            self.heard([steps.heard_by_callback(job)], job.provider)
        return done

    def heard(self, items: Sequence[Heard | None], provider: str | None) -> None:
        """Tell ``provider``'s callback channel how answers came, and switch its state when
        they say so (one process switches it, and says so once).  Never breaks a solve."""
        found = [h for h in items if h is not None]
        if not found:
            return
        at = self.state.provider(provider)
        try:
            channel = at.channel.observe(found, steps.CHANNEL_WEIGHT)
            switch = steps.judge_channel(channel)
            if switch is not None and at.channel.switch(channel.state, switch.to, switch.share):
                _announce(at.name, channel, switch.to)
        except errors.StoreUnavailable:
            log.debug("could not tell the callback channel about %d answers", len(found))

    def _channel(self, provider: str | None) -> str:
        """The state of ``provider``'s callback channel (``down`` when callbacks are off, or
        Redis does not say: poll as without them)."""
        if self.policy.pingback_fallback is None:
            return DOWN
        try:
            return self.state.provider(provider).channel.read().state
        except errors.StoreUnavailable:
            return DOWN

    # -- poll rounds -------------------------------------------------------------------
    def poll_round(self, round_at_ms: int | None, provider: str | None = None) -> None:
        """One poll round at ``provider`` (None: the primary): ask for every due captcha,
        act on each answer, schedule the next.  A round that fails (no outage) ends the
        solves of the captchas it took."""
        started = time.time()
        at = self.state.provider(provider)
        taken = at.board.take_due(round_at_ms, ROUND_MOST)
        entries = [_Due(e, Job.from_json(e.job).at(at.name)) for e in taken]
        try:
            self._round(at.name, entries, started)
        except OUTAGES:
            raise  # its captchas come due again (a round holds them for a while only)
        except Exception as exc:
            for due in entries:
                self.fail_inside(due.job, exc, "poll")

    def _round(self, provider: str, entries: list[_Due], started: float) -> None:
        board = self.state.provider(provider).board
        asked_at = time.time()
        bulk = self._bulk(provider)
        replies: dict[str, Reply | float] = {}
        if entries and self._lost_at(provider):
            decisions: list[tuple[_Due, Decision]] = [
                (d, steps.on_provider_down(d.job, asked_at)) for d in entries
            ]
            paces: list[steps.Pace] = []
            in_bulk: set[str] = set()
        else:
            replies, in_bulk = self._fetch(provider, entries, bulk) if entries else ({}, set())
            channel = self._channel(provider) if entries else DOWN
            paces = [self._pace(d.job, bulk, channel) for d in entries]
            # Decided as of when they were asked: the pace runs from ask to ask, however
            # long the request and this round took.
            decisions = [
                (due, self._decide(due, replies, asked_at, pace))
                for due, pace in zip(entries, paces, strict=True)
            ]
        endings = [
            (d, decision) for d, decision in decisions if isinstance(decision, Deliver | Fail)
        ]
        claimed = self.completer.complete_many(
            [
                Done(d.job, decision, "bulk_poll" if d.captcha_id in in_bulk else "poll")
                for d, decision in endings
            ]
        )
        ended = [d for (d, _), done in zip(endings, claimed, strict=True) if done]
        now = time.time()
        again = [
            _again(d, decision, now) for d, decision in decisions if isinstance(decision, PollAt)
        ]
        for due, decision in decisions:
            if isinstance(decision, Resubmit) and self.retire(due.entry, due.job, decision, now):
                ended.append(due)
        heard = [self._heard_by_poll(d, replies.get(d.captcha_id), asked_at) for d in ended]
        self.heard(heard, provider)
        self._count(*(d.error for _, d in decisions if isinstance(d, PollAt)), provider=provider)
        gap = min((p.every for p in paces if p.bulk), default=self.settings.bulk_window_s)
        if len(entries) >= ROUND_MOST:
            gap = 0.0
        # The pace is from round to round: what this one took counts against it.
        gap = max(0.0, gap - (time.time() - started))
        self.publish_round(board.end_round(asked_at, again, gap), provider)

    def _lost_at(self, provider: str) -> bool:
        """Whether the captchas at ``provider`` go elsewhere: it is out of rotation because
        it stopped answering or refuses the key (an empty balance still solves the captchas
        it took), and another provider is in rotation (with none, they are polled as
        before: paying again gains nothing)."""
        view = self.state.circuits.view()
        circuit = view[provider]
        others = any(c.up for name, c in view.items() if name != provider)
        return circuit.open and circuit.why != "balance" and others

    def _decide(
        self, due: _Due, replies: dict[str, Reply | float], now: float, pace: steps.Pace
    ) -> Decision:
        try:
            return self._decide_one(due, replies, now, pace)
        except OUTAGES:
            raise
        except Exception as exc:  # one captcha's failure ends its solve, not the round
            log.error("solve %s: %s in poll", due.job.solve_id, type(exc).__name__, exc_info=exc)
            error = errors.InternalError(
                f"{type(exc).__name__} in poll", captcha_id=due.job.captcha_id
            )
            return Fail(error)

    def _decide_one(
        self, due: _Due, replies: dict[str, Reply | float], now: float, pace: steps.Pace
    ) -> Decision:
        faults.point("poll")
        entry, job = due.entry, due.job
        reply = replies.get(entry.captcha_id, NOT_READY)
        if isinstance(reply, float):
            return steps.on_poll_budget(job, reply, entry.errors, now)
        timing = self._timing(job)
        return steps.on_answer(
            job, reply, entry.polled_at, entry.errors, now, timing, self.policy, pace
        )

    def _pace(self, job: Job, bulk: bool, channel: str) -> steps.Pace:
        timing = self._timing(job)
        waits = steps.counts_on_callback(job, timing, self.policy, channel)
        return steps.pace(self.policy, timing, bulk, waits)

    def _heard_by_poll(self, due: _Due, reply: Reply | float | None, now: float) -> Heard | None:
        if reply is None or isinstance(reply, float):
            return None
        timing = self._timing(due.job)
        return steps.heard_by_poll(due.job, reply, due.entry.polled_at, now, timing, self.policy)

    def _fetch(
        self, provider: str, entries: Sequence[_Due], bulk_on: bool
    ) -> tuple[dict[str, Reply | float], set[str]]:
        """Every due captcha's answer from ``provider``, and the ids answered in bulk:
        pipe-safe ones are asked in bulk, the others one by one; a float means "the
        res.php budget frees in this many seconds"."""
        bulk = [d.captcha_id for d in entries if steps.uses_bulk(d.job, bulk_on)]
        in_bulk = set(bulk)
        single = [d.captcha_id for d in entries if d.captcha_id not in in_bulk]
        chunks = [bulk[i : i + BULK_IDS] for i in range(0, len(bulk), BULK_IDS)]
        wait = self.state.provider(provider).limiter.poll_wait(len(chunks) + len(single))
        if wait > 0:
            return dict.fromkeys((d.captcha_id for d in entries), wait), set()
        replies: dict[str, Reply | float] = {}
        for chunk in chunks:
            found = self._ask_many(provider, chunk)
            if found is None:
                single += chunk
                in_bulk.difference_update(chunk)
            else:
                replies.update(found)
        replies.update(self._ask_each(provider, single))
        return replies, in_bulk

    def _ask_many(self, provider: str, ids: list[str]) -> dict[str, Reply] | None:
        if len(ids) == 1:
            return None
        stats = self.state.provider(provider).stats
        try:
            found = self.api(provider).get_many(ids)
        except errors.CaptchaTasksError as exc:
            self._hold_account(exc, provider)
            self._answered(provider, exc)
            return dict.fromkeys(ids, exc)
        self._answered(provider, None)
        if stats.bulk_supported() is not (found is not None):
            stats.set_bulk_supported(found is not None)
            self._bulk_checked[provider] = (time.monotonic(), found is not None)
        if found is None:
            log.info(
                "provider %s does not answer res.php?ids=; polling one id per request", provider
            )
            return None
        return {cid: _as_reply(value) for cid, value in found.items()}

    def _ask_each(self, provider: str, ids: list[str]) -> dict[str, Reply]:
        if not ids:
            return {}
        if len(ids) == 1:
            return {ids[0]: self._ask_one(provider, ids[0])}
        if self._executor is None:
            self._executor = ThreadPoolExecutor(SINGLE_POLLS, thread_name_prefix="captcha-poll")
        replies = self._executor.map(lambda cid: self._ask_one(provider, cid), ids)
        return dict(zip(ids, replies, strict=True))

    def _ask_one(self, provider: str, captcha_id: str) -> Reply:
        try:
            reply = self.api(provider).get(captcha_id)
        except errors.CaptchaTasksError as exc:
            self._hold_account(exc, provider)
            self._answered(provider, exc)
            return exc
        self._answered(provider, None)
        return reply

    def retire(self, entry: Entry, job: Job, decision: Resubmit, now: float) -> bool:
        """Take a failed captcha off the board and submit its solve's next attempt; False
        when something else ended the captcha first."""
        nxt = decision.job
        deadline_in = nxt.deadline - now
        retired = self.state.provider(job.provider).board.retire(
            entry.captcha_id,
            nxt.solve_id,
            nxt.to_json(),
            deadline_in,
            decision.error.code,
            decision.reason,
        )
        if not retired:
            return False
        log.info(
            "captcha %s at %s: %s; submitting a new one",
            entry.captcha_id,
            job.provider,
            decision.error.code,
        )
        faults.point("retire")
        self._replace_proxy(job, decision)
        self.completer.send_submit(nxt)
        return True

    # -- messages ----------------------------------------------------------------------
    def publish_round(self, due: RoundDue | None, provider: str | None = None) -> None:
        """Send the poll round message a provider's board asked for.  A countdown longer
        than half the visibility timeout would be delivered twice: such a round runs early,
        finds nothing due and schedules the next."""
        if due is not None:
            countdown = min(due.countdown_s, self.settings.visibility_timeout / 2)
            at = self.state.provider(provider)
            args: tuple[Any, ...] = (due.at_ms,) if at.spec.primary else (due.at_ms, at.name)
            self.app.send_task(
                names.POLL, args=args, countdown=countdown, argsrepr=f"(round {at.name})"
            )

    def resend(self, job: Job, delay: float, unclaim: bool) -> None:
        """Submit ``job`` again: now (a message, owed until it starts: see
        ``limiter.owe``), or after ``delay`` seconds (it waits in Redis, and housekeeping
        hands it out then: see ``limiter.defer``)."""
        limiter = self.state.provider(job.provider).limiter
        deadline_in = job.deadline - time.time()
        if delay > 0:
            limiter.defer(
                job.solve_id,
                job.to_json(),
                at_in_s=delay,
                deadline_in_s=deadline_in,
                unclaim=unclaim,
            )
            return
        limiter.owe(
            job.solve_id, job.to_json(), deadline_in_s=deadline_in, countdown_s=0.0, unclaim=unclaim
        )
        self.completer.send_submit(job)

    # -- helpers -----------------------------------------------------------------------
    def _pingback(self, job: Job) -> str | None:
        """The callback URL of this attempt, when callbacks are on."""
        base = self.settings.pingback_url
        if base is None or not steps.uses_pingback(job):
            return None
        secret = self.settings.pingback_secret
        at = self.state.provider(job.provider)
        named = None if at.spec.primary else at.name
        return pingback.callback_url(base, secret, job.solve_id, job.attempt, named)

    def _bulk(self, provider: str | None = None) -> bool:
        """Whether pipe-safe captchas are polled in bulk at ``provider``: the setting, and
        whether its API honours ``ids=`` (read from Redis at most every
        :data:`BULK_CHECK_S`)."""
        if self.settings.bulk_poll != "auto":
            return False
        at = self.state.provider(provider)
        checked_at, supported = self._bulk_checked.get(at.name, (-math.inf, True))
        now = time.monotonic()
        if now - checked_at >= BULK_CHECK_S:
            supported = at.stats.bulk_supported() is not False
            self._bulk_checked[at.name] = (now, supported)
        return supported

    def _count(self, *errs: errors.CaptchaTasksError | None, provider: str | None = None) -> None:
        codes = [e.code for e in errs if e is not None]
        if codes:
            try:
                self.state.provider(provider).stats.count_errors(codes)
            except errors.StoreUnavailable:  # counting must never break a solve
                log.debug("could not count %s", codes)

    def _replace_proxy(self, job: Job, decision: Resubmit) -> None:
        if decision.replace_proxy:
            log.warning(
                "solve %s: pooled proxy failed (%s); quarantined",
                job.solve_id,
                decision.error.code,
            )
            self.state.proxies.replace(_proxy_owner(job))

    def _hold_account(self, exc: errors.CaptchaTasksError, provider: str | None) -> None:
        """An HTTP 429 holds every request to the provider for its ``Retry-After``."""
        if isinstance(exc, errors.RateLimited):
            at = self.state.provider(provider)
            log.warning(
                "provider %s answered 429: every request waits %.1f s", at.name, exc.retry_after
            )
            try:
                at.limiter.pause(exc.retry_after)
            except errors.StoreUnavailable:  # the steps wait for it anyway
                log.debug("could not record the 429 pause")

    def _timing(self, job: Job) -> Timing:
        request = job.request
        default = default_wait(request.method, request.params)
        return self.state.provider(job.provider).solve_times.timing(request.method, default)

    def _cancelled(self, job: Job) -> bool:
        return job.batch is not None and self.state.batches.cancelled(job.batch.id)

    # -- secrets and proxies -----------------------------------------------------------
    def _stashed(self, solve_id: str, names: list[str]) -> dict[str, Any]:
        """The proxy and cookies the caller stashed for this solve (see ``SolveTask``)."""
        if not names:
            return {}
        found = self.state.secrets.fetch(solve_id, names)
        if found is None:
            raise errors.SolveTimeout("the solve's proxy/cookies expired before it started")
        return found

    def _full_request(self, job: Job) -> SolveRequest:
        """The job's request with its stashed proxy and cookies put back."""
        if not job.secrets:
            return job.request
        found = self.state.secrets.fetch(job.solve_id, list(job.secrets))
        if found is None:
            raise errors.SolveTimeout("the solve's proxy/cookies expired before it was submitted")
        return replace(job.request, params={**job.request.params, **found})

    def _with_pool_proxy(self, request: SolveRequest, job: Job) -> SolveRequest:
        """Swap ``proxy="pool"`` for a proxy from the shared pool (sticky per owner)."""
        if not request.uses_proxy_pool:
            return request
        proxy = self.state.proxies.acquire(_proxy_owner(job))
        if proxy is None:
            raise errors.NoProxyAvailable("every pooled proxy is taken or cooling off")
        return request.with_proxy(*split(proxy))


@dataclass(frozen=True)
class _Due:
    """A captcha a round took, with its job decoded once."""

    entry: Entry
    job: Job

    @property
    def captcha_id(self) -> str:
        return self.entry.captcha_id


def _announce(provider: str, channel: Channel, to: str) -> None:
    """Say, once, that ``provider``'s callback channel switched to ``to``."""
    if to == DOWN:
        log.warning(
            "callbacks from provider %s stopped arriving (the last %d answers came by poll):"
            " its captchas are polled as if callbacks were off; pingback URLs are still sent,"
            " and callbacks that come back switch this back (can the provider reach"
            " CAPTCHAAI_PINGBACK_URL?)",
            provider,
            channel.misses,
        )
    elif to == DEGRADED and channel.state == UP:
        log.warning(
            "only %.0f%% of recent answers from provider %s came by callback: its captchas"
            " are polled from about their method's 25th percentile solve time on",
            100 * channel.share,
            provider,
        )
    elif to == DEGRADED:
        log.info("callbacks from provider %s arrive again: polling less (degraded)", provider)
    elif to == UP:
        log.info("callbacks from provider %s arrive reliably: captchas wait for them", provider)


def _again(due: _Due, decision: PollAt, now: float) -> Again:
    return Again(due.captcha_id, due.job.solve_id, decision.at - now, decision.poll_errors)


def _as_reply(value: Answer | NotReady | Exception) -> Reply:
    if isinstance(value, errors.CaptchaTasksError):
        return value
    if isinstance(value, Exception):
        return errors.TransportError(f"{type(value).__name__}")
    return value


def _proxy_owner(job: Job) -> str:
    return str(job.request.params.get("proxy_owner") or f"solve:{job.solve_id}")
