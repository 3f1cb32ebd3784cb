"""Provider health as values: each provider's circuit, and what a request's outcome means
for it and for the account.

A provider's circuit *opens* (the provider is out of rotation for every worker) on a run of
transport errors, and at once on an empty balance or a refused key; Redis keeps it
(:mod:`captcha_tasks.state.circuits`, whose scripts count and open atomically).  What a
request's outcome asks of the circuit is decided here (:func:`on_request`), from the
circuit as read, and the worker records it: no process keeps circuit state of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .. import errors

#: Why a circuit opened: ``soft`` (transport errors: the provider may be fine in a moment,
#: and the captchas it holds are lost to us), ``balance`` (its captchas in flight are still
#: solved), ``key`` (it refuses the key: its captchas cannot be read).
Why = Literal["soft", "balance", "key"]


@dataclass(frozen=True)
class Circuit:
    """One provider's circuit as read.  Times are Unix seconds (None: never)."""

    provider: str
    open: bool = False
    #: Why it is open (see :data:`Why`) and the error code that opened it.
    why: str | None = None
    code: str | None = None
    failures: int = 0
    opened_at: float | None = None
    closed_at: float | None = None
    probe_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    balance: float | None = None
    balance_at: float | None = None

    @property
    def up(self) -> bool:
        return not self.open

    @property
    def state(self) -> str:
        return "open" if self.open else "closed"


@dataclass(frozen=True)
class Counted:
    """What counting a failure did: the circuit is ``open`` now; this count ``opened`` it."""

    open: bool
    opened: bool


@dataclass(frozen=True)
class CountFailure:
    """Count a failed request at the provider: its error ``code``, and ``why`` it says the
    provider failed."""

    code: str
    why: Why


@dataclass(frozen=True)
class ClearFailures:
    """The provider answered after failures were counted: they start from 0 again."""


def failure_kind(exc: errors.CaptchaTasksError) -> Why | None:
    """What an error says about its provider: ``soft`` (no answer: a transport error, HTTP
    5xx, a timeout), ``balance``, ``key``, or None (the provider answered)."""
    if isinstance(exc, errors.TransportError):
        return "soft"
    if isinstance(exc, errors.ZeroBalance):
        return "balance"
    if isinstance(exc, errors.AuthError):
        return "key"
    return None


def on_request(
    circuit: Circuit, error: errors.CaptchaTasksError | None
) -> CountFailure | ClearFailures | None:
    """What a request to the circuit's provider that ended with ``error`` (None: it
    answered) asks of the circuit: count a failure, clear the failures counted (the
    provider answered; an error of the captcha's own is an answer too), or nothing (it
    answered, and no failure is counted: the common case costs no write)."""
    why = failure_kind(error) if error is not None else None
    if error is not None and why is not None:
        return CountFailure(error.code, why)
    return ClearFailures() if circuit.failures else None


def account_hold(error: errors.CaptchaTasksError) -> float | None:
    """Seconds every request to the provider waits after ``error``: an HTTP 429 holds the
    whole account for its ``Retry-After`` (the client already bounds what it believes);
    None for any other error."""
    if isinstance(error, errors.RateLimited):
        return max(0.0, error.retry_after)
    return None


def back_in_rotation(circuit: Circuit, balance: float) -> bool:
    """Whether a probe of the open ``circuit`` that read ``balance`` closes it: money on
    the account, for a provider whose balance ran out; any answer, for one that stopped
    answering or refused its key (the probe's answer is the proof)."""
    return balance > 0 or circuit.why != "balance"
