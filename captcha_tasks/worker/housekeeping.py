"""Housekeeping: what keeps the pipeline alive between the steps of single captchas.

* :func:`tick` runs every :data:`TICK_S` seconds in **every** worker process (a worker
  bootstep, :class:`Housekeeping`), guarded so that one process per tick does the work:
  it reclaims expired thread leases, hands free slots to parked submits, publishes again
  the submit and solve messages that were lost (a worker died with them, or the broker
  dropped them between a worker's read and its bookkeeping), and makes sure a poll round
  is pending while captchas are at the provider.  Nothing here depends on beat, which is
  one process.
* :func:`top_up` keeps token pools filled; beat's ``prewarm`` tick and every pool take
  call it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from celery import bootsteps

from .. import errors
from ..lanes import BACKGROUND
from ..methods import SolveRequest, build_request
from ..state.limiter import Drift
from ..state.pools import PoolSpec
from . import names
from .adapter import Runner
from .job import Job

log = logging.getLogger(__name__)

#: Seconds between housekeeping ticks (one process per tick does the work).
TICK_S = 1.0
#: Checks a view of the provider's threads outlives (a missed check or two keeps it).
VIEW_HOLDS_CHECKS = 3


def tick(runner: Runner) -> bool:
    """One housekeeping pass; False when another process did this tick's."""
    state, settings = runner.state, runner.settings
    swept = state.limiter.sweep(TICK_S, settings.solve_queues)
    if swept is None:
        return False
    if swept.repaired:
        log.warning(
            "the limiter's counts by lane and tenant disagreed with its slots and parked"
            " submits (submits parked by a version without lanes?): rebuilt"
        )
    runner.completer.publish(swept.handout)
    for parked in swept.lost:
        log.warning("solve %s: its submit message was lost; sending it again", parked.lease_id)
        runner.completer.send_submit(Job.from_json(parked.job))
    for solve in swept.unstarted:
        log.warning("solve %s: its message was lost; sending it again", solve.lease_id)
        kwargs = json.loads(solve.job)
        runner.app.send_task(names.SOLVE, kwargs=kwargs, task_id=solve.lease_id)
    runner.publish_round(state.board.ensure_round())
    for solve_id, followup in state.followups.lost():
        log.warning("solve %s: what was chained to it had not run; running it", solve_id)
        _rerun_followup(runner, solve_id, followup)
    every = settings.threads_check_every
    if every > 0 and state.limiter.check_due(every):
        # off the timer thread: the check is an HTTP request
        runner.app.send_task(names.CHECK_THREADS, expires=every)
    return True


def _rerun_followup(runner: Runner, solve_id: str, followup: str) -> None:
    """Run the follow-up of a solve whose completing process died before running it, with
    the outcome stored for its caller."""
    read = runner.results.stored(solve_id)
    if not read.ready:  # the outcome expired: nothing to hand on
        runner.state.followups.done(solve_id)
        return
    runner.completer.run_followup(solve_id, followup, read.state, read.value)


def check_threads(runner: Runner) -> Drift | None:
    """Compare the provider's working threads with the slots we hold: threads it counts
    beyond ours belong to another client of the key, and ours shrink to leave them alone
    (until the next check finds them gone).  None when the API does not say."""
    every = runner.settings.threads_check_every
    limiter = runner.state.limiter
    if limiter.poll_wait(1) > 0:  # the res.php budget, or an HTTP 429, holds the account
        return None
    try:
        info = runner.api().threads_info()
    except errors.RateLimited as exc:
        limiter.pause(exc.retry_after)
        return None
    if info is None or "working_threads" not in info:
        return None
    drift = limiter.see_provider(info["working_threads"], VIEW_HOLDS_CHECKS * every)
    if drift.now and not drift.before:
        log.warning(
            "another client is using this API key: the provider counts %d working threads,"
            " we hold %d; leaving %d to it until it stops",
            info["working_threads"],
            drift.ours,
            drift.now,
        )
    elif drift.before and not drift.now:
        log.warning("the other client of this API key has stopped; all threads are ours again")
    return drift


class Housekeeping(bootsteps.StartStopStep):
    """Runs :func:`tick` on the worker's timer (threads, prefork and gevent pools alike)."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        runtime = worker.app.runtime()
        runtime.worker = worker
        runner = runtime.runner
        self.tref = worker.timer.call_repeatedly(TICK_S, _safe_tick, (runner,), priority=10)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None


def _safe_tick(runner: Runner) -> None:
    try:
        tick(runner)
    except errors.StoreUnavailable:
        log.debug("housekeeping skipped: Redis is unavailable")
    except Exception:  # the timer thread must survive anything
        log.exception("housekeeping tick failed")


# -- pools ------------------------------------------------------------------------------


def top_up(runner: Runner, spec: PoolSpec) -> int:
    """Start the refills ``spec``'s pool needs now; returns how many."""
    state, settings = runner.state, runner.settings
    pools = state.pools
    if not pools.lock_top_up(spec.name):
        return 0  # another top-up of this pool is running right now
    try:
        pools.sweep(spec.name)
        request = build_request(**spec.solve_kwargs())
        timing = state.solve_times.timing(request.method, request.initial_wait)
        count = pools.plan(
            spec.name,
            solve_time_s=timing.typical,
            margin_s=settings.prewarm_every + settings.poll_interval,
            free_slots=state.limiter.free_for_refills(),
        )
        for _ in range(count):
            _start_refill(runner, spec.name, request)
        return count
    finally:
        pools.unlock_top_up(spec.name)


def _start_refill(runner: Runner, pool: str, request: SolveRequest) -> None:
    refill_id = f"refill-{uuid.uuid4().hex}"
    timeout = runner.settings.solve_timeout
    job = Job.new(refill_id, request, time.time(), timeout, pool=pool, lane=BACKGROUND)
    runner.state.pools.refill_started(pool, refill_id, timeout)
    runner.resend(job, 0.0, unclaim=False)
