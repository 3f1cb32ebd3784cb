"""Housekeeping: what keeps the pipeline alive between the steps of single captchas.

* :func:`tick` runs every :data:`TICK_S` seconds in **every** worker process (a worker
  bootstep, :class:`Housekeeping`), guarded so that one process per tick does the work:
  at every provider it reclaims expired thread leases, hands free slots to parked submits
  and hands out the deferred submits whose time came; it publishes again the submit and
  solve messages that were lost, at every provider alike (a worker died with them, or the
  broker dropped them between a worker's read and its bookkeeping), makes sure a poll
  round is pending while captchas are at a provider, moves the work of a provider out of
  rotation to the others, and sends the probes of open circuits (:func:`probe`).  Nothing
  here depends on beat, which is one process.
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
from ..core import health, routing
from ..core.answers import NOT_READY
from ..core.job import Job
from ..core.lanes import BACKGROUND
from ..core.threads import counted_as_ours
from ..methods import SolveRequest, build_request
from ..providers.inphp import BULK_MAX_IDS
from ..state.circuits import PROBE_MAX_S
from ..state.limiter import Drift
from ..state.master_changes import MOVED
from ..state.pools import PoolSpec
from . import names
from .adapter import Runner
from .celery_compat.messages import TIMER_STEP, keep_repeating

log = logging.getLogger(__name__)

#: Seconds between housekeeping ticks (one process per tick does the work).
TICK_S = 1.0
#: Checks a view of the provider's threads outlives (a missed check or two keeps it).
VIEW_HOLDS_CHECKS = 3
#: The least seconds a view of another client's threads holds (a late check on a busy
#: worker must not let it lapse and hand its threads to us).
VIEW_HOLD_MIN_S = 10.0


def tick(runner: Runner) -> bool:
    """One housekeeping pass; False when another process did this tick's."""
    state, settings = runner.state, runner.settings
    follow_master(runner)
    swept = state.owed.sweep(TICK_S, settings.celery.solve_queues, settings.celery.queue("submit"))
    if swept is None:
        return False
    for at in state.providers.values():
        ticked = at.limiter.tick()
        if ticked.repaired:
            log.warning(
                "provider %s: the limiter's counts by lane and tenant disagreed with its slots"
                " and parked submits (submits parked by a version without lanes?): rebuilt",
                at.name,
            )
        runner.completer.publish(ticked.handout)
        runner.publish_round(at.board.ensure_round(), at.name)
    # What the deployment is owed, whatever the provider: a lost submit message goes again
    # with its job (which names its provider), a lost solve message as it was.
    for parked in swept.lost:
        log.warning("solve %s: its submit message was lost; sending it again", parked.lease_id)
        runner.completer.send_submit(Job.from_json(parked.job))
    for solve in swept.unstarted:
        log.warning("solve %s: its message was lost; sending it again", solve.lease_id)
        kwargs = json.loads(solve.job)
        runner.app.send_task(names.SOLVE, kwargs=kwargs, task_id=solve.lease_id)
    _out_of_rotation(runner)
    for solve_id, followup in state.followups.lost():
        log.warning("solve %s: what was chained to it had not run; running it", solve_id)
        _rerun_followup(runner, solve_id, followup)
    every = settings.providers.threads_check_every
    if every > 0 and state.limiter.check_due(every):
        # off the timer thread: the checks are HTTP requests
        runner.app.send_task(names.CHECK_THREADS, expires=every)
    return True


def _out_of_rotation(runner: Runner) -> None:
    """Move the work of providers out of rotation to the others (their parked and deferred
    submits; the captchas of one that stopped answering or refuses its key), and send the
    probes that are due (off the timer thread: a probe is an HTTP request)."""
    state = runner.state
    for evacuate in routing.evacuations(state.circuits.read()):
        at = state.provider(evacuate.provider)
        for parked in at.limiter.evacuate():
            runner.completer.send_submit(Job.from_json(parked.job))
        if evacuate.captchas:
            runner.publish_round(at.board.evacuate(), at.name)
    for name in state.circuits.probes_due():
        runner.app.send_task(names.PROBE, args=(name,), expires=PROBE_MAX_S)


def probe(runner: Runner, provider: str) -> bool | None:
    """Ask a provider out of rotation for its balance: a good answer (money on it, for one
    whose balance ran out) puts it back.  Returns whether it is back (None: no answer)."""
    circuits = runner.state.circuits
    circuit = circuits.read().get(provider)
    if circuit is None or circuit.up:
        return None
    try:
        balance = runner.api(provider).balance()
    except errors.CaptchaTasksError as exc:
        circuits.probed(provider, False, code=exc.code)
        return None
    ok = health.back_in_rotation(circuit, balance)
    code = None if ok else "ERROR_ZERO_BALANCE"
    if circuits.probed(provider, ok, balance=balance, code=code):
        log.warning("provider %s is back in rotation (balance %g)", provider, balance)
    return ok


def check_providers(runner: Runner) -> dict[str, Any]:
    """Every provider's balance (for ``captcha-tasks providers`` and the metrics) and, for
    CaptchaAI-kind ones, its view of our threads (:func:`check_threads`)."""
    found: dict[str, Any] = {}
    for at in runner.state.providers.values():
        if at.limiter.held_s() > 0:  # an HTTP 429 holds every request of the account
            found[at.name] = {"error": "ERROR_RATE_LIMITED"}
            continue
        try:
            balance = runner.api(at.name).balance()
        except errors.CaptchaTasksError as exc:
            found[at.name] = {"error": exc.code}
            continue
        runner.state.circuits.saw_balance(at.name, balance)
        entry: dict[str, Any] = {"balance": balance}
        if at.spec.kind == "captchaai":
            drift = check_threads(runner, at.name)
            if drift is not None:
                entry.update(external=drift.now, ours=drift.ours)
        found[at.name] = entry
    return found


def follow_master(runner: Runner) -> None:
    """Add this process's reconnects to the deployment's count and, when the Redis master
    changed (a failover, a restart), make every message it may have lost due again (one
    process per change: see :mod:`captcha_tasks.state.master_changes`)."""
    master_changes = runner.state.master_changes
    master_changes.report("worker")
    change = master_changes.note_master()
    if change is not None:
        solves, owed = master_changes.reconcile()
        what = "the Redis master changed" if change == MOVED else "Redis restarted"
        log.warning(
            "%s: sending again the %d solve messages and %d submits it may have lost (a"
            " copy that was not lost is ignored)",
            what,
            solves,
            owed,
        )


def _rerun_followup(runner: Runner, solve_id: str, followup: str) -> None:
    """Run the follow-up of a solve whose completing process died before running it, with
    the outcome stored for its caller."""
    read = runner.results.stored(solve_id)
    if not read.ready:  # the outcome expired: nothing to hand on
        runner.state.followups.done(solve_id)
        return
    runner.completer.run_followup(solve_id, followup, read.state, read.value)


def check_threads(runner: Runner, provider: str | None = None) -> Drift | None:
    """Compare a provider's working threads with the slots we hold: threads it counts
    beyond ours belong to another client of the key, and ours shrink to leave them alone
    (until the next check finds them gone).  None when the API does not say."""
    every = runner.settings.providers.threads_check_every
    at = runner.state.provider(provider)
    limiter = at.limiter
    if limiter.poll_wait(1) > 0:  # the res.php budget, or an HTTP 429, holds the account
        return None
    held_before = limiter.held_slots()
    at_provider = at.board.at_provider()
    api = runner.api(at.name)
    try:
        info = api.threads_info()
        if info is None or "working_threads" not in info:
            return None
        # A captcha the provider finished before we polled it holds our slot but none of
        # its threads: asked right after the count, "not ready" proves it was counted.
        # Asked only while another client shows or was seen (alone on the key, nothing
        # to count: no res.php that pingback would have saved).
        held_after = limiter.held_slots()
        held_any = set(held_before) | set(held_after)  # ours at the count
        shows = info["working_threads"] > len(held_any) or limiter.external() > 0
        finished = _finished(api, at_provider) if shows else set()
    except errors.RateLimited as exc:
        limiter.pause(health.account_hold(exc) or 0.0)
        return None
    submitted = {job.solve_id for job in at_provider.values()}
    ours = counted_as_ours(held_before, held_after, submitted, finished, shows)
    drift = limiter.see_provider(info["working_threads"], view_hold_s(every), ours)
    if drift.now and not drift.before:
        log.warning(
            "another client is using the API key of provider %s: it counts %d working"
            " threads, we hold %d; leaving %d to it until it stops",
            at.name,
            info["working_threads"],
            drift.ours,
            drift.now,
        )
    elif drift.before and not drift.now:
        log.warning(
            "the other client of provider %s's key has stopped; all threads are ours again",
            at.name,
        )
    return drift


def view_hold_s(every: float) -> float:
    """How long a view of another client's threads holds: until a later check replaces it,
    a few checks on (a check comes at most once a tick, and may be late), never less than
    :data:`VIEW_HOLD_MIN_S`."""
    return max(VIEW_HOLDS_CHECKS * max(every, TICK_S), VIEW_HOLD_MIN_S)


def _finished(api: Any, at_provider: dict[str, Job]) -> set[str]:
    """The solves (lease ids) whose captcha the provider has finished, in one bulk
    ``res.php`` about the captchas whose answer fits one (as the poll rounds ask); empty
    when it does not answer in bulk (every slot then counts as ours)."""
    solves = {cid: job.solve_id for cid, job in at_provider.items() if job.request.pipe_safe}
    ids = list(solves)[:BULK_MAX_IDS]
    try:
        answers = api.get_many(ids) if ids else None
    except errors.CaptchaTasksError:
        return set()
    if answers is None:
        return set()
    return {solves[cid] for cid, value in answers.items() if value is not NOT_READY}


class Housekeeping(bootsteps.StartStopStep):
    """Runs :func:`tick` on the worker's timer (threads, prefork and gevent pools alike)."""

    requires = {TIMER_STEP}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.tref: Any = None
        self.worker: Any = None
        self.runner: Runner | None = None

    def start(self, worker: Any) -> None:
        runtime = worker.app.runtime()
        runtime.worker = worker
        runtime.housekeeping = self
        self.worker, self.runner = worker, runtime.runner
        self.arm()

    def arm(self) -> None:
        """Put the tick on the worker's timer, unless it is there: Celery 5.6 empties the
        whole timer when the broker connection drops (5.7 takes off only what its consumer
        put there), which would end housekeeping for good (see :class:`KeepTicking`)."""
        if self.worker is None or self.runner is None:
            return
        self.tref = keep_repeating(self.worker, self.tref, TICK_S, _safe_tick, (self.runner,))

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        self.worker = None


class KeepTicking(bootsteps.StartStopStep):
    """A consumer step: each time the consumer (re)connects to the broker, housekeeping's
    tick is on the worker's timer again (:meth:`Housekeeping.arm`)."""

    def start(self, consumer: Any) -> None:
        step = getattr(consumer.app.runtime(), "housekeeping", None)
        if step is not None:
            step.arm()


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
            margin_s=settings.pools.prewarm_every + settings.solving.poll_interval,
            free_slots=state.limiter.free_for_refills(),
        )
        for _ in range(count):
            _start_refill(runner, spec.name, request)
        return count
    finally:
        pools.unlock_top_up(spec.name)


def _start_refill(runner: Runner, pool: str, request: SolveRequest) -> None:
    refill_id = f"refill-{uuid.uuid4().hex}"
    timeout = runner.settings.solving.solve_timeout
    job = Job.new(refill_id, request, time.time(), timeout, pool=pool, lane=BACKGROUND)
    runner.state.pools.refill_started(pool, refill_id, timeout)
    runner.resend(job, 0.0, unclaim=False)
