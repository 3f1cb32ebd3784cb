"""A submit: admit it (:mod:`.admitting`), call ``in.php``, and carry out what the steps
decide (:mod:`captcha_tasks.core.steps`): register the captcha on its provider's board,
submit again later, resubmit, or end the solve.

From ``in.php``'s answer until the board holds it, a captcha paid for lives only in this
process: an outage of Redis is waited out in place there (:meth:`Submitter.holding`), for
as long as the core says (:func:`captcha_tasks.core.steps.hold`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from .. import errors, faults
from ..core import pingback, steps
from ..core.answers import Answer
from ..core.decisions import Decision, Deliver, Fail, PollAt, Resubmit, Stop, Submit, SubmitAt
from ..core.dialects import takes_callbacks
from ..core.job import Job
from ..core.rounds import Entry
from ..methods import SolveRequest
from .admitting import Admitter
from .edges import OUTAGES, Edges, Message, at_step
from .health import Health
from .results import SUBMITTED
from .rounds import Rounds
from .stash import Stash

log = logging.getLogger(__name__)

T = TypeVar("T")


class Submitter:
    """Runs the submits of one runner."""

    def __init__(
        self, edges: Edges, health: Health, stash: Stash, admitter: Admitter, rounds: Rounds
    ) -> None:
        self.edges = edges
        self.state = edges.state
        self.health = health
        self.stash = stash
        self.admitter = admitter
        self.rounds = rounds

    def submit(self, job: Job, message: Message) -> None:
        """A submit message: a parked solve given a thread, a retry, a resubmit."""
        try:
            self.run(job, message)
        except OUTAGES:
            raise
        except Exception as exc:
            self.edges.fail_inside(job, exc, "submit")

    def run(self, job: Job, message: Message, request: SolveRequest | None = None) -> None:
        """Admit the job's submit (for task ``message``) at the provider it goes to, and
        call ``in.php`` there when it holds a slot.  ``request``: the job's full request
        (with its stashed proxy and cookies), when the caller has it at hand."""
        now = time.time()
        decision: Decision | None = steps.before_submit(job, now)
        if decision is None:
            with at_step("admit"):
                job, decision = self.admitter.admit(job, message, now)
        if isinstance(decision, Submit):
            with at_step("in_php"):
                reply = self._call_in_php(job, request)
                if isinstance(reply, str):  # paid for: from here on, see holding
                    self._paid(job, reply)
                    return
                decision = self._on_reply(job, reply)
        self.act(job, decision)

    def _paid(self, job: Job, captcha_id: str) -> None:
        answer = self.edges.api(job.provider).answered(captcha_id)
        if answer is not None:  # answered inside the submit (CapSolver's images)
            self.holding(job, captcha_id, lambda: self._answered(job, captcha_id, answer))
            return
        decided = self.holding(job, captcha_id, lambda: self._on_reply(job, captcha_id))
        if decided is not None:
            self.holding(job, captcha_id, lambda: self.act(job, decided))

    def holding(self, job: Job, captcha_id: str, call: Callable[[], T]) -> T | None:
        """``call``, tried again in place for as long as Redis (or the broker) is away and
        the core says to hold on (:func:`~captcha_tasks.core.steps.hold`): ``captcha_id``,
        paid for, is not on the board yet.  Past the solve's deadline the solve is ended
        through the completion instead, once Redis answers, or given up as lost (logged
        with its captcha id) if it never does: then None."""
        tries, register = 0, True
        while True:
            try:
                if not register:
                    self._end_held(job, captcha_id)
                    return None
                found = call()
            except OUTAGES as exc:
                tries += 1
                step = steps.hold(job, time.time(), tries, self.edges.policy)
                self._say_held(job, captcha_id, exc, tries, register, step)
                if isinstance(step, steps.Lost):
                    return None
                time.sleep(step.wait_s)  # the captcha must not leave this process unregistered
                register = step.register
            else:
                if tries and register:
                    log.warning(
                        "solve %s: Redis is back; captcha %s goes on", job.solve_id, captcha_id
                    )
                return found

    def _say_held(
        self,
        job: Job,
        captcha_id: str,
        exc: BaseException,
        tries: int,
        registering: bool,
        step: steps.Hold | steps.Lost,
    ) -> None:
        where = f"captcha {captcha_id} at {job.provider}"
        if tries == 1:
            log.warning(
                "solve %s: Redis is unavailable (%s); %s waits here for it to be registered"
                " (until the solve's deadline)",
                job.solve_id,
                exc,
                where,
            )
        if isinstance(step, steps.Lost):
            log.error(
                "solve %s is lost: %s was paid for, and Redis did not answer by the solve's"
                " deadline and %.0f s more: nothing of it reached Redis (its caller's wait"
                " times out; its thread lease expires by itself)",
                job.solve_id,
                where,
                self.edges.policy.hold_grace,
            )
        elif registering and not step.register:
            log.warning(
                "solve %s: its deadline passes with Redis still unavailable; %s is not polled,"
                " and the solve ends with ERROR_SOLVE_TIMEOUT once Redis answers",
                job.solve_id,
                where,
            )

    def _answered(self, job: Job, captcha_id: str, answer: Answer) -> None:
        """End the solve with the answer its submit held: it never goes on the board."""
        self.health.answered(job.provider, None)
        now = time.time()
        decision = steps.on_answered_at_submit(job, captcha_id, answer, now, self.edges.policy)
        submitted = job.submitted(captcha_id, now)
        if isinstance(decision, Resubmit):
            self.act(submitted, decision)
            return
        if self.edges.completer.complete(submitted, decision, source="submit"):
            self.edges.count_cost(submitted, answer)

    def _end_held(self, job: Job, captcha_id: str) -> None:
        # The captcha is not on the board: the solve is completed without it (the finish
        # script would look for it there), its id kept in the error.
        ended = self.edges.completer.complete(job, steps.held_past_deadline(captcha_id))
        log.warning(
            "solve %s: Redis is back after the solve's deadline; %s (captcha %s at %s was"
            " never polled)",
            job.solve_id,
            "it ended with ERROR_SOLVE_TIMEOUT" if ended else "it had ended already",
            captcha_id,
            job.provider,
        )

    def _call_in_php(
        self, job: Job, request: SolveRequest | None
    ) -> str | errors.CaptchaTasksError:
        try:
            full = self.stash.with_pool_proxy(request or self.stash.full_request(job), job)
            faults.point("in_php")
            return self.edges.api(job.provider).submit(full, self._pingback(job))
        except errors.StoreUnavailable:
            raise  # an outage, not an answer: the step runs again once Redis is back
        except errors.CaptchaTasksError as exc:
            self.health.hold_account(exc, job.provider)
            if isinstance(exc, errors.NoSlotError):
                self.state.provider(job.provider).limiter.count_no_slot()
            return exc

    def _on_reply(self, job: Job, reply: str | errors.CaptchaTasksError) -> Decision:
        down = self.health.answered(job.provider, reply if not isinstance(reply, str) else None)
        timing = self.edges.timing(job)
        now, bulk = time.time(), self.health.bulk(job.provider)
        channel = self.health.channel(job.provider)
        policy = self.edges.policy
        probes = self.health.probes(job.provider)
        return steps.on_submitted(job, reply, now, timing, policy, bulk, down, channel, probes)

    def _pingback(self, job: Job) -> str | None:
        """The callback URL of this attempt, when callbacks are on."""
        settings = self.edges.settings
        base = settings.pingback.url
        if base is None or not steps.uses_pingback(job):
            return None
        at = self.state.provider(job.provider)
        if not takes_callbacks(at.spec.kind):
            return None
        named = None if at.spec.primary else at.name
        return pingback.callback_url(
            base, settings.pingback.secret, job.solve_id, job.attempt, named
        )

    # -- acting on a decision ----------------------------------------------------------
    def act(self, job: Job, decision: Decision) -> None:
        """Carry out a submit step's decision."""
        if isinstance(decision, PollAt):
            with at_step("register"):
                self._register(decision)
        elif isinstance(decision, SubmitAt):
            if decision.error is not None:
                log.info("solve %s: %s; submitting again", job.solve_id, decision.error.code)
            self.edges.count(decision.error, provider=job.provider)
            self.resend(decision.job, decision.at - time.time(), not decision.keep_claim)
        elif isinstance(decision, Resubmit):
            self.edges.count(decision.error, provider=job.provider)
            self.state.stats.count_resubmit(decision.reason)
            self.stash.replace_proxy(job, decision)
            self.resend(decision.job, 0.0, unclaim=True)
        elif isinstance(decision, Deliver | Fail):
            self.edges.completer.complete(job, decision)
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
            result=self.edges.in_flight(job, SUBMITTED, info),
        )
        if job.for_caller:
            self.edges.events("task-submitted", job.solve_id, **info)
        self.edges.publish_round(registered.round, job.provider)
        if registered.early is not None:
            # its callback came before it was on the board: taken from Redis, applied now
            entry = Entry(str(job.captcha_id), job.to_json(), None, 0)
            self.rounds.answer_callback(entry, job, registered.early)

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
        self.edges.completer.send_submit(job)
