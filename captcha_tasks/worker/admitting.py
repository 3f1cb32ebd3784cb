"""A submit's admission: route it (:mod:`captcha_tasks.core.routing`), ask the provider's
thread limiter for a slot, and say what the answer means
(:func:`~captcha_tasks.core.steps.on_admission`).

The admission is also the one place that decides whether a solve that has not reached
``in.php`` goes on at all: the limiter's script reads its revocation and its batch's
cancellation there (see :mod:`captcha_tasks.core.admission`); nothing here or in the
other parts of the adapter reads them again.
"""

from __future__ import annotations

import logging
import random

from .. import faults
from ..core import routing, steps
from ..core.acceptance import site_of
from ..core.admission import Admission
from ..core.decisions import Decision
from ..core.job import Job
from .edges import Edges, Message
from .results import PARKED

log = logging.getLogger(__name__)


class Admitter:
    """Admits the submits of one runner."""

    def __init__(self, edges: Edges) -> None:
        self.edges = edges
        self.state = edges.state

    def admit(self, job: Job, message: Message, now: float) -> tuple[Job, Decision]:
        """Route the submit (for task ``message``) and admit it there: the job as admitted
        (at its provider) and what the admission means for it."""
        circuits = self.state.circuits
        providers = self.edges.settings.providers.all
        site, pick, was = self._pick(job)
        fresh, routed = False, 0
        while True:
            to = routing.route(job, providers, circuits.view(), now, fresh, pick)
            if isinstance(to, routing.Reread):
                circuits.forget()
                fresh = True
                continue
            if not isinstance(to, routing.Destination):
                return job, to
            routed += 1
            job, admission = self._admit_routed(job, to, message, now)
            again = routing.after_admission(admission.status, routed, len(providers))
            if again is None:
                break
            if not isinstance(again, routing.Reread):
                return job, again
            circuits.forget()
            fresh = True
        faults.point("admit")
        if site is not None:
            self._routed(job, site, to, was)
        self._said(job, admission)
        return job, steps.on_admission(job, admission, now)

    def _pick(self, job: Job) -> tuple[str | None, routing.Pick | None, str | None]:
        """The submit's site, what it said of each provider's tokens and where it was
        routed last (None: one provider, or nothing to route by)."""
        settings = self.edges.settings
        site = site_of(job.request.pageurl, job.request.sitekey)
        if site is None or len(settings.providers.all) < 2:
            return None, None, None
        view = self.state.acceptance.read(job.request.method, site)
        pick = routing.Pick(view.acceptance, random.random(), settings.acceptance.policy)
        return site, pick, view.route

    def _routed(self, job: Job, site: str, to: routing.Destination, was: str | None) -> None:
        """Count a submit routed elsewhere than in order, and say once when the site's
        route changed."""
        if to.why == "order" and was is None:
            return
        method = job.request.method
        if self.state.acceptance.routed(method, site, to.home, to.why):
            log.info(
                "site %s (%s): its captchas go to provider %s now (%s)",
                site,
                method,
                to.home,
                to.why,
            )

    def _said(self, job: Job, admission: Admission) -> None:
        if admission.status == "parked" and job.for_caller:
            self.edges.events("task-parked", job.solve_id)
        if admission.status == "deferred" and admission.warn:
            log.warning(
                "provider %s: submits wait for its %s budget, not for threads: the budget"
                " limits throughput (captcha_tasks_budget_waits_total)",
                job.provider,
                admission.budget,
            )

    def _admit_routed(
        self, job: Job, to: routing.Destination, message: Message, now: float
    ) -> tuple[Job, Admission]:
        """Admit at the route's providers in the order the routing policy says."""
        spill = routing.overflow(to, job, self.edges.policy)
        limit = self._park_limit(job, to.home) if spill else 0
        *first, last = routing.tries(to.home, spill, limit)
        for attempt in first:
            # each try starts from the job as routed: a turned-away try kept nothing
            moved, admission = self._admit_at(attempt, job, message, now)
            if admission.status not in attempt.passes:
                return moved, admission
        return self._admit_at(last, job, message, now)

    def _admit_at(
        self, attempt: routing.Try, job: Job, message: Message, now: float
    ) -> tuple[Job, Admission]:
        left = routing.leaving(job, attempt.provider)
        if left is not None:
            # Moving on: what it held at the provider it leaves goes to that one's queue.
            self.edges.completer.publish(self.state.provider(left).limiter.release(job.solve_id))
        job = job.at(attempt.provider)
        admission = self.state.provider(attempt.provider).limiter.admit(
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
            result=self.edges.in_flight(job, PARKED, {}),
            park_limit=attempt.park_limit,
        )
        self.edges.completer.publish(admission.handout)
        return job, admission

    def _park_limit(self, job: Job, home: str) -> int:
        capacity = self.state.provider(home).limiter.config.capacity
        typical = self.edges.timing(job.at(home)).typical
        return routing.park_limit(capacity, typical, float(self.edges.policy.overflow_after or 0))
