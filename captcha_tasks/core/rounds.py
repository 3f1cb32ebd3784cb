"""A poll round as values: the captchas it takes from a provider's board, the requests it
makes for them, what it puts back, and when the next round runs.

A round takes every captcha that is due at one provider (at most :data:`ROUND_MOST`), asks
for the pipe-safe ones in bulk (:data:`BULK_IDS` per ``res.php?ids=`` request) and for the
others one by one (:func:`asks`), decides each answer (:mod:`.steps`), puts back those
polled again (:func:`again`) and schedules the next round (:func:`next_gap`).  The board in
Redis (:mod:`captcha_tasks.state.board`) keeps the schedule; the worker runs the round
(:mod:`captcha_tasks.worker.rounds`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import errors
from .decisions import PollAt
from .dialects import DIALECTS
from .job import Job
from .steps import Pace, uses_bulk

#: Most captchas one poll round takes (one bulk request answers 100).
ROUND_MOST = 500
#: Most ids one bulk request asks about.
BULK_IDS = 100
#: A round also takes the captchas due within this many bulk windows from now: asked about
#: a little early, they need no round of their own soon after (one ``res.php`` request
#: however many captchas it asks about).  While callbacks come, few captchas are due at
#: any time, each at its own time: without this, nearly every one cost a round.
AHEAD_WINDOWS = 3.0


@dataclass(frozen=True)
class Entry:
    """A captcha on the board, as a round takes it."""

    captcha_id: str
    #: The job (JSON).
    job: str
    #: When it was last polled and was not ready (s, the polling host's clock); None before
    #: its first poll.
    polled_at: float | None
    #: Transport errors while polling it so far.
    errors: int
    #: Times a round asked about it so far (a provider's per-task poll budget counts them).
    polls: int = 0


@dataclass(frozen=True)
class RoundDue:
    """A poll round message to publish: after ``countdown_s``, carrying ``at_ms``."""

    countdown_s: float
    at_ms: int


@dataclass(frozen=True)
class Again:
    """A captcha a round puts back: poll it again after ``delay_s``."""

    captcha_id: str
    lease_id: str
    delay_s: float
    errors: int = 0
    #: Times it was asked about so far; whether this round asked; when its last ask was
    #: answered (None: when the round asked, if it did; else never).
    polls: int = 0
    asked: bool = True
    polled_at: float | None = None


@dataclass(frozen=True)
class PollBudget:
    """A provider's limits on polling one task (the JSON family's, per task, whichever
    host polls it): at least ``gap_s`` between two polls, at most ``most`` in all (None:
    no limit)."""

    gap_s: float = 0.0
    most: int | None = None


@dataclass(frozen=True)
class Asks:
    """The ``res.php`` requests of one round: ``chunks`` of ids asked about in bulk (two to
    :data:`BULK_IDS` each), and the ids asked about one by one (``single``)."""

    chunks: tuple[tuple[str, ...], ...]
    single: tuple[str, ...]

    @property
    def requests(self) -> int:
        """The requests the round makes, counted against the provider's budget."""
        return len(self.chunks) + len(self.single)


def asks(captchas: Iterable[tuple[str, Job]], bulk: bool) -> Asks:
    """How a round asks about ``captchas`` (id, job) at a provider whose bulk polls are
    ``bulk`` (on, and honoured): pipe-safe ones in chunks of :data:`BULK_IDS`, any other
    one on its own, and so is a chunk of one (a bulk request gains nothing there)."""
    in_bulk: list[str] = []
    single: list[str] = []
    for captcha_id, job in captchas:
        (in_bulk if uses_bulk(job, bulk) else single).append(captcha_id)
    chunks = [tuple(in_bulk[i : i + BULK_IDS]) for i in range(0, len(in_bulk), BULK_IDS)]
    if chunks and len(chunks[-1]) == 1:
        single.insert(0, chunks.pop()[0])
    return Asks(tuple(chunks), tuple(single))


def budget_of(kind: str) -> PollBudget | None:
    """The per-task poll budget of a provider of ``kind`` (None: it has none, as in.php
    providers: their budgets are per account, :mod:`captcha_tasks.state.limiter`'s)."""
    dialect = DIALECTS.get(kind)
    if dialect is None or (dialect.poll_gap_s <= 0 and dialect.polls_per_task is None):
        return None
    return PollBudget(dialect.poll_gap_s, dialect.polls_per_task)


def budget_reply(
    entry: Entry, budget: PollBudget, now: float
) -> float | errors.UnsolvableError | None:
    """Whether a round may ask about ``entry``'s captcha ``now`` under ``budget``: None
    (ask), the seconds until its gap has passed, or the error that ends its attempt once
    its polls are spent.  Its last poll counts from when that poll's reply came: the next
    request leaves at least ``gap_s`` after the provider saw the last one, however long
    either took (and whichever host sent it: the board keeps both, in Redis)."""
    if budget.most is not None and entry.polls >= budget.most:
        return errors.UnsolvableError("poll budget of the task spent", None, entry.captcha_id)
    if entry.polled_at is not None and now - entry.polled_at < budget.gap_s:
        return entry.polled_at + budget.gap_s - now
    return None


def again(
    entry: Entry,
    decision: PollAt,
    now: float,
    asked: bool = True,
    replied_at: float | None = None,
) -> Again:
    """The captcha of ``entry`` goes back on the board, due at the decision's time.
    ``asked``: whether this round asked about it (a budget may have held it back: then its
    count and last poll stay as they were); ``replied_at``: when that ask was answered,
    where a provider's poll budget counts from it (None: from when the round asked)."""
    return Again(
        entry.captcha_id,
        decision.job.solve_id,
        decision.at - now,
        decision.poll_errors,
        polls=entry.polls + 1 if asked else entry.polls,
        asked=asked,
        polled_at=replied_at if asked else entry.polled_at,
    )


def next_gap(paces: Sequence[Pace], taken: int, bulk_window: float, took_s: float) -> float:
    """Seconds until the provider's next round: the fastest bulk pace among the captchas
    this round asked about (none: the bulk window), or at once when it took as many as a
    round may (more are likely due), less the ``took_s`` this round took (the pace runs
    from round to round)."""
    gap = min((p.every for p in paces if p.bulk), default=bulk_window)
    if taken >= ROUND_MOST:
        gap = 0.0
    return max(0.0, gap - took_s)
