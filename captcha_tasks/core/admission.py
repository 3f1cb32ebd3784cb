"""What a provider's thread limiter decided for a submit, as values.

The limiter (:mod:`captcha_tasks.state.limiter`) admits, parks or defers a submit in one
Redis script and returns an :class:`Admission`; the steps decide what it means for the
solve (:func:`captcha_tasks.core.steps.on_admission`).  The admission is also the one place
that decides whether a solve that has not reached ``in.php`` yet goes on at all: a
revoked solve (``revoked``) and a solve of a cancelled batch (``cancelled``) end there,
and nothing else in the package reads a revocation or a batch's cancellation before a
submit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Parked:
    """A submit handed out by the limiter: its lease id and its job (JSON)."""

    lease_id: str
    job: str


@dataclass(frozen=True)
class Handout:
    """Submits owed a task message: ``given`` hold a slot now; ``expired`` passed their
    deadline while parked (their submit fails them)."""

    given: list[Parked]
    expired: list[Parked]

    def all(self) -> list[Parked]:
        return [*self.given, *self.expired]


NO_HANDOUT = Handout([], [])

AdmitStatus = Literal[
    "go",
    "deferred",
    "parked",
    "full",
    "down",
    "cancelled",
    "done",
    "busy",
    "revoked",
    "over_budget",
]


@dataclass(frozen=True)
class Admission:
    """What the limiter's admission decided; ``wait_s`` with ``"deferred"`` (for the
    ``budget`` named; ``warn`` for the first such deferral in a while) and ``"busy"``;
    ``handout``: the parked submits handed a slot on the way (the one it gave back, when
    ``"cancelled"`` or ``"deferred"``), owed a message."""

    status: AdmitStatus
    wait_s: float = 0.0
    handout: Handout = NO_HANDOUT
    budget: str = ""
    warn: bool = False
