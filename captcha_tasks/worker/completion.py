"""The one completion path: every solve ends here, whatever told us its answer.

A per-id poll, a bulk poll, a pool hit, a failure, a revocation or a failure inside the
worker all become one call of :meth:`Completer.complete` (or
:meth:`Completer.complete_many` for a poll round).  It builds the outcome's records and runs
the board's finish script, which in one atomic step claims the solve exactly once, frees
its thread and hands it to the next parked submit, stores the outcome under ``solve``'s
result id (:mod:`.results`: Celery's own record, so ``AsyncResult.get()`` returns it) and
appends it to the solve's batch stream.  Then it publishes the submits that got the thread,
runs what the caller chained to the solve (callbacks, chain, chord part), tops up the
solve's pool if it was a refill, and gives back its pooled proxy.  Whatever of that a
crash interrupts is owed in Redis and done again by housekeeping.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, states
from celery.exceptions import TaskRevokedError

from .. import errors, faults
from ..core.admission import Handout
from ..core.decisions import Deliver, Fail
from ..core.job import Job
from ..core.outcome import Failed
from ..settings import Settings
from ..state import State
from ..state.board import Completion, Finished
from . import names
from .celery_compat.records import run_followup
from .results import Results

log = logging.getLogger(__name__)

Ending = Deliver | Fail
#: Sends a task event (type, task id, fields) when a monitor listens; see Runtime.event.
Events = Callable[..., None]


def no_events(*_: Any, **__: Any) -> None:
    """The event sender of a process without a worker (nothing listens)."""


@dataclass(frozen=True)
class Ended:
    """One solve to complete: its job, how it ended, and where the answer came from."""

    job: Job
    ending: Ending
    source: str = "api"


class Completer:
    """Completes solves for one Celery app (whose result backend ``get()`` reads)."""

    def __init__(
        self, app: Celery, settings: Settings, state: State, events: Events = no_events
    ) -> None:
        self.app = app
        self.settings = settings
        self.state = state
        self.results = Results(app)
        self.events = events

    def complete(self, job: Job, ending: Ending, source: str = "api") -> bool:
        """End the solve of ``job``; False when something else ended it first."""
        return self.complete_many([Ended(job, ending, source)])[0]

    def complete_many(self, items: Sequence[Ended]) -> list[bool]:
        """End several solves with one Redis round trip."""
        if not items:
            return []
        chain = self.state.db.chain()
        for item in items:
            board = self.state.provider(item.job.provider).board
            board.finish(self.completion(item), client=chain)
        results = self.state.board.run(chain)
        for item, result in zip(items, results, strict=True):
            self._after(item, result)
        return [r.claimed for r in results]

    def completion(self, item: Ended) -> Completion:
        """The records the finish script stores for ``item``."""
        job, ending = item.job, item.ending
        method = job.request.method
        solve_time, source, code = None, None, None
        value: Any
        children: list[Any] = []
        if isinstance(ending, Deliver):
            outcome = ending.outcome.to_dict()
            state, value = states.SUCCESS, outcome
            solve_time, source = ending.solve_time_s, item.source
            children = list(job.children)  # as Celery lists them: after a success only
        else:
            outcome = Failed.from_exception(
                ending.error, method, self._elapsed(job), job.provider
            ).to_dict()
            state, value = self.results.ending(ending.error)
            code = ending.error.code
        key = record = revoked = None
        if not job.pool:  # a refill's outcome goes to its pool, not to a caller
            key = self.results.key(job.solve_id)
            record = self.results.record(job.solve_id, state, value, children)
            revoked = self.results.record(job.solve_id, states.REVOKED, _REVOKED)
        batch = job.batch
        return Completion(
            solve_id=job.solve_id,
            method=method,
            # A pool token's captcha, and one answered inside its submit, are on no board.
            captcha_id=None if item.source in ("pool", "submit") else job.captcha_id,
            result_key=key,
            result_value=record,
            revoked_value=revoked,
            result_ttl_s=self.results.ttl_s,
            batch_id=batch.id if batch else None,
            batch_entry=_entry(outcome, batch.index) if batch else None,
            revoked_entry=_entry(self._revoked_outcome(job), batch.index) if batch else None,
            solve_time_s=solve_time,
            source=source,
            error_code=code,
            solved=isinstance(ending, Deliver),
            lane=job.lane_name,
            tenant=job.tenant_name,
        )

    def publish(self, handout: Handout) -> None:
        """Send a submit message for each handed-out job (those past their deadline
        included: their submit fails them)."""
        handed = handout.all()
        if handed:
            faults.point("handout")
        for parked in handed:
            self.send_submit(Job.from_json(parked.job))

    def send_submit(self, job: Job, countdown: float = 0.0) -> None:
        """Publish a submit message for ``job`` (shown in Flower by its label, no secrets).

        A countdown message held past the broker's visibility timeout is delivered twice,
        so a longer wait is cut to half of it: the submit runs early and waits again."""
        limit = self.settings.celery.visibility_timeout / 2
        self.app.send_task(
            names.SUBMIT,
            args=(job.to_dict(),),
            countdown=min(limit, max(0.0, countdown)),
            argsrepr=job.label(),
            kwargsrepr="{}",
        )

    def run_followup(self, solve_id: str, followup: str, state: str, value: Any) -> None:
        """Run what the caller chained to the solve, then forget it (it was owed)."""
        run_followup(self.app, solve_id, json.loads(followup), state, value)
        self.state.followups.done(solve_id)

    def _after(self, item: Ended, result: Finished) -> None:
        self.publish(result.handout)
        if not result.claimed:
            return
        faults.point("complete")
        job = item.job
        state, value = self._final(item, result.revoked)
        if result.followup is not None:
            self.run_followup(job.solve_id, result.followup, state, value)
        self._announce(job, state, value)
        if job.pool:
            self._refill_done(job.pool, job, item.ending)
        request = job.request
        if request.uses_proxy_pool and "proxy_owner" not in request.params:
            self.state.proxies.release(f"solve:{job.solve_id}")

    def _final(self, item: Ended, revoked: bool) -> tuple[str, Any]:
        """The state and value the solve ended with (as stored for its caller)."""
        if revoked:
            return states.REVOKED, _REVOKED
        if isinstance(item.ending, Deliver):
            return states.SUCCESS, item.ending.outcome.to_dict()
        return self.results.ending(item.ending.error)

    def _announce(self, job: Job, state: str, value: Any) -> None:
        # Flower (when it listens) sees the solve end here, not when its message ran.
        if job.pool:
            return
        if state == states.SUCCESS:
            self.events("task-succeeded", job.solve_id, result=_shown(value), runtime=0.0)
        elif state == states.REVOKED:
            self.events("task-revoked", job.solve_id, terminated=False, expired=False)
        else:
            self.events("task-failed", job.solve_id, exception=repr(value), traceback="")

    def _revoked_outcome(self, job: Job) -> dict[str, Any]:
        error = errors.Revoked("revoked", captcha_id=job.captcha_id)
        failed = Failed.from_exception(error, job.request.method, self._elapsed(job), job.provider)
        return failed.to_dict()

    @staticmethod
    def _elapsed(job: Job) -> float:
        return round(time.time() - job.started, 3)

    def _refill_done(self, pool: str, job: Job, ending: Ending) -> None:
        pools = self.state.pools
        pools.refill_finished(pool, job.solve_id)
        if not isinstance(ending, Deliver):
            return
        try:
            spec = pools.get(pool)
        except errors.PoolNotFound:
            return  # the pool was removed while its refill ran
        life = min(spec.ttl, ending.outcome.expires_at - time.time())
        pools.add(pool, ending.outcome.to_dict(), life)


#: What a revoked solve's caller gets from ``AsyncResult.get()``: Celery's own error.
_REVOKED = TaskRevokedError("revoked")


def _entry(outcome: dict[str, Any], index: int) -> str:
    return json.dumps({**outcome, "index": index})


def _shown(outcome: Any) -> str:
    # The outcome dict puts the token last: cut short, Flower shows the facts, not it.
    return repr(outcome)[:200]
