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

from .decisions import PollAt
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


def again(entry: Entry, decision: PollAt, now: float) -> Again:
    """The captcha of ``entry`` goes back on the board, due at the decision's time."""
    return Again(entry.captcha_id, decision.job.solve_id, decision.at - now, decision.poll_errors)


def next_gap(paces: Sequence[Pace], taken: int, bulk_window: float, took_s: float) -> float:
    """Seconds until the provider's next round: the fastest bulk pace among the captchas
    this round asked about (none: the bulk window), or at once when it took as many as a
    round may (more are likely due), less the ``took_s`` this round took (the pace runs
    from round to round)."""
    gap = min((p.every for p in paces if p.bulk), default=bulk_window)
    if taken >= ROUND_MOST:
        gap = 0.0
    return max(0.0, gap - took_s)
