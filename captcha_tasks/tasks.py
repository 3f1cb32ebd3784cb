"""Celery tasks: ``solve`` replaces itself with the chain ``submit | poll``.

    solve(method, sitekey, pageurl, **params)        public; validated before queueing
      └─ submit(job) ──► poll(job) ──► poll(job) ... ──► outcome dict on solve's id

``poll`` reschedules itself by re-publishing its own message with a countdown (the chain
and the task id are kept; no RETRY state is written and no worker sleeps).  A job is a
plain JSON dict that carries its own budgets: transport errors, resubmits and the
overall deadline.  The API key is never in a job: workers read it from settings.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore

from . import errors, store, timing
from .celery_app import app
from .client import NOT_READY, Answer
from .methods import SolveRequest, build_request
from .outcome import Solved, iso
from .settings import get_settings

log = logging.getLogger(__name__)

Job = dict[str, Any]

#: A token is discarded when less than this many seconds of its life are left.
EXPIRY_MARGIN = 1.0
BACKOFF_BASE = 0.5
BACKOFF_CAP = 30.0


class SolveTask(Task):
    """``solve`` validates its arguments at the call site, before anything is queued."""

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        kwargs = normalize_solve_args(args or (), kwargs or {})
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


@app.task(bind=True, base=SolveTask, name="captcha_tasks.solve")
def solve(
    self: Task, method: str, sitekey: str | None = None, pageurl: str | None = None, **params: Any
) -> Any:
    """Solve one captcha; the result is an outcome dict (see :mod:`captcha_tasks.outcome`)."""
    request = build_request(method, sitekey, pageurl, **params)
    job = new_job(self.request.id, request)
    return self.replace(submit.s(job) | poll.s())


def new_job(solve_id: str, request: SolveRequest, now: float | None = None) -> Job:
    now = time.time() if now is None else now
    return {
        "solve_id": solve_id,
        "request": request.to_dict(),
        "started": now,
        "deadline": now + get_settings().solve_timeout,
        "attempt": 0,
        "transport_errors": 0,
    }


@app.task(bind=True, name="captcha_tasks.submit")
def submit(self: Task, job: Job) -> Job:
    """Submit the job's captcha (at most once per attempt) and hand the job to ``poll``."""
    try:
        return submit_job(job)
    except errors.RetryableError as exc:
        _count_error(exc.code)
        return _transport_retry(self, job, exc)


@app.task(bind=True, name="captcha_tasks.poll")
def poll(self: Task, job: Job) -> dict[str, Any]:
    """Ask for the job's answer; reschedule while it is not ready."""
    now = time.time()
    wait = job["next_poll_at"] - now
    if wait > 0.05:
        _again(self, job, wait)
    try:
        answer = store.api_client().get(job["captcha_id"])
    except errors.RetryableError as exc:
        _count_error(exc.code)
        _transport_retry(self, job, exc)
    except errors.ResubmitError as exc:
        _count_error(exc.code)
        _resubmit(self, job, exc)
    except errors.CaptchaTasksError as exc:
        _count_error(exc.code)
        raise
    if answer is NOT_READY:
        _not_ready(self, job, now)
    return _deliver(self, job, answer, now)


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
        captcha_id = store.api_client().submit(request)
        submitted_at = time.time()
        _remember_submission(r, keys.submission(job["solve_id"]), captcha_id, job, life)
    wait = timing.first_wait(r, keys, get_settings(), request.method, request.initial_wait)
    return {
        **job,
        "captcha_id": captcha_id,
        "submitted_at": submitted_at,
        "next_poll_at": submitted_at + wait,
        "last_not_ready": None,
        "polls": 0,
    }


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
    settings = get_settings()
    job = {**job, "polls": job.get("polls", 0) + 1, "last_not_ready": now}
    job["next_poll_at"] = now + settings.poll_interval
    _again(task, job, settings.poll_interval)


def _deliver(task: Task, job: Job, answer: Answer, now: float) -> dict[str, Any]:
    request = SolveRequest.from_dict(job["request"])
    r, keys = store.redis_client(), store.keys()
    timing.record_solve_time(r, keys, request.method, now - job["submitted_at"])
    # The token was made after the last "not ready" answer (or the submit) at the earliest.
    born = job.get("last_not_ready") or job["submitted_at"]
    expires = born + token_life(request)
    if time.time() >= expires - EXPIRY_MARGIN:
        log.warning("captcha %s answer expired before delivery; solving again", job["captcha_id"])
        expired = errors.TokenExpired("token expired before delivery", captcha_id=job["captcha_id"])
        _resubmit(task, job, expired)
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


def _resubmit(task: Task, job: Job, exc: errors.CaptchaTasksError) -> NoReturn:
    if job.get("resubmits", 0) >= get_settings().max_resubmits:
        raise exc
    if time.time() >= job["deadline"]:
        raise errors.SolveTimeout(
            "solve deadline passed", captcha_id=job.get("captcha_id")
        ) from exc
    log.info("captcha %s: %s; submitting a new one", job.get("captcha_id"), exc.code)
    fresh = {**job, "attempt": job["attempt"] + 1, "resubmits": job.get("resubmits", 0) + 1}
    task.replace(submit.s(fresh) | poll.s())
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
    countdown = max(0.0, min(countdown, remaining, BACKOFF_CAP))
    sig = task.signature_from_request(
        task.request,
        args=(job,),
        kwargs={},
        countdown=countdown,
        retries=(task.request.retries or 0) + 1,
    )
    sig.apply_async()
    raise Ignore()


def token_life(request: SolveRequest) -> float:
    overrides = get_settings().token_lifetimes
    return float(overrides.get(request.method, request.spec.token_life))


def _count_error(code: str) -> None:
    try:
        store.redis_client().hincrby(store.keys().api_errors(), code, 1)
    except Exception:  # metrics must never break a solve
        log.debug("could not count error %s", code, exc_info=True)


@app.task(name="captcha_tasks.report")
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
