"""Poll rounds and provider callbacks: where a captcha on the board meets its answer.

A round takes the captchas due at one provider, asks for them as the core says
(:mod:`captcha_tasks.core.rounds`), decides each answer (:mod:`captcha_tasks.core.steps`)
and acts: the finished ones through the one completion, the failed ones retired for a new
attempt, the rest back on the board; then it schedules the next round.  The captchas of a
provider out of rotation go elsewhere instead (:mod:`captcha_tasks.core.routing`).  A
callback ends its captcha as a poll reading the same answer would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import errors, faults
from ..core import rounds, routing, steps
from ..core.answers import NOT_READY, Answer, NotReady, Reading
from ..core.channel import Heard
from ..core.decisions import Decision, Deliver, Fail, PollAt, Resubmit
from ..core.job import Job
from ..core.rounds import Entry
from ..providers.jsonapi import callback_reading
from .completion import Ended
from .edges import OUTAGES, Edges
from .health import Health
from .stash import Stash

log = logging.getLogger(__name__)

#: Concurrent single-id ``res.php`` requests of one round.
SINGLE_POLLS = 8

#: Each captcha's reply: what ``res.php`` said, or the seconds until its budget frees.
Replies = dict[str, Reading | float]


@dataclass(frozen=True)
class _Due:
    """A captcha a round took, with its job decoded once."""

    entry: Entry
    job: Job

    @property
    def captcha_id(self) -> str:
        return self.entry.captcha_id


class Rounds:
    """Runs the poll rounds, and applies the provider callbacks, of one runner."""

    def __init__(self, edges: Edges, health: Health, stash: Stash) -> None:
        self.edges = edges
        self.state = edges.state
        self.health = health
        self.stash = stash
        self._executor: ThreadPoolExecutor | None = None

    def poll_round(self, round_at_ms: int | None, provider: str | None = None) -> None:
        """One poll round at ``provider`` (None: the primary): ask for every due captcha,
        act on each answer, schedule the next.  A round that fails (no outage) ends the
        solves of the captchas it took."""
        started = time.time()
        at = self.state.provider(provider)
        taken = at.board.take_due(round_at_ms, rounds.ROUND_MOST)
        entries = [_Due(e, Job.from_json(e.job).at(at.name)) for e in taken]
        try:
            self._round(at.name, entries, started)
        except OUTAGES:
            raise  # its captchas come due again (a round holds them for a while only)
        except Exception as exc:
            for due in entries:
                self.edges.fail_inside(due.job, exc, "poll")

    def _round(self, provider: str, entries: list[_Due], started: float) -> None:
        asked_at = answered_at = time.time()
        budget = rounds.budget_of(self.state.provider(provider).spec.kind)
        replies: Replies = {}
        paces: list[steps.Pace] = []
        in_bulk: set[str] = set()
        decisions: list[tuple[_Due, Decision]] = []
        if entries and routing.work_lost_at(provider, self.state.circuits.view()):
            decisions = [(d, routing.on_provider_down(d.job, asked_at)) for d in entries]
        elif entries:
            bulk = self.health.bulk(provider)
            replies, in_bulk = self._fetch(provider, entries, bulk, budget)
            answered_at = time.time()
            channel, probes = self.health.channel(provider), self.health.probes(provider)
            paces = [self._pace(d.job, bulk, channel, probes) for d in entries]
            # Decided as of when they were asked: the pace runs from ask to ask, however
            # long the request and this round took.
            decisions = [
                (due, self._decide(due, replies, asked_at, pace))
                for due, pace in zip(entries, paces, strict=True)
            ]
        ended = self._end(provider, decisions, in_bulk)
        self._count_costs(decisions, ended, replies)
        heard = [self._heard_by_poll(d, replies.get(d.captcha_id), asked_at) for d in ended]
        self.health.heard(heard, provider)
        self.edges.count(
            *(d.error for _, d in decisions if isinstance(d, PollAt)), provider=provider
        )
        now = time.time()
        # A per-task budget counts from when the replies came: the next ask leaves at
        # least its gap after the provider saw this one, however long the request took.
        replied_at = answered_at if budget is not None else None
        again = [
            rounds.again(
                d.entry, p, now, not isinstance(replies.get(d.captcha_id), float), replied_at
            )
            for d, p in decisions
            if isinstance(p, PollAt)
        ]
        gap = rounds.next_gap(
            paces, len(entries), self.edges.settings.solving.bulk_window_s, now - started
        )
        board = self.state.provider(provider).board
        self.edges.publish_round(board.end_round(asked_at, again, gap), provider)

    def _end(
        self, provider: str, decisions: list[tuple[_Due, Decision]], in_bulk: set[str]
    ) -> list[_Due]:
        """Carry out the round's endings and retirements; the captchas they ended."""
        endings = [(d, x) for d, x in decisions if isinstance(x, Deliver | Fail)]
        claimed = self.edges.completer.complete_many(
            [
                Ended(d.job, ending, "bulk_poll" if d.captcha_id in in_bulk else "poll")
                for d, ending in endings
            ]
        )
        ended = [d for (d, _), done in zip(endings, claimed, strict=True) if done]
        now = time.time()
        for due, decision in decisions:
            if isinstance(decision, Resubmit) and self.retire(due.entry, due.job, decision, now):
                ended.append(due)
        return ended

    def _count_costs(
        self, decisions: list[tuple[_Due, Decision]], ended: list[_Due], replies: Replies
    ) -> None:
        done = {d.captcha_id for d in ended}
        for due, decision in decisions:
            reply = replies.get(due.captcha_id)
            delivered = isinstance(decision, Deliver) and due.captcha_id in done
            if delivered and isinstance(reply, Answer):
                self.edges.count_cost(due.job, reply)

    def _decide(self, due: _Due, replies: Replies, now: float, pace: steps.Pace) -> Decision:
        try:
            return self._decide_one(due, replies, now, pace)
        except OUTAGES:
            raise
        except Exception as exc:  # one captcha's failure ends its solve, not the round
            log.error("solve %s: %s in poll", due.job.solve_id, type(exc).__name__, exc_info=exc)
            error = errors.InternalError(
                f"{type(exc).__name__} in poll", captcha_id=due.job.captcha_id
            )
            return Fail(error)

    def _decide_one(self, due: _Due, replies: Replies, now: float, pace: steps.Pace) -> Decision:
        faults.point("poll")
        entry, job = due.entry, due.job
        reply = replies.get(entry.captcha_id, NOT_READY)
        if isinstance(reply, float):
            return steps.on_poll_budget(job, reply, entry.errors, now)
        timing = self.edges.timing(job)
        policy = self.edges.policy
        return steps.on_answer(job, reply, entry.polled_at, entry.errors, now, timing, policy, pace)

    def _pace(self, job: Job, bulk: bool, channel: str, probes: bool) -> steps.Pace:
        timing, policy = self.edges.timing(job), self.edges.policy
        if steps.adopts_callback(job, timing, policy, channel):
            return steps.adopting(policy, timing, bulk, channel)
        waits = steps.counts_on_callback(job, timing, policy, channel)
        return steps.pace(policy, timing, bulk, waits, probes)

    def _heard_by_poll(self, due: _Due, reply: Reading | float | None, now: float) -> Heard | None:
        if reply is None or isinstance(reply, float):
            return None
        timing = self.edges.timing(due.job)
        policy = self.edges.policy
        return steps.heard_by_poll(due.job, reply, due.entry.polled_at, now, timing, policy)

    # -- asking the provider -----------------------------------------------------------
    def _fetch(
        self,
        provider: str,
        entries: Sequence[_Due],
        bulk: bool,
        budget: rounds.PollBudget | None,
    ) -> tuple[Replies, set[str]]:
        """Every due captcha's answer from ``provider``, and the ids answered in bulk; a
        float means "a budget frees in this many seconds": the account's ``res.php``
        budget, or the task's own (``budget``, the JSON family's: then it was not asked)."""
        held: Replies = {}
        if budget is not None:
            now = time.time()
            for due in entries:
                reply = rounds.budget_reply(due.entry, budget, now)
                if reply is not None:
                    held[due.captcha_id] = reply
        asking = [d for d in entries if d.captcha_id not in held]
        plan = rounds.asks(((d.captcha_id, d.job) for d in asking), bulk)
        wait = self.state.provider(provider).limiter.poll_wait(plan.requests) if asking else 0
        if wait > 0:
            return {**dict.fromkeys((d.captcha_id for d in asking), wait), **held}, set()
        replies: Replies = dict(held)
        single = list(plan.single)
        in_bulk: set[str] = set()
        for chunk in plan.chunks:
            found = self._ask_many(provider, list(chunk))
            if found is None:  # the API does not honour ids=: one by one after all
                single += chunk
            else:
                replies.update(found)
                in_bulk.update(chunk)
        replies.update(self._ask_each(provider, single))
        return replies, in_bulk

    def _ask_many(self, provider: str, ids: list[str]) -> dict[str, Reading] | None:
        try:
            found = self.edges.api(provider).get_many(ids)
        except errors.CaptchaTasksError as exc:
            self.health.hold_account(exc, provider)
            self.health.answered(provider, exc)
            return dict.fromkeys(ids, exc)
        self.health.answered(provider, None)
        self.health.saw_bulk(provider, found is not None)
        if found is None:
            return None
        return {cid: _as_reading(value) for cid, value in found.items()}

    def _ask_each(self, provider: str, ids: list[str]) -> dict[str, Reading]:
        if not ids:
            return {}
        if len(ids) == 1:
            return {ids[0]: self._ask_one(provider, ids[0])}
        if self._executor is None:
            self._executor = ThreadPoolExecutor(SINGLE_POLLS, thread_name_prefix="captcha-poll")
        readings = self._executor.map(lambda cid: self._ask_one(provider, cid), ids)
        return dict(zip(ids, readings, strict=True))

    def _ask_one(self, provider: str, captcha_id: str) -> Reading:
        try:
            reading = self.edges.api(provider).get(captcha_id)
        except errors.CaptchaTasksError as exc:
            self.health.hold_account(exc, provider)
            self.health.answered(provider, exc)
            return exc
        self.health.answered(provider, None)
        return reading

    # -- endings -----------------------------------------------------------------------
    def retire(self, entry: Entry, job: Job, decision: Resubmit, now: float) -> bool:
        """Take a failed captcha off the board and submit its solve's next attempt; False
        when something else ended the captcha first."""
        nxt = decision.job
        retired = self.state.provider(job.provider).board.retire(
            entry.captcha_id,
            nxt.solve_id,
            nxt.to_json(),
            nxt.deadline - now,
            decision.error.code,
            decision.reason,
        )
        if not retired:
            return False
        log.info(
            "captcha %s at %s: %s; submitting a new one",
            entry.captcha_id,
            job.provider,
            decision.error.code,
        )
        faults.point("retire")
        self.stash.replace_proxy(job, decision)
        self.edges.completer.send_submit(nxt)
        return True

    def answer_callback(self, entry: Entry, job: Job, code: str) -> bool | None:
        """The provider called back with ``code`` for the captcha of ``entry`` (its job
        ``job``, at its provider): end it as a poll reading the same answer would.  None:
        the code ends nothing (changes nothing); False: something else ended the captcha
        first.  ``code`` is as the provider's kind sends it: an in.php ``code``, or the JSON
        family's ``getTaskResult`` body."""
        kind = self.state.provider(job.provider).spec.kind
        answer = callback_reading(kind, code, entry.captcha_id)
        now = time.time()
        decision = steps.on_callback(job, answer, entry.polled_at, now, self.edges.policy)
        if decision is None:
            return None
        if isinstance(decision, Resubmit):
            done = self.retire(entry, job, decision, now)
        else:
            done = self.edges.completer.complete(job, decision, source="pingback")
        if done:
            self.health.heard([steps.heard_by_callback(job)], job.provider)
            if isinstance(decision, Deliver) and isinstance(answer, Answer):
                self.edges.count_cost(job, answer)
        return done


def _as_reading(value: Answer | NotReady | Exception) -> Reading:
    if isinstance(value, errors.CaptchaTasksError):
        return value
    if isinstance(value, Exception):
        return errors.TransportError(f"{type(value).__name__}")
    return value
