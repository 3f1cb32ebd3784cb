"""Celery tasks: ``solve`` replaces itself with the chain ``submit | poll``.

    solve(method, sitekey, pageurl, **params)        public; validated before queueing
      └─ submit(job) ──► poll(job) ──► poll(job) ... ──► outcome dict on solve's id

``poll`` reschedules itself by re-publishing its own message with a countdown (the chain
and the task id are kept; no RETRY state is written and no worker sleeps).  A job is a
plain JSON dict that carries its own budgets: transport errors, resubmits and the
overall deadline.  The API key is never in a job: workers read it from settings.
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore

from .. import errors
from ..client import NOT_READY, Answer
from ..methods import METHODS, POOL_PROXY, SolveRequest, build_request
from ..outcome import Failed, Solved, iso, parse_iso
from ..redact import SECRET_PARAMS, mask_params
from ..settings import get_settings
from ..state import store, timing
from ..state.limiter import Handout
from ..stream import cancelled, emit
from .app import app

log = logging.getLogger(__name__)

Job = dict[str, Any]

#: A token is discarded when less than this many seconds of its life are left.
EXPIRY_MARGIN = 1.0
BACKOFF_BASE = 0.5
BACKOFF_CAP = 30.0


#: Task results are shown (worker log, Flower) cut at this many characters; outcome dicts
#: put the token last, so it is cut short or left out.
RESULT_REPR_MAX = 230


class SolveTask(Task):
    """``solve`` validates its arguments at the call site, before anything is queued."""

    resultrepr_maxsize = RESULT_REPR_MAX

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        kwargs = dict(kwargs or {})
        batch = kwargs.pop("_batch", None)
        kwargs = normalize_solve_args(args or (), kwargs)
        # Flower and task events show this instead of the arguments: no proxy password,
        # no cookie values, no image body.
        options.setdefault("kwargsrepr", repr(mask_params(kwargs)))
        if batch is not None:
            kwargs["_batch"] = batch
        return super().apply_async((), kwargs, **options)


def normalize_solve_args(args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Validate ``solve``'s arguments; returns them as keyword arguments."""
    names = ("method", "sitekey", "pageurl")
    if len(args) > len(names):
        raise errors.ValidationError("solve takes at most method, sitekey, pageurl positionally")
    merged = dict(zip(names, args, strict=False))
    for name in merged:
        if name in kwargs:
            raise errors.ValidationError(f"solve got {name} twice")
    merged.update(kwargs)
    request = build_request(**merged)
    return {
        "method": request.method,
        "sitekey": request.sitekey,
        "pageurl": request.pageurl,
        **request.params,
    }


@app.task(bind=True, base=SolveTask, name="captcha_tasks.solve", shared=False)
def solve(
    self: Task, method: str, sitekey: str | None = None, pageurl: str | None = None, **params: Any
) -> Any:
    """Solve one captcha; the result is an outcome dict (see :mod:`captcha_tasks.outcome`)."""
    started = time.time()
    batch = params.pop("_batch", None)
    request = build_request(method, sitekey, pageurl, **params)
    job = new_job(self.request.id, request, started)
    job["batch"] = batch
    if cancelled(job):
        raise Ignore()  # the batch was abandoned before this solve started
    pooled = _from_pool(request, started)
    if pooled is not None:
        emit(job, pooled)
        return pooled
    _stash_secrets(job, request)
    return self.replace(_chain(job))


def _chain(job: Job) -> Any:
    return submit.s(job).set(argsrepr=_job_repr(job)) | poll.s()


def _job_repr(job: Job) -> str:
    """A readable, secret-free label of a job for Flower and the worker log."""
    request = job["request"]
    parts = [request["method"], str(request.get("sitekey") or ""), f"solve={job['solve_id']}"]
    if job.get("captcha_id"):
        parts.append(f"captcha={job['captcha_id']}")
    if job.get("attempt"):
        parts.append(f"attempt={job['attempt']}")
    return "(" + " ".join(p for p in parts if p) + ")"


def _stash_secrets(job: Job, request: SolveRequest) -> None:
    """Keep the caller's proxy and cookies out of every later task message: they wait in
    Redis for the submit that needs them."""
    secret = {k: v for k, v in request.params.items() if k in SECRET_PARAMS and v != POOL_PROXY}
    if not secret:
        return
    r, key = store.redis_client(), store.keys().request_secrets(job["solve_id"])
    pipe = r.pipeline(transaction=True)
    pipe.hset(key, mapping={k: json.dumps(v) for k, v in secret.items()})
    pipe.expire(key, int(get_settings().solve_timeout) + 600)
    pipe.execute()
    params = {k: v for k, v in request.params.items() if k not in secret}
    job["request"] = {**job["request"], "params": params, "secrets": sorted(secret)}


def _full_request(job: Job) -> SolveRequest:
    """The job's request with its stashed proxy and cookies put back (submit only)."""
    request = SolveRequest.from_dict(job["request"])
    names = job["request"].get("secrets")
    if not names:
        return request
    stored = store.redis_client().hmget(store.keys().request_secrets(job["solve_id"]), names)
    if any(v is None for v in stored):
        raise errors.SolveTimeout("the solve's proxy/cookies expired before it was submitted")
    found = {n: json.loads(str(v)) for n, v in zip(names, stored, strict=True)}
    params = {**request.params, **found}
    return SolveRequest(request.method, request.sitekey, request.pageurl, params)


def new_job(
    solve_id: str, request: SolveRequest, now: float | None = None, pool: str | None = None
) -> Job:
    """A solve's state, carried from task to task (JSON, no secrets)."""
    now = time.time() if now is None else now
    return {
        "solve_id": solve_id,
        "request": request.to_dict(),
        "started": now,
        "deadline": now + get_settings().solve_timeout,
        "attempt": 0,
        "transport_errors": 0,
        "pool": pool,
    }


def _from_pool(request: SolveRequest, started: float) -> dict[str, Any] | None:
    if request.per_request:
        return None
    pools = store.pools()
    spec = pools.find(request)
    if spec is None:
        return None
    record = pools.take(spec.name)
    prewarm.delay(spec.name)  # top up at once; beat's tick is only the safety net
    if record is None:
        return None
    now = time.time()
    return Solved(
        token=record["token"],
        captcha_id=str(record["captcha_id"]),
        method=request.method,
        source="pool",
        elapsed_s=round(now - started, 3),
        solved_at=record["solved_at"],
        expires_at=iso(now + float(record["remaining_s"])),
    ).to_dict()


@app.task(bind=True, name="captcha_tasks.submit", shared=False)
def submit(self: Task, job: Job) -> Job:
    """Take a thread slot (or park), submit the job's captcha at most once per attempt,
    and hand the job to ``poll``."""
    try:
        polled = _submit_step(self, job)
    except errors.CaptchaTasksError as exc:
        _finish(job)
        _count_error(exc.code, exc)
        raise
    _schedule_first_poll(self, polled)
    return polled


def _schedule_first_poll(task: Task, job: Job) -> None:
    """Give the chain's ``poll`` its first countdown, and keep its message so that a bulk
    poll can wake it early."""
    chain = task.request.chain
    if not chain:
        return  # submit called on its own (tests, redelivery tools)
    following = chain[-1]  # the trace publishes this one with our return value
    options = following.setdefault("options", {})
    options["countdown"] = max(0.0, job["next_poll_at"] - time.time())
    options["argsrepr"] = _job_repr(job)
    wake = app.signature(following)
    wake.args = (job,)
    wake.options.pop("countdown", None)
    store.answer_board().remember_poll(job["captcha_id"], dict(wake))


def _submit_step(task: Task, job: Job) -> Job:
    limiter = store.limiter()
    try:
        if cancelled(job):
            log.info("solve %s dropped: its batch was abandoned", job["solve_id"])
            _finish(job, emit_outcome=False)
            raise Ignore()
        if not _hold_slot(task, job):
            log.info("solve %s parked: every thread is busy", job["solve_id"])
            raise Ignore()
        wait = limiter.submit_wait()
        if wait > 0:
            _again(task, job, wait)
        return submit_job(job)
    except errors.RetryableError as exc:
        _count_error(exc.code, exc)
        _transport_retry(task, job, exc)
    except errors.ProxyError as exc:
        _count_error(exc.code, exc)
        _pool_proxy_failed(task, job, exc)


def _hold_slot(task: Task, job: Job) -> bool:
    payload = {
        "sig": dict(task.signature_from_request(task.request, args=(job,), kwargs={})),
        "result_id": job["solve_id"],
        "pool": job.get("pool"),
        "batch": job.get("batch"),
        "method": job["request"]["method"],
    }
    return store.limiter().acquire(
        job["solve_id"],
        payload=payload,
        deadline_in_s=job["deadline"] - time.time(),
        refill=job.get("pool") is not None,
    )


@app.task(bind=True, name="captcha_tasks.poll", resultrepr_maxsize=RESULT_REPR_MAX, shared=False)
def poll(self: Task, job: Job) -> dict[str, Any]:
    """Ask for the job's answer; reschedule while it is not ready."""
    try:
        outcome = _poll_step(self, job)
    except errors.CaptchaTasksError as exc:
        _claim(job)
        _finish(job, failure=exc)
        _count_error(exc.code, exc)
        raise
    _finish(job, outcome)
    return outcome


def _claim(job: Job) -> None:
    """Only one copy of a poll (scheduled, woken or redelivered) finishes a captcha."""
    if not store.answer_board().claim(job["captcha_id"]):
        raise Ignore()


def _poll_step(task: Task, job: Job) -> dict[str, Any]:
    now = time.time()
    board, poller = store.answer_board(), store.poller()
    method = job["request"]["method"]
    baton = bool(job.get("baton"))
    if not board.in_flight(job["captcha_id"]):
        if baton:
            poller.lead_only(_typical_solve_time(method))
        raise Ignore()  # another copy of this poll already finished the captcha
    wait = job["next_poll_at"] - now
    if not baton and wait > 0.05 and board.stored_answer(job["captcha_id"]) is None:
        _again(task, job, wait)  # early, and no bulk poll has woken us with an answer
    try:
        store.limiter().renew(job["solve_id"])
        answer = poller.fetch(job["captcha_id"], method, _typical_solve_time(method))
        if baton and (answer is NOT_READY or isinstance(answer, float)):
            raise Ignore()  # the baton's work is done; this captcha's own poll goes on
        if isinstance(answer, float):
            _again(task, job, answer)  # the account's res.php budget is spent for now
    except errors.RetryableError as exc:
        if baton:
            raise Ignore() from None  # this captcha's own poll retries
        _count_error(exc.code, exc)
        _transport_retry(task, job, exc)
    except errors.ResubmitError as exc:
        _count_error(exc.code, exc)
        _resubmit(task, job, exc)
    except errors.ProxyError as exc:
        _count_error(exc.code, exc)
        _pool_proxy_failed(task, job, exc)
    if answer is NOT_READY:
        _not_ready(task, job, now)
    return _deliver(task, job, answer, now)


def _finish(
    job: Job,
    outcome: dict[str, Any] | None = None,
    failure: BaseException | None = None,
    emit_outcome: bool = True,
) -> None:
    """The solve is over: give its thread back, fill its pool if it was a refill, and
    report the outcome to its batch."""
    handout = store.limiter().release(job["solve_id"])
    publish_handout(handout)
    if job["request"].get("secrets"):
        store.redis_client().delete(store.keys().request_secrets(job["solve_id"]))
    if emit_outcome:
        method = job["request"]["method"]
        elapsed = round(time.time() - job["started"], 3)
        failed = Failed.from_exception(failure or Exception("no outcome"), method, elapsed)
        emit(job, outcome or failed.to_dict())
    request = SolveRequest.from_dict(job["request"])
    if request.uses_proxy_pool and "proxy_owner" not in request.params:
        store.proxies().release(_proxy_owner(request, job))
    pool = job.get("pool")
    if pool:
        _refill_done(pool, job["solve_id"], outcome)


def _refill_done(pool: str, refill_id: str, outcome: dict[str, Any] | None) -> None:
    pools = store.pools()
    pools.refill_finished(pool, refill_id)
    if outcome is None:
        return
    spec = pools.get(pool)
    life = min(spec.ttl, parse_iso(outcome["expires_at"]) - time.time())
    pools.add(pool, outcome, life)


def publish_handout(handout: Handout) -> None:
    """Publish the parked submits that got a slot; fail those whose deadline passed."""
    for parked in handout.dispatched:
        app.signature(parked.payload["sig"]).apply_async()
    for parked in handout.dropped:
        exc = errors.SolveTimeout(
            "the solve deadline passed while waiting for a free thread", "ERROR_SOLVE_TIMEOUT"
        )
        app.backend.mark_as_failure(parked.payload["result_id"], exc)
        emit(parked.payload, Failed.from_exception(exc, parked.payload.get("method")).to_dict())
        if parked.payload.get("pool"):
            store.pools().refill_finished(parked.payload["pool"], parked.lease_id)


# -- submit --------------------------------------------------------------------------


def submit_job(job: Job, now: float | None = None) -> Job:
    """Submit (or, on redelivery, reuse) the captcha of the job's current attempt."""
    request = SolveRequest.from_dict(job["request"])
    r, keys = store.redis_client(), store.keys()
    record: dict[str, str] = r.hgetall(keys.submission(job["solve_id"]))  # type: ignore[assignment]
    life = token_life(request)
    now = time.time() if now is None else now
    if _reusable(record, job["attempt"], life, now):
        captcha_id, submitted_at = record["captcha_id"], float(record["submitted_at"])
        log.info(
            "reusing captcha %s for solve %s (redelivered submit)", captcha_id, job["solve_id"]
        )
    else:
        captcha_id = store.api_client().submit(_with_pool_proxy(_full_request(job), job))
        submitted_at = time.time()
        _remember_submission(r, keys.submission(job["solve_id"]), captcha_id, job, life)
    wait = _first_wait(request)
    earliest = submitted_at + _earliest_ready(request)
    store.answer_board().register(captcha_id, request.method, job["solve_id"], earliest)
    return {
        **job,
        "captcha_id": captcha_id,
        "submitted_at": submitted_at,
        "next_poll_at": submitted_at + wait,
        "last_not_ready": None,
        "polls": 0,
    }


def _proxy_owner(request: SolveRequest, job: Job) -> str:
    return str(request.params.get("proxy_owner") or f"solve:{job['solve_id']}")


def _with_pool_proxy(request: SolveRequest, job: Job) -> SolveRequest:
    """Swap ``proxy="pool"`` for a proxy from the shared pool (sticky per owner)."""
    if not request.uses_proxy_pool:
        return request
    from ..state.proxies import split

    proxy = store.proxies().acquire(_proxy_owner(request, job))
    if proxy is None:
        raise errors.NoProxyAvailable("every pooled proxy is taken or cooling off")
    return request.with_proxy(*split(proxy))


def _pool_proxy_failed(task: Task, job: Job, exc: errors.CaptchaTasksError) -> NoReturn:
    """A pooled proxy the API reported bad: quarantine it and solve again with another.
    A proxy the caller passed in stays fatal."""
    request = SolveRequest.from_dict(job["request"])
    if not request.uses_proxy_pool:
        raise exc
    log.warning(
        "captcha %s: pooled proxy failed (%s); quarantined", job.get("captcha_id"), exc.code
    )
    store.proxies().replace(_proxy_owner(request, job))
    _resubmit(task, job, exc)


def _reusable(record: dict[str, str], attempt: int, life: float, now: float) -> bool:
    if not record or record.get("attempt") != str(attempt):
        return False
    return now - float(record["submitted_at"]) < life


def _remember_submission(r: Any, key: str, captcha_id: str, job: Job, life: float) -> None:
    pipe = r.pipeline(transaction=True)
    pipe.hset(
        key,
        mapping={
            "captcha_id": captcha_id,
            "attempt": job["attempt"],
            "submitted_at": f"{time.time():.3f}",
        },
    )
    pipe.expire(key, int(life * 2) + 60)
    pipe.execute()


# -- poll outcomes ---------------------------------------------------------------------


def _not_ready(task: Task, job: Job, now: float) -> NoReturn:
    interval = store.poller().next_interval(job["request"]["method"])
    job = {**job, "polls": job.get("polls", 0) + 1, "last_not_ready": now}
    job["next_poll_at"] = now + interval
    _again(task, job, interval)


def _deliver(task: Task, job: Job, answer: Answer, now: float) -> dict[str, Any]:
    _claim(job)
    request = SolveRequest.from_dict(job["request"])
    r, keys = store.redis_client(), store.keys()
    timing.record_solve_time(r, keys, request.method, now - job["submitted_at"])
    # The token was made after the last "not ready" answer (or the submit) at the earliest.
    born = job.get("last_not_ready") or job["submitted_at"]
    expires = born + token_life(request)
    if time.time() >= expires - EXPIRY_MARGIN:
        log.warning("captcha %s answer expired before delivery; solving again", job["captcha_id"])
        expired = errors.TokenExpired("token expired before delivery", captcha_id=job["captcha_id"])
        _resubmit(task, job, expired, claimed=True)
    r.hincrby(keys.solved_counter(request.method), "api", 1)
    return Solved(
        token=answer,
        captcha_id=job["captcha_id"],
        method=request.method,
        source="api",
        elapsed_s=round(time.time() - job["started"], 3),
        solved_at=iso(now),
        expires_at=iso(expires),
    ).to_dict()


def _resubmit(
    task: Task, job: Job, exc: errors.CaptchaTasksError, claimed: bool = False
) -> NoReturn:
    if job.get("resubmits", 0) >= get_settings().max_resubmits:
        raise exc
    if time.time() >= job["deadline"]:
        raise errors.SolveTimeout(
            "solve deadline passed", captcha_id=job.get("captcha_id")
        ) from exc
    log.info("captcha %s: %s; submitting a new one", job.get("captcha_id"), exc.code)
    fresh = {**job, "attempt": job["attempt"] + 1, "resubmits": job.get("resubmits", 0) + 1}
    if task.name == submit.name:
        _again(task, fresh, 0)  # submit's chain already ends in poll
    if not claimed:
        _claim(job)  # a woken or redelivered copy of this poll may resubmit too: once only
    task.replace(_chain(fresh))
    raise Ignore()  # replace() always raises; this keeps type checkers informed


def _transport_retry(task: Task, job: Job, exc: errors.CaptchaTasksError) -> NoReturn:
    count = job.get("transport_errors", 0) + 1
    if count > get_settings().transport_retries:
        raise errors.RetriesExhausted(
            f"gave up after {count - 1} retries; last error {exc.code}", exc.code, exc.captcha_id
        ) from exc
    delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (count - 1)) * random.uniform(0.5, 1.0)
    log.info("%s: %s; retrying in %.1fs", task.name, exc.code, delay)
    _again(task, {**job, "transport_errors": count}, delay)


def _again(task: Task, job: Job, countdown: float) -> NoReturn:
    """Re-publish this task with ``job`` after ``countdown`` seconds, keeping its chain."""
    remaining = job["deadline"] - time.time()
    if remaining <= 0:
        raise errors.SolveTimeout("solve deadline passed", captcha_id=job.get("captcha_id"))
    cap = min(BACKOFF_CAP, get_settings().visibility_timeout / 2)
    countdown = max(0.0, min(countdown, remaining, cap))
    sig = task.signature_from_request(
        task.request,
        args=(job,),
        kwargs={},
        countdown=countdown,
        retries=(task.request.retries or 0) + 1,
        argsrepr=_job_repr(job),  # Celery does not carry argsrepr over by itself
        kwargsrepr="{}",
    )
    if task.name == poll.name:
        # A bulk poll that sees this captcha finish re-publishes this message at once.
        wake = task.signature_from_request(task.request, args=(job,), kwargs={})
        store.answer_board().remember_poll(job["captcha_id"], dict(wake))
    sig.apply_async()
    raise Ignore()


# Timing figures come from Redis samples; each process reads them at most once a second.
_MEMO: dict[tuple[Any, ...], tuple[float, float]] = {}


def _memo(key: tuple[Any, ...], compute: Callable[[], float]) -> float:
    now = time.monotonic()
    cached = _MEMO.get(key)
    if cached and cached[0] > now:
        return cached[1]
    value = compute()
    _MEMO[key] = (now + 1.0, value)
    return value


def _first_wait(request: SolveRequest) -> float:
    """The adaptive first-poll wait of the request's method."""
    method, default = request.method, request.initial_wait
    return _memo(("first", method, default), lambda: _timing(timing.first_wait, method, default))


def _earliest_ready(request: SolveRequest) -> float:
    """Seconds after submit before which a bulk poll need not ask for the captcha."""
    method, default = request.method, request.initial_wait
    return _memo(
        ("earliest", method, default), lambda: _timing(timing.earliest_ready, method, default)
    )


def _typical_solve_time(method: str) -> float:
    """The method's median solve time."""
    default = METHODS[method].initial_wait
    return _memo(("typical", method), lambda: _timing(timing.typical_solve_time, method, default))


def _timing(figure: Callable[..., float], method: str, default: float) -> float:
    return figure(store.redis_client(), store.keys(), get_settings(), method, default)


def pass_baton(message: dict[str, Any], countdown: float) -> None:
    """Publish a copy of a captcha's poll as the next bulk leader."""
    sig = app.signature(message)
    job = dict(sig.args[0])
    job["baton"] = True
    sig.args = (job,)
    sig.apply_async(countdown=countdown)


def finished_elsewhere(lease_ids: list[str], messages: list[dict[str, Any]]) -> None:
    """A bulk poll found these captchas finished: free their threads, wake their polls."""
    limiter = store.limiter()
    for lease_id in lease_ids:
        publish_handout(limiter.release(lease_id))
    for message in messages:
        app.signature(message).apply_async()


def token_life(request: SolveRequest) -> float:
    overrides = get_settings().token_lifetimes
    return float(overrides.get(request.method, request.spec.token_life))


def _count_error(code: str, exc: BaseException | None = None) -> None:
    if exc is not None:
        if getattr(exc, "_counted", False):
            return  # an inner handler counted it before re-raising
        exc._counted = True  # type: ignore[attr-defined]
    try:
        store.redis_client().hincrby(store.keys().api_errors(), code, 1)
    except Exception:  # metrics must never break a solve
        log.debug("could not count error %s", code, exc_info=True)


@app.task(name="captcha_tasks.report", shared=False)
def report_task(captcha_id: str, good: bool) -> None:
    """Send ``reportgood`` / ``reportbad`` for a solved captcha."""
    store.api_client().report(captcha_id, good=good)


def report(result: dict[str, Any], *, good: bool) -> Any:
    """Flag a solved token as accepted (``good=True``) or rejected by the target site.

    Runs on a worker (which holds the API key); returns the task's ``AsyncResult``.
    """
    captcha_id = result.get("captcha_id")
    if not captcha_id:
        raise errors.ValidationError("report() needs a solve result with a captcha_id")
    if result.get("source") == "pool" and not good:
        log.info("reporting pooled captcha %s as bad", captcha_id)
    return report_task.delay(str(captcha_id), bool(good))


# -- pools and housekeeping -------------------------------------------------------------


@app.task(name="captcha_tasks.prewarm", shared=False)
def prewarm(pool: str | None = None) -> dict[str, int]:
    """Beat's tick (and every take): hand out freed slots, then top pools up.

    Returns the refills dispatched per pool.
    """
    publish_handout(store.limiter().release(None))
    pools = store.pools()
    specs = [pools.get(pool)] if pool else pools.all()
    return {spec.name: _top_up(spec) for spec in specs}


def _top_up(spec: Any) -> int:
    r, keys, settings = store.redis_client(), store.keys(), get_settings()
    lock = keys.pool_prewarm_lock(spec.name)
    if not r.set(lock, "1", nx=True, px=5000):
        return 0  # another top-up of this pool is running right now
    try:
        pools = store.pools()
        pools.sweep(spec.name)
        request = build_request(**spec.solve_kwargs())
        count = pools.plan(
            spec.name,
            solve_time_s=timing.typical_solve_time(
                r, keys, settings, request.method, request.initial_wait
            ),
            margin_s=settings.prewarm_every + settings.poll_interval,
            free_slots=store.limiter().free_for_refills(),
        )
        for _ in range(count):
            _dispatch_refill(spec.name, request)
        return count
    finally:
        r.delete(lock)


def _dispatch_refill(pool: str, request: SolveRequest) -> None:
    refill_id = f"refill-{uuid.uuid4().hex}"
    job = new_job(refill_id, request, pool=pool)
    store.pools().refill_started(pool, refill_id, get_settings().solve_timeout)
    (submit.s(job).set(argsrepr=_job_repr(job)) | poll.s().set(task_id=refill_id)).apply_async()


def register_configured_pools() -> int:
    """Register the pools of ``CAPTCHAAI_POOLS`` and the proxies of ``CAPTCHAAI_PROXIES``
    in Redis (idempotent)."""
    settings = get_settings()
    pools = store.pools()
    for spec in settings.pools:
        pools.register(spec)
    if settings.proxies:
        store.proxies().add(*settings.proxies)
    return len(settings.pools)


def create_pool(
    name: str,
    method: str,
    sitekey: str,
    pageurl: str,
    *,
    size: int,
    ttl: float,
    min_remaining: float = 0.0,
    **params: Any,
) -> Any:
    """Declare a token pool from Python; it is registered in Redis for beat and workers."""
    from ..state.pools import PoolSpec

    spec = PoolSpec.from_dict(
        {
            "name": name,
            "method": method,
            "sitekey": sitekey,
            "pageurl": pageurl,
            "size": size,
            "ttl": ttl,
            "min_remaining": min_remaining,
            **params,
        }
    )
    store.pools().register(spec)
    return spec


def take_token(pool: str, min_remaining: float | None = None) -> dict[str, Any] | None:
    """Take one pooled token directly (no worker hop), or None when the pool is empty.

    Raises :class:`~captcha_tasks.state.pools.PoolNotFound` for an undeclared pool.
    """
    record = store.pools().take(pool, min_remaining)
    prewarm.delay(pool)
    return record
