"""The decisions a step can return, as values, and the settings steps decide by.

A step (:mod:`.steps`, :mod:`.routing`) takes the job, what the API or Redis said, and the
time, and returns one :data:`Decision`; the worker's adapter carries it out.  None of them
does anything itself.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .. import errors
from ..methods import SolveRequest
from .job import Job
from .outcome import Solved

BACKOFF_BASE = 0.5
BACKOFF_CAP = 30.0


@dataclass(frozen=True)
class Policy:
    """The settings the steps decide by."""

    solve_timeout: float
    poll_interval: float
    #: Least seconds between two bulk polls of a captcha (the round window).
    bulk_interval: float
    transport_retries: int
    max_resubmits: int
    token_lifetimes: Mapping[str, float] = field(default_factory=dict)
    #: With provider callbacks on: seconds past its method's 95th percentile solve time a
    #: captcha waiting for its callback is polled (None: callbacks off, poll as usual).
    pingback_fallback: float | None = None
    #: Seconds a captcha may be expected to wait for the home provider's threads before an
    #: overflow provider takes it (None: never).
    overflow_after: float | None = None
    #: Seconds past its deadline a solve whose captcha was paid for while Redis was away
    #: may still be ended through the completion, once Redis answers (see
    #: :func:`captcha_tasks.core.steps.hold`); after that it is given up as lost.
    hold_grace: float = 60.0
    #: Returns a number in [0, 1): the jitter of back-offs (a constant in tests).
    random: Callable[[], float] = random.random

    def token_life(self, request: SolveRequest) -> float:
        return float(self.token_lifetimes.get(request.method, request.spec.token_life))

    def backoff(self, errors_so_far: int) -> float:
        """Seconds before retry number ``errors_so_far`` (1, 2, ...): exponential, jittered."""
        base = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** (errors_so_far - 1))
        return base * (0.5 + self.random() / 2)


@dataclass(frozen=True)
class Submit:
    """Call ``in.php`` now (the slot is held and the claim taken)."""


@dataclass(frozen=True)
class SubmitAt:
    """Run the submit of ``job`` again at ``at`` (a rate budget, or the transient
    ``error``)."""

    at: float
    job: Job
    error: errors.CaptchaTasksError | None = None
    #: The claim belongs to another copy of the message: leave it alone.
    keep_claim: bool = False


@dataclass(frozen=True)
class Stop:
    """Nothing to do: parked, cancelled, or a duplicate message."""

    reason: str


@dataclass(frozen=True)
class PollAt:
    """Poll the job's captcha at ``at``; ``poll_errors`` transport errors so far, the
    last one ``error``."""

    at: float
    job: Job
    poll_errors: int = 0
    error: errors.CaptchaTasksError | None = None


@dataclass(frozen=True)
class Resubmit:
    """The captcha failed but the solve goes on: submit ``job`` (the next attempt).
    ``replace_proxy``: the pooled proxy was bad; quarantine it and take another."""

    job: Job
    error: errors.CaptchaTasksError
    replace_proxy: bool = False

    @property
    def reason(self) -> str:
        """Why a new captcha is submitted (``resubmits_total{reason}``)."""
        return resubmit_reason(self.error)


def resubmit_reason(error: errors.CaptchaTasksError) -> str:
    if isinstance(error, errors.ProviderDown):
        return "provider_down"
    if isinstance(error, errors.TokenExpired):
        return "expired"
    if isinstance(error, errors.ProxyError):
        return "bad_proxy"
    if isinstance(error, errors.UnsolvableError):
        return "unsolvable"
    return "other"


@dataclass(frozen=True)
class Deliver:
    """The solve is done with ``outcome``; ``solve_time_s`` for the samples."""

    outcome: Solved
    solve_time_s: float | None = None


@dataclass(frozen=True)
class Fail:
    """The solve is over with ``error``."""

    error: errors.CaptchaTasksError


Decision = Submit | SubmitAt | Stop | PollAt | Resubmit | Deliver | Fail


def timed_out(
    job: Job, message: str, cause: errors.CaptchaTasksError | None = None
) -> errors.SolveTimeout:
    """The solve's deadline passed (``message`` says where, ``cause`` the last error)."""
    if cause is not None:
        message = f"{message} (last error {cause.code})"
    return errors.SolveTimeout(message, captcha_id=job.captcha_id)
