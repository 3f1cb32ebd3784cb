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
from typing import Any

from celery import Celery
from kombu.exceptions import OperationalError

from .. import errors, faults, pingback
from ..client import NOT_READY, Answer, CaptchaAIClient, NotReady
from ..connections import UNREACHABLE
from ..methods import SolveRequest, build_request, default_wait
from ..outcome import Solved, parse_iso
from ..settings import Settings
from ..state import State
from ..state.board import Again, Entry, RoundDue
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
    )


@dataclass(frozen=True)
class Message:
    """The task message a step runs for: its id, and whether the broker delivered it again
    because the worker that had it died."""

    id: str
    redelivered: bool = False


class Runner:
    """Runs the steps of solves for one Celery app, in one process.

    ``api`` gives the API client (called when a step needs it: only workers hold the key);
    ``events`` sends a task event when a monitor (Flower) listens.

    Once a solve is accepted, nothing ends it in silence: an outage of Redis or the broker
    (:data:`OUTAGES`) propagates, and the task retries the step once it is back (every
    step is idempotent); any other exception ends the solve through the one completion
    path with :class:`~captcha_tasks.errors.InternalError` (:meth:`fail_inside`).
    """

    def __init__(
        self,
        app: Celery,
        settings: Settings,
        state: State,
        api: Callable[[], CaptchaAIClient],
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
        self._bulk_checked = (-math.inf, True)

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
        """Admit the job's submit (for task ``message``) and call ``in.php`` for it when it
        holds a slot.  ``request``: the job's full request (with its stashed proxy and
        cookies), when the caller has it at hand."""
        now = time.time()
        decision: Decision | None = steps.before_submit(job, now)
        if decision is None:
            with at_step("admit"):
                decision = self._admit(job, message, now)
        if isinstance(decision, Submit):
            with at_step("in_php"):
                decision = self._call_in_php(job, request)
        self.act_on_submit(job, decision)

    def _admit(self, job: Job, message: Message, now: float) -> Decision:
        admission = self.state.limiter.admit(
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
        )
        self.completer.publish(admission.handout)
        faults.point("admit")
        if admission.status == "parked" and self._for_caller(job):
            self.events("task-parked", job.solve_id)
        return steps.on_admission(job, admission, now)

    def _call_in_php(self, job: Job, request: SolveRequest | None) -> Decision:
        reply: str | errors.CaptchaTasksError
        try:
            full = self._with_pool_proxy(request or self._full_request(job), job)
            faults.point("in_php")
            reply = self.api().submit(full, self._pingback(job))
        except errors.StoreUnavailable:
            raise  # an outage, not an answer: the step runs again once Redis is back
        except errors.CaptchaTasksError as exc:
            reply = exc
            self._hold_account(exc)
        timing = self._timing(job)
        return steps.on_submitted(job, reply, time.time(), timing, self.policy, self._bulk())

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
            self._count(decision.error)
            self.resend(decision.job, decision.at - time.time(), not decision.keep_claim)
        elif isinstance(decision, Resubmit):
            self._count(decision.error)
            self._replace_proxy(job, decision)
            self.resend(decision.job, 0.0, unclaim=True)
        elif isinstance(decision, Deliver | Fail):
            self.completer.complete(job, decision)
        elif isinstance(decision, Stop):
            log.info("solve %s: %s", job.solve_id, decision.reason)

    def _register(self, decision: PollAt) -> None:
        job = decision.job
        faults.point("register")
        info = {"captcha_id": job.captcha_id, "attempt": job.attempt}
        due = self.state.board.register(
            job.solve_id,
            job.attempt,
            str(job.captcha_id),
            job.to_json(),
            decision.at - time.time(),
            result=self._in_flight(job, SUBMITTED, info),
        )
        if self._for_caller(job):
            self.events("task-submitted", job.solve_id, **info)
        self.publish_round(due)

    # -- poll rounds -------------------------------------------------------------------
    def poll_round(self, round_at_ms: int | None) -> None:
        """One poll round: ask for every due captcha, act on each answer, schedule the next.
        A round that fails (no outage) ends the solves of the captchas it took."""
        started = time.time()
        taken = self.state.board.take_due(round_at_ms, ROUND_MOST)
        entries = [_Due(e, Job.from_json(e.job)) for e in taken]
        try:
            self._round(entries, started)
        except OUTAGES:
            raise  # its captchas come due again (a round holds them for a while only)
        except Exception as exc:
            for due in entries:
                self.fail_inside(due.job, exc, "poll")

    def _round(self, entries: list[_Due], started: float) -> None:
        board = self.state.board
        asked_at = time.time()
        bulk = self._bulk()
        replies, in_bulk = self._fetch(entries, bulk) if entries else ({}, set())
        paces = [steps.pace(self.policy, self._timing(d.job), bulk) for d in entries]
        # Decided as of when they were asked: the pace runs from ask to ask, however long
        # the request and this round took.
        decisions = [
            (due, self._decide(due, replies, asked_at, pace))
            for due, pace in zip(entries, paces, strict=True)
        ]
        self.completer.complete_many(
            [
                Done(d.job, decision, "bulk_poll" if d.captcha_id in in_bulk else "poll")
                for d, decision in decisions
                if isinstance(decision, Deliver | Fail)
            ]
        )
        now = time.time()
        again = [
            _again(d, decision, now) for d, decision in decisions if isinstance(decision, PollAt)
        ]
        for due, decision in decisions:
            if isinstance(decision, Resubmit):
                self.retire(due.entry, due.job, decision, now)
        self._count(*(d.error for _, d in decisions if isinstance(d, PollAt)))
        gap = min((p.every for p in paces if p.bulk), default=self.settings.bulk_window_s)
        if len(entries) >= ROUND_MOST:
            gap = 0.0
        # The pace is from round to round: what this one took counts against it.
        gap = max(0.0, gap - (time.time() - started))
        self.publish_round(board.end_round(asked_at, again, gap))

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

    def _fetch(
        self, entries: Sequence[_Due], bulk_on: bool
    ) -> tuple[dict[str, Reply | float], set[str]]:
        """Every due captcha's answer, and the ids answered in bulk: pipe-safe ones are
        asked in bulk, the others one by one; a float means "the res.php budget frees in
        this many seconds"."""
        bulk = [d.captcha_id for d in entries if steps.uses_bulk(d.job, bulk_on)]
        in_bulk = set(bulk)
        single = [d.captcha_id for d in entries if d.captcha_id not in in_bulk]
        chunks = [bulk[i : i + BULK_IDS] for i in range(0, len(bulk), BULK_IDS)]
        wait = self.state.limiter.poll_wait(len(chunks) + len(single))
        if wait > 0:
            return dict.fromkeys((d.captcha_id for d in entries), wait), set()
        replies: dict[str, Reply | float] = {}
        for chunk in chunks:
            found = self._ask_many(chunk)
            if found is None:
                single += chunk
                in_bulk.difference_update(chunk)
            else:
                replies.update(found)
        replies.update(self._ask_each(single))
        return replies, in_bulk

    def _ask_many(self, ids: list[str]) -> dict[str, Reply] | None:
        if len(ids) == 1:
            return None
        stats = self.state.stats
        try:
            found = self.api().get_many(ids)
        except errors.CaptchaTasksError as exc:
            self._hold_account(exc)
            return dict.fromkeys(ids, exc)
        if stats.bulk_supported() is not (found is not None):
            stats.set_bulk_supported(found is not None)
            self._bulk_checked = (time.monotonic(), found is not None)
        if found is None:
            log.info("the API does not answer res.php?ids=; polling one id per request")
            return None
        return {cid: _as_reply(value) for cid, value in found.items()}

    def _ask_each(self, ids: list[str]) -> dict[str, Reply]:
        if not ids:
            return {}
        if len(ids) == 1:
            return {ids[0]: self._ask_one(ids[0])}
        if self._executor is None:
            self._executor = ThreadPoolExecutor(SINGLE_POLLS, thread_name_prefix="captcha-poll")
        return dict(zip(ids, self._executor.map(self._ask_one, ids), strict=True))

    def _ask_one(self, captcha_id: str) -> Reply:
        try:
            return self.api().get(captcha_id)
        except errors.CaptchaTasksError as exc:
            self._hold_account(exc)
            return exc

    def retire(self, entry: Entry, job: Job, decision: Resubmit, now: float) -> bool:
        """Take a failed captcha off the board and submit its solve's next attempt; False
        when something else ended the captcha first."""
        nxt = decision.job
        deadline_in = nxt.deadline - now
        retired = self.state.board.retire(
            entry.captcha_id, nxt.solve_id, nxt.to_json(), deadline_in, decision.error.code
        )
        if not retired:
            return False
        log.info("captcha %s: %s; submitting a new one", entry.captcha_id, decision.error.code)
        faults.point("retire")
        self._replace_proxy(job, decision)
        self.completer.send_submit(nxt)
        return True

    # -- messages ----------------------------------------------------------------------
    def publish_round(self, due: RoundDue | None) -> None:
        """Send the poll round message the board asked for.  A countdown longer than half
        the visibility timeout would be delivered twice: such a round runs early, finds
        nothing due and schedules the next."""
        if due is not None:
            countdown = min(due.countdown_s, self.settings.visibility_timeout / 2)
            self.app.send_task(
                names.POLL, args=(due.at_ms,), countdown=countdown, argsrepr="(round)"
            )

    def resend(self, job: Job, countdown: float, unclaim: bool) -> None:
        """Publish the submit of ``job`` again, owed until it starts (see ``limiter.owe``)."""
        countdown = min(max(0.0, countdown), self.settings.visibility_timeout / 2)
        self.state.limiter.owe(
            job.solve_id,
            job.to_json(),
            deadline_in_s=job.deadline - time.time(),
            countdown_s=countdown,
            unclaim=unclaim,
        )
        self.completer.send_submit(job, countdown)

    # -- helpers -----------------------------------------------------------------------
    def _pingback(self, job: Job) -> str | None:
        """The callback URL of this attempt, when callbacks are on."""
        base = self.settings.pingback_url
        if base is None or not steps.uses_pingback(job):
            return None
        secret = self.settings.pingback_secret
        return pingback.callback_url(base, secret, job.solve_id, job.attempt)

    def _bulk(self) -> bool:
        """Whether pipe-safe captchas are polled in bulk: the setting, and whether the API
        honours ``ids=`` (read from Redis at most every :data:`BULK_CHECK_S`)."""
        if self.settings.bulk_poll != "auto":
            return False
        checked_at, supported = self._bulk_checked
        now = time.monotonic()
        if now - checked_at >= BULK_CHECK_S:
            supported = self.state.stats.bulk_supported() is not False
            self._bulk_checked = (now, supported)
        return supported

    def _count(self, *errs: errors.CaptchaTasksError | None) -> None:
        codes = [e.code for e in errs if e is not None]
        if codes:
            try:
                self.state.stats.count_errors(codes)
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

    def _hold_account(self, exc: errors.CaptchaTasksError) -> None:
        """An HTTP 429 holds every request of the account for its ``Retry-After``."""
        if isinstance(exc, errors.RateLimited):
            log.warning("the API answered 429: every request waits %.1f s", exc.retry_after)
            try:
                self.state.limiter.pause(exc.retry_after)
            except errors.StoreUnavailable:  # the steps wait for it anyway
                log.debug("could not record the 429 pause")

    def _timing(self, job: Job) -> Timing:
        request = job.request
        default = default_wait(request.method, request.params)
        return self.state.solve_times.timing(request.method, default)

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
