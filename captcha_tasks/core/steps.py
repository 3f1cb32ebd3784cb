"""The life of one captcha, as decisions: plain functions, no I/O, no Celery.

Each step takes the job, what Redis or the API said, and the time, and returns what to do
next as a value (:mod:`.decisions`); the worker (:mod:`captcha_tasks.worker`) carries it
out.  Where a submit goes is :mod:`.routing`'s, what a poll round asks :mod:`.rounds`'::

    requested ─ pool hit ─────────────────────────────────────────────► Deliver
        │
        ▼ admission (on_admission)
    parked ── slot freed ──► owed a message ──┐
        │                                     ▼
        └──────── slot free ─────────────► Submit ── in.php (on_submitted) ──┬─► Fail
                                             ▲  ▲                            │
                    SubmitAt (rate budget,   │  │ Resubmit (unsolvable,      ▼
                    transport error) ────────┘  └─ expired, bad proxy) ◄── PollAt
                                                                             │ ▲ not ready
                                                 poll round (on_answer) ─────┘ │
                                                        ├────────────────────────┘
                                                        ├─► Deliver (answer)
                                                        └─► Fail (fatal, budgets, deadline)

A :class:`~.job.Job` is carried from step to step: the request (never the API key, never
a proxy password or cookies: those wait in Redis), its budgets and the current attempt's
captcha.

With provider callbacks on, what answers say of the callbacks decides how a captcha is
polled (:func:`.channel.judge_channel`, :func:`first_poll`): while they arrive (``up``) a captcha
waits for its callback and is polled only once it is overdue, soon after its method's
solve times say it is done; while many are lost (``degraded``) polls start about the
method's 25th percentile solve time; once they stop (``down``) captchas are polled as if
callbacks were off, and the callbacks that come switch it back.  A captcha counting on
its callback is polled seldom: only in case its callback was lost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import errors
from ..methods import METHODS
from .acceptance import site_of
from .admission import Admission
from .answers import NOT_READY, Answer, Reading
from .channel import DOWN, UP, Heard
from .decisions import (
    Decision,
    Deliver,
    Fail,
    Policy,
    PollAt,
    Resubmit,
    Stop,
    Submit,
    SubmitAt,
    timed_out,
)
from .job import Job
from .lanes import check_lane, default_lane, is_tenant_name
from .outcome import Solved
from .timing import Timing

#: A token is discarded when less than this many seconds of its life are left.
EXPIRY_MARGIN = 1.0
#: Bulk polls a captcha gets within the window its method's captchas finish in.
BULK_POLLS_PER_SPREAD = 4.0
#: ... and one that counts on its callback (polled in case it was lost): few, so that
#: rounds (one ``res.php`` request each, however many captchas it asks about) stay few.
CALLBACK_POLLS_PER_SPREAD = 3.0
#: Least seconds between bulk polls of a captcha.
MIN_BULK_EVERY = 0.1
#: Cold (no solve times known, and no CAPTCHAAI_INITIAL_WAIT), pipe-safe captchas are first
#: asked about in bulk after this share of the method's default wait, then at the bulk
#: pace: the first answers teach the method's real times.
COLD_PROBE = 0.1
#: Least seconds between two polls of a captcha asked about on its own (see :func:`pace`).
MIN_WAIT_ALONE = 0.5
#: ... and one counting on its callback is probed again every this share of that wait: it
#: is polled in case its callback was lost (its callback teaches the times as well).
COLD_CALLBACK_PACE = 0.15
#: Seconds between tries, from the first doubling to the last, while a captcha paid for
#: waits in its process for Redis to take it (see :func:`hold`).
HOLD_WAIT_S = (0.2, 1.0)


@dataclass(frozen=True)
class Pace:
    """How often captchas likely done are asked for: in bulk (``bulk``) every ``every``
    seconds; see :func:`pace`.  A captcha registered cold that waits for its callback from
    now on (:func:`adopting`): ``adopt_due``, seconds after its submit when its callback is
    overdue, and ``adopt_poll``, when it is polled next at the earliest."""

    bulk: bool
    every: float
    adopt_due: float | None = None
    adopt_poll: float | None = None


def pace(
    policy: Policy, timing: Timing, bulk: bool, waits: bool = False, probes: bool = False
) -> Pace:
    """A captcha likely done is asked about :data:`BULK_POLLS_PER_SPREAD` times within
    the window its method's captchas finish in (their 5th to 95th percentile): fast for a
    provider with steady times, so an answer waits a fraction of that window, and a
    bounded number of requests per captcha.  Never slower than the bulk window (cold: the
    bulk window), never faster than :data:`MIN_BULK_EVERY`.

    One that ``waits`` for its callback (:func:`counts_on_callback`) is polled only in
    case its callback was lost: :data:`CALLBACK_POLLS_PER_SPREAD` times within that
    window but never faster than the bulk window (cold: every :data:`COLD_CALLBACK_PACE`
    of its method's cold wait), so that rounds, each one ``res.php`` request however many
    captchas it asks about, stay few.

    One asked about on its own is polled every poll interval.  At a provider that
    ``probes`` (the JSON family: no bulk poll, no account budget on polls, one request per
    task however it is paced) it is paced as in bulk if that is sooner, never faster than
    :data:`MIN_WAIT_ALONE`: warm, :data:`BULK_POLLS_PER_SPREAD` times within its method's
    window; cold, every :data:`COLD_PROBE` of its method's cold wait, so that its first
    answers teach the method's real times rather than the default wait."""
    if not bulk:
        return Pace(False, _alone_every(policy, timing, probes))
    if not timing.warm:
        every = timing.first_wait * COLD_CALLBACK_PACE if waits else 0.0
        return Pace(True, max(policy.bulk_interval, every))
    if waits:
        return Pace(True, max(policy.bulk_interval, timing.spread / CALLBACK_POLLS_PER_SPREAD))
    every = timing.spread / BULK_POLLS_PER_SPREAD
    return Pace(True, min(policy.bulk_interval, max(MIN_BULK_EVERY, every)))


# -- lanes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """Where a solve message says its solve is served: its lane and tenant (checked at
    the call site), and when its caller asked for it."""

    lane: str
    tenant: str | None
    asked: float | None

    @classmethod
    def of(cls, kwargs: dict[str, object], batch: bool) -> Route:
        """Take the route out of a solve message's keyword arguments (what is left is the
        request); a message from before lanes gets its call site's default lane."""
        lane = kwargs.pop("lane", None)
        tenant = kwargs.pop("tenant", None)
        asked = kwargs.pop("_asked", None)
        return cls(
            lane if isinstance(lane, str) else default_lane(batch=batch),
            tenant if isinstance(tenant, str) else None,
            float(asked) if isinstance(asked, int | float) else None,
        )

    def check(self) -> None:
        """A message that skipped the call-site check: a lane that does not exist, or a name
        that cannot be a tenant's, is a :class:`~captcha_tasks.errors.ValidationError`.
        (A tenant this worker does not declare is served with weight 1, no cap and no
        budget: the caller's settings declared it.)"""
        check_lane(self.lane)
        if self.tenant is not None and not is_tenant_name(self.tenant):
            raise errors.ValidationError(f"{self.tenant!r} cannot name a tenant")


# -- jobs --------------------------------------------------------------------------------


def _alone_every(policy: Policy, timing: Timing, probes: bool) -> float:
    if not probes:
        return policy.poll_interval
    if timing.warm:
        every = timing.spread / BULK_POLLS_PER_SPREAD
    elif timing.probe:
        every = timing.first_wait * COLD_PROBE
    else:
        return policy.poll_interval
    return min(policy.poll_interval, max(MIN_WAIT_ALONE, every))


def uses_bulk(job: Job, bulk: bool) -> bool:
    """Whether the job's captcha is asked for in bulk polls: its answer is a plain token
    (pipe-safe) that comes without a user agent."""
    if not bulk or job.request.method not in METHODS:
        return False
    return job.request.pipe_safe


def uses_pingback(job: Job) -> bool:
    """Whether the provider is asked to call back when the job's captcha is done.  A
    callback's ``code`` has no room for a user agent: captchas whose answer comes with one
    are polled."""
    return not job.request.returns_user_agent


def awaits_callback(job: Job, timing: Timing, policy: Policy, channel: str) -> bool:
    """Whether the job's captcha waits for its callback before it is polled: callbacks are
    on and asked for it, the channel is not down, and its method's solve times are known
    (cold, it is probed as without callbacks: its answers teach them)."""
    if policy.pingback_fallback is None or not uses_pingback(job):
        return False
    return timing.warm and channel != DOWN


def adopts_callback(job: Job, timing: Timing, policy: Policy, channel: str) -> bool:
    """Whether a captcha registered cold (probed: its method's times were not known) that
    asked for its callback waits for it from now on, as one registered warm does: its
    method's times are known now and the channel is not down.  Probed on, it would be
    polled until answered although its callback will likely come (most of pingback's
    polls in a batch that starts cold, at the bulk pace: every round's)."""
    return job.callback_due is None and awaits_callback(job, timing, policy, channel)


def adopting(policy: Policy, timing: Timing, bulk: bool, channel: str) -> Pace:
    """The pace of a captcha that :func:`adopts_callback`: as one registered warm, its
    callback overdue at :func:`callback_due` and polled from :func:`first_poll`'s time on,
    in case its callback was lost."""
    return replace(
        pace(policy, timing, bulk, waits=True),
        adopt_due=callback_due(timing, policy),
        adopt_poll=callback_due(timing, policy) if channel == UP else degraded_start(timing),
    )


def counts_on_callback(job: Job, timing: Timing, policy: Policy, channel: str) -> bool:
    """Whether the job's captcha is polled only in case its callback is lost: callbacks
    are on, asked for it and not down, and it waits for its callback (``callback_due``)
    or its method's solve times are not known yet (its callback will likely bring the
    answer first)."""
    if policy.pingback_fallback is None or not uses_pingback(job) or channel == DOWN:
        return False
    return job.callback_due is not None or not timing.warm


def degraded_start(timing: Timing) -> float:
    """Seconds after its submit a captcha is first polled while many callbacks are lost:
    halfway from its method's earliest likely finish to its median solve time (about its
    25th percentile), so that a lost answer is found soon after it is ready, and most
    captchas whose callback comes are never asked about."""
    return (timing.earliest + timing.typical) / 2


def callback_due(timing: Timing, policy: Policy) -> float:
    """Seconds after its submit a captcha's callback is overdue: its method's 95th
    percentile solve time plus ``CAPTCHAAI_PINGBACK_FALLBACK_POLL``."""
    return timing.earliest + timing.spread + (policy.pingback_fallback or 0.0)


def heard_by_callback(job: Job) -> Heard | None:
    """A callback brought the answer of the job's captcha."""
    return None if job.captcha_id is None else Heard("callback", job.captcha_id)


def heard_late(captcha_id: str) -> Heard:
    """A callback came for a captcha whose answer a poll had found: late, not lost."""
    return Heard("late", captcha_id)


def heard_by_poll(
    job: Job,
    answer: Reading,
    polled_before: float | None,
    now: float,
    timing: Timing,
    policy: Policy,
) -> Heard | None:
    """What a poll that read ``answer`` at ``now`` says of the callbacks: None unless a
    callback was asked for and the answer ends the captcha."""
    if policy.pingback_fallback is None or not uses_pingback(job) or job.captcha_id is None:
        return None
    if answer is NOT_READY or isinstance(answer, errors.RetryableError):
        return None
    late = lateness(job, polled_before, now, timing)
    overdue = job.callback_due is not None and now >= job.callback_due
    return Heard("poll", job.captcha_id, late, overdue)


def lateness(job: Job, polled_before: float | None, now: float, timing: Timing) -> float:
    """Seconds an answer a poll found at ``now`` likely waited at the provider: half the
    time since the captcha was last seen not ready; found at its first poll, half the time
    since its method's earliest likely finish (it became ready in between)."""
    if polled_before is not None:
        return max(0.0, (now - polled_before) / 2)
    elapsed = now - _submitted_at(job)
    return max(0.0, (elapsed - min(timing.earliest, elapsed)) / 2)


# -- submit ------------------------------------------------------------------------------


def before_submit(job: Job, now: float) -> Fail | None:
    """A submit whose solve's deadline passed (while parked, or queued) fails; one whose
    caller's ``expires`` passed ends revoked, as Celery ends an expired task."""
    if job.expires is not None and now >= job.expires:
        return Fail(errors.Revoked("expired", captcha_id=job.captcha_id))
    if now >= job.deadline:
        return Fail(timed_out(job, "the solve deadline passed before it could be submitted"))
    return None


def on_admission(job: Job, admission: Admission, now: float) -> Decision:
    """What the limiter's admission means for this submit message."""
    if admission.status == "go":
        return Submit()
    if admission.status == "busy":
        # Another copy of this message is calling in.php, or died doing so: look again
        # when its claim runs out (a live one will have registered the captcha by then).
        return SubmitAt(now + admission.wait_s, job, keep_claim=True)
    if admission.status == "revoked":
        return Fail(errors.Revoked("revoked"))
    if admission.status == "over_budget":
        return Fail(
            errors.BudgetExceeded(
                f"tenant {job.tenant_name!r} spent its daily_captchas for today (they reset"
                " at 00:00 UTC); nothing was sent",
                captcha_id=job.captcha_id,
            )
        )
    return Stop(admission.status)


def on_submitted(
    job: Job,
    reply: str | errors.CaptchaTasksError,
    now: float,
    timing: Timing,
    policy: Policy,
    bulk: bool,
    down: bool = False,
    channel: str = UP,
    probes: bool = False,
) -> Decision:
    """``in.php`` answered ``reply`` (a captcha id, or the error it raised).  ``down``: the
    provider is out of rotation now (this error may have taken it out): the submit goes
    elsewhere at once, spending no retry.  ``channel``: the state of the provider's
    callback channel.  ``probes``: the provider's cold captchas are probed on their own
    (see :func:`pace`)."""
    if isinstance(reply, str):
        polled = job.submitted(reply, now)
        if awaits_callback(polled, timing, policy, channel):
            polled = replace(polled, callback_due=now + callback_due(timing, policy))
        wait = first_poll(polled, timing, policy, bulk, channel, probes)
        return PollAt(min(now + wait, job.deadline), polled)
    if down:
        return SubmitAt(now, job, reply)
    if isinstance(reply, errors.RateLimited):  # a budget, not a fault: no retry is spent
        at = now + reply.retry_after
        if at >= job.deadline:
            return Fail(timed_out(job, "deadline passed while the API asked to wait", reply))
        return SubmitAt(at, job, reply)
    if isinstance(reply, errors.RetryableError):
        count = job.transport_errors + 1
        if count > policy.transport_retries:
            return Fail(_exhausted(reply, count))
        at = now + policy.backoff(count)
        if at >= job.deadline:
            return Fail(timed_out(job, f"deadline passed while retrying ({reply.code})", reply))
        return SubmitAt(at, replace(job, transport_errors=count), reply)
    return _failed_captcha(job, reply, now, policy)


def first_poll(
    job: Job, timing: Timing, policy: Policy, bulk: bool, channel: str = UP, probes: bool = False
) -> float:
    """Seconds after its submit a captcha is first polled.

    A captcha waiting for its callback (:func:`awaits_callback`, its ``callback_due``
    set) is polled when the callback is overdue while the channel is up, and from
    :func:`degraded_start` on while it is degraded.  Any other is polled as without
    callbacks.  In bulk, asking early costs little: at the method's earliest
    likely finish once its times are known, and early while they are not; so on its own at
    a provider that ``probes`` (see :func:`pace`)."""
    if job.callback_due is not None:
        return callback_due(timing, policy) if channel == UP else degraded_start(timing)
    if not uses_bulk(job, bulk):
        if probes and timing.warm:
            return timing.earliest
        probing = probes and timing.probe
        return _alone_every(policy, timing, probes) if probing else timing.first_wait
    if timing.warm:
        return timing.earliest
    return timing.first_wait * COLD_PROBE if timing.probe else timing.first_wait


# -- a captcha paid for while Redis is away --------------------------------------------


@dataclass(frozen=True)
class Hold:
    """A captcha paid for waits in its process for Redis: try again after ``wait_s``, to
    ``register`` it (its solve's deadline has not passed), or else to end its solve
    through the completion (:func:`held_past_deadline`)."""

    wait_s: float
    register: bool


@dataclass(frozen=True)
class Lost:
    """Redis did not answer before the solve's deadline and its grace: the captcha is given
    up (its process logs it with its captcha id)."""


def hold(job: Job, now: float, tries: int, policy: Policy) -> Hold | Lost:
    """What a process holding a captcha paid for does after its ``tries``-th try to get it
    into Redis met an outage at ``now``.

    From ``in.php``'s answer until the board holds it, the captcha id lives only in this
    process: the task's own retry would start again from the admission and pay again (and
    with the broker down Celery rejects the message it cannot publish).  So it is tried
    again in place, the waits doubling from :data:`HOLD_WAIT_S`.  The bound is the solve's
    own deadline (after it the token would be useless anyway): from then on what is tried
    is to end the solve through the completion (``ERROR_SOLVE_TIMEOUT``), for the policy's
    ``hold_grace``; a solve whose Redis never answered by then is :class:`Lost`."""
    wait = min(HOLD_WAIT_S[1], HOLD_WAIT_S[0] * 2.0 ** max(0, tries - 1))
    if now < job.deadline:
        wait = min(wait, job.deadline - now)
        return Hold(wait, register=now + wait < job.deadline)
    end = job.deadline + policy.hold_grace
    if now >= end:
        return Lost()
    return Hold(min(wait, end - now), register=False)


def held_past_deadline(captcha_id: str) -> Fail:
    """How a solve ends whose captcha ``captcha_id`` was paid for but could not be put on
    the board (Redis away) before its deadline."""
    error = errors.SolveTimeout(
        f"the solve deadline passed while Redis was unavailable: captcha {captcha_id} was"
        " paid for and never polled",
        captcha_id=captcha_id,
    )
    return Fail(error)


# -- poll --------------------------------------------------------------------------------


def on_answer(
    job: Job,
    answer: Reading,
    polled_before: float | None,
    poll_errors: int,
    now: float,
    timing: Timing,
    policy: Policy,
    pace: Pace,
) -> Decision:
    """``res.php`` answered ``answer`` for the job's captcha, asked at ``now``.

    ``polled_before``: when it was last seen not ready (None: this was its first poll).
    """
    if answer is NOT_READY:
        return _not_ready(job, now, timing, policy, pace)
    if isinstance(answer, errors.RateLimited):  # a budget, not a fault: no retry is spent
        return on_poll_budget(job, answer.retry_after, poll_errors, now)
    if isinstance(answer, errors.RetryableError):
        count = poll_errors + 1
        if count > policy.transport_retries:
            return Fail(_exhausted(answer, count))
        return PollAt(min(now + policy.backoff(count), job.deadline), job, count, answer)
    if isinstance(answer, errors.CaptchaTasksError):
        return _failed_captcha(job, answer, now, policy)
    decision = _solved(job, answer, polled_before, now, policy)
    if job.callback_due is not None and polled_before is None:
        # It waited for its callback and its first poll came late on purpose: when it was
        # solved is unknown, and learning that wait would delay every poll.
        return replace(decision, solve_time_s=None) if isinstance(decision, Deliver) else decision
    return decision


def on_callback(
    job: Job,
    answer: Reading,
    polled_before: float | None,
    now: float,
    policy: Policy,
) -> Deliver | Fail | Resubmit | None:
    """The provider called back with ``answer`` for the job's captcha: it ends the
    captcha as a poll reading the same answer would.  None: not an ending (a "not ready"
    or a transient code), so nothing changes."""
    if answer is NOT_READY or isinstance(answer, errors.RetryableError):
        return None
    if isinstance(answer, errors.CaptchaTasksError):
        return _failed_captcha(job, answer, now, policy)
    return _solved(job, answer, polled_before, now, policy)


def on_answered_at_submit(
    job: Job, captcha_id: str, answer: Answer, now: float, policy: Policy
) -> Deliver | Fail | Resubmit:
    """The submit of ``job`` came back as ``captcha_id`` with its ``answer`` already (the
    JSON family's synchronous methods): the solve ends as if a poll had read it at once."""
    return _solved(job.submitted(captcha_id, now), answer, None, now, policy)


def on_poll_budget(job: Job, wait_s: float, poll_errors: int, now: float) -> Decision:
    """The account's ``res.php`` budget is spent for ``wait_s``: poll later (or fail)."""
    if now >= job.deadline:
        return Fail(timed_out(job, "the solve deadline passed"))
    return PollAt(min(now + wait_s, job.deadline), job, poll_errors)


def _not_ready(job: Job, now: float, timing: Timing, policy: Policy, pace: Pace) -> Decision:
    """A captcha asked for in bulk (one request answers many) is polled again at the bulk
    pace once it is past its method's earliest likely finish (or its method's times are
    not known yet), and before that at that finish or the poll interval, whichever comes
    first; one asked for on its own, at the poll interval (or its cold probe pace: see
    :func:`pace`)."""
    if now >= job.deadline:
        return Fail(timed_out(job, "the solve deadline passed"))
    if pace.adopt_due is not None:
        job = replace(job, callback_due=_submitted_at(job) + pace.adopt_due)
        poll = _submitted_at(job) + (pace.adopt_poll or pace.adopt_due)
        if poll > now:  # not worth asking about before: wait for its callback
            return PollAt(min(poll, job.deadline), job)
    if not uses_bulk(job, pace.bulk):
        # on its own: the pace of a provider without bulk polls, else the poll interval
        every = policy.poll_interval if pace.bulk else pace.every
        return PollAt(min(now + every, job.deadline), job)
    likely = _submitted_at(job) + timing.earliest if timing.warm else now
    at = max(now + pace.every, min(likely, now + policy.poll_interval))
    return PollAt(min(at, job.deadline), job)


def _solved(
    job: Job, answer: Answer, polled_before: float | None, now: float, policy: Policy
) -> Deliver | Fail | Resubmit:
    request = job.request
    submitted = _submitted_at(job)
    # The token was made after the last "not ready" (or the submit) at the earliest.
    born = polled_before if polled_before is not None else submitted
    expires = born + policy.token_life(request)
    if now >= expires - EXPIRY_MARGIN:
        expired = errors.TokenExpired("token expired before delivery", captcha_id=job.captcha_id)
        return _failed_captcha(job, expired, now, policy)
    outcome = Solved(
        token=request.answer_value(answer.value),
        captcha_id=str(job.captcha_id),
        method=request.method,
        source="api",
        elapsed_s=round(now - job.started, 3),
        solved_at=now,
        expires_at=expires,
        user_agent=answer.user_agent,
        provider=job.provider,
        site=site_of(request.pageurl, request.sitekey),
    )
    # The answer came between the last "not ready" and now: its midpoint is the solve
    # time's best estimate (seen-at times alone would teach the polls to come late).
    seen = now if polled_before is None else (polled_before + now) / 2
    return Deliver(outcome, solve_time_s=seen - submitted)


def _submitted_at(job: Job) -> float:
    # A job on the board always has its submit time; before its submit, its start.
    return job.submitted_at if job.submitted_at is not None else job.started


# -- failures ----------------------------------------------------------------------------


def _failed_captcha(
    job: Job, exc: errors.CaptchaTasksError, now: float, policy: Policy
) -> Fail | Resubmit:
    """An error about the captcha itself: submit a new one where that can help."""
    pooled_proxy = isinstance(exc, errors.ProxyError) and job.request.uses_proxy_pool
    if not (isinstance(exc, errors.ResubmitError) or pooled_proxy):
        return Fail(exc)
    if job.resubmits >= policy.max_resubmits:
        return Fail(exc)
    if now >= job.deadline:
        return Fail(timed_out(job, "the solve deadline passed", exc))
    return Resubmit(job.next_attempt(), exc, replace_proxy=pooled_proxy)


def _exhausted(exc: errors.CaptchaTasksError, count: int) -> errors.RetriesExhausted:
    return errors.RetriesExhausted(
        f"gave up after {count - 1} retries; last error {exc.code}", exc.code, exc.captcha_id
    )
