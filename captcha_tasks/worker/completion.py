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
from ..outcome import Failed, parse_iso
from ..settings import get_settings
from ..state import store
from ..state.board import Completion, Finished, finished
from ..state.limiter import Handout
from ..state.lua import text
from .steps import Deliver, Fail, Job, label, request_of

log = logging.getLogger(__name__)

SUBMIT_TASK = "captcha_tasks.submit"
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

    def __init__(self, app: Celery) -> None:
        self.app = app

    def complete(self, job: Job, ending: Ending, source: str = "api") -> bool:
        """End the solve of ``job``; False when something else ended it first."""
        return self.complete_many([Done(job, ending, source)])[0]

    def complete_many(self, items: Sequence[Done]) -> list[bool]:
        """End several solves with one Redis round trip."""
        if not items:
            return []
        board = store.board()
        pipe = board.pipeline()
        for item in items:
            board.finish(self.completion(item), client=pipe)
        results = [finished(reply) for reply in board.run(pipe)]
        for item, result in zip(items, results, strict=True):
            self._after(item, result)
        return [r.claimed for r in results]

    def completion(self, item: Done) -> Completion:
        """The records the finish script stores for ``item``."""
        job, ending = item.job, item.ending
        method = job["request"]["method"]
        solve_time, source, code = None, None, None
        value: Any
        if isinstance(ending, Deliver):
            outcome, state, value = ending.outcome, states.SUCCESS, ending.outcome
            solve_time, source = ending.solve_time_s, item.source
        else:
            elapsed = round(time.time() - job["started"], 3)
            outcome = Failed.from_exception(ending.error, method, elapsed).to_dict()
            state, value, code = states.FAILURE, ending.error, ending.error.code
        key, record = None, None
        if not job.get("pool"):  # a refill's outcome goes to its pool, not to a caller
            key, record = self.result_record(job["solve_id"], state, value)
        batch = job.get("batch")
        return Completion(
            solve_id=job["solve_id"],
            method=method,
            captcha_id=None if item.source == "pool" else job.get("captcha_id"),
            result_key=key,
            result_value=record,
            result_ttl_s=int(self.app.backend.expires or DEFAULT_RESULT_TTL),
            batch_id=batch["id"] if batch else None,
            batch_entry=json.dumps({**outcome, "index": batch["index"]}) if batch else None,
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
            send_submit(self.app, parked.job)

    def _after(self, item: Done, result: Finished) -> None:
        self.publish(result.handout)
        if not result.claimed:
            return
        job = item.job
        pool = job.get("pool")
        if pool:
            _refill_done(pool, job, item.ending)
        request = request_of(job)
        if request.uses_proxy_pool and "proxy_owner" not in request.params:
            store.proxies().release(f"solve:{job['solve_id']}")


def send_submit(app: Celery, job: Job, countdown: float = 0.0) -> None:
    """Publish a submit message for ``job`` (shown in Flower by its label, no secrets).

    A countdown message held past the broker's visibility timeout is delivered twice, so
    a longer wait is cut to half of it: the submit runs early and waits again."""
    limit = get_settings().visibility_timeout / 2
    app.send_task(
        SUBMIT_TASK,
        args=(job,),
        countdown=min(limit, max(0.0, countdown)),
        argsrepr=label(job),
        kwargsrepr="{}",
    )


def _refill_done(pool: str, job: Job, ending: Ending) -> None:
    pools = store.pools()
    pools.refill_finished(pool, job["solve_id"])
    if not isinstance(ending, Deliver):
        return
    try:
        spec = pools.get(pool)
    except errors.ValidationError:
        return  # the pool was removed while its refill ran
    life = min(spec.ttl, parse_iso(ending.outcome["expires_at"]) - time.time())
    pools.add(pool, ending.outcome, life)
