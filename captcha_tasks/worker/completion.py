"""The one completion path: every solve ends here, whatever told us its answer.

A per-id poll, a bulk poll, a pool hit or a failure all become one call of
:meth:`Completer.complete` (or :meth:`Completer.complete_many` for a poll round).  It
builds the outcome's records and runs the board's finish script, which in one atomic
step claims the solve exactly once, frees its thread and hands it to the next parked
submit, stores the outcome under ``solve``'s result id (in Celery's result format, so
``AsyncResult.get()`` returns it) and appends it to the solve's batch stream.  Then it
publishes the submits that got the thread, tops up the solve's pool if it was a refill,
and gives back its pooled proxy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery import Celery, states

from .. import errors, faults
from ..outcome import Failed
from ..settings import Settings
from ..state import State
from ..state.board import Completion, Finished, finished
from ..state.limiter import Handout
from ..state.lua import text
from . import names
from .job import Job
from .steps import Deliver, Fail

log = logging.getLogger(__name__)

DEFAULT_RESULT_TTL = 86400

Ending = Deliver | Fail


@dataclass(frozen=True)
class Done:
    """One solve to complete: its job, how it ended, and where the answer came from."""

    job: Job
    ending: Ending
    source: str = "api"


class Completer:
    """Completes solves for one Celery app (whose result backend ``get()`` reads)."""

    def __init__(self, app: Celery, settings: Settings, state: State) -> None:
        self.app = app
        self.settings = settings
        self.state = state

    def complete(self, job: Job, ending: Ending, source: str = "api") -> bool:
        """End the solve of ``job``; False when something else ended it first."""
        return self.complete_many([Done(job, ending, source)])[0]

    def complete_many(self, items: Sequence[Done]) -> list[bool]:
        """End several solves with one Redis round trip."""
        if not items:
            return []
        board = self.state.board
        pipe = self.state.db.pipeline()
        for item in items:
            board.finish(self.completion(item), client=pipe)
        results = [finished(reply) for reply in board.run(pipe)]
        for item, result in zip(items, results, strict=True):
            self._after(item, result)
        return [r.claimed for r in results]

    def completion(self, item: Done) -> Completion:
        """The records the finish script stores for ``item``."""
        job, ending = item.job, item.ending
        method = job.request.method
        solve_time, source, code = None, None, None
        value: Any
        if isinstance(ending, Deliver):
            outcome = ending.outcome.to_dict()
            state, value = states.SUCCESS, outcome
            solve_time, source = ending.solve_time_s, item.source
        else:
            elapsed = round(time.time() - job.started, 3)
            outcome = Failed.from_exception(ending.error, method, elapsed).to_dict()
            state, value, code = states.FAILURE, ending.error, ending.error.code
        key, record = None, None
        if not job.pool:  # a refill's outcome goes to its pool, not to a caller
            key, record = self.result_record(job.solve_id, state, value)
        batch = job.batch
        return Completion(
            solve_id=job.solve_id,
            method=method,
            captcha_id=None if item.source == "pool" else job.captcha_id,
            result_key=key,
            result_value=record,
            result_ttl_s=int(self.app.backend.expires or DEFAULT_RESULT_TTL),
            batch_id=batch.id if batch else None,
            batch_entry=json.dumps({**outcome, "index": batch.index}) if batch else None,
            solve_time_s=solve_time,
            source=source,
            error_code=code,
        )

    def result_record(self, task_id: str, state: str, value: Any) -> tuple[str, str]:
        """Celery's result key and encoded record of ``task_id``, as its Redis result
        backend writes them (``AsyncResult.get()`` and Flower read them)."""
        backend = self.app.backend
        meta = {
            "status": state,
            "result": backend.encode_result(value, state),
            "traceback": None,
            "children": [],
            "date_done": datetime.now(UTC).isoformat(),
            "task_id": task_id,
        }
        return text(backend.get_key_for_task(task_id)), text(backend.encode(meta))

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
        limit = self.settings.visibility_timeout / 2
        self.app.send_task(
            names.SUBMIT,
            args=(job.to_dict(),),
            countdown=min(limit, max(0.0, countdown)),
            argsrepr=job.label(),
            kwargsrepr="{}",
        )

    def _after(self, item: Done, result: Finished) -> None:
        self.publish(result.handout)
        if not result.claimed:
            return
        job = item.job
        if job.pool:
            self._refill_done(job.pool, job, item.ending)
        request = job.request
        if request.uses_proxy_pool and "proxy_owner" not in request.params:
            self.state.proxies.release(f"solve:{job.solve_id}")

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
