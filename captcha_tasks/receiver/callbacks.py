"""The pingback receiver: a provider callback completes its captcha, if it is genuine.

A callback is hostile input until proven otherwise.  It counts only when

* its path carries a ticket with a right MAC (see :mod:`captcha_tasks.core.pingback`);
* its ``id`` is the captcha that ticket's attempt has at the provider (on the board);
* it is the first word on that captcha: the completion script claims a solve once.

A callback names its captcha as its provider's kind does: an in.php kind's ``id`` and
``code`` fields (CaptchaAI's GET, 2captcha's form POST), or the JSON family's POST of the
task's ``getTaskResult`` JSON, whose ``taskId`` is the captcha (Anti-Captcha, CapSolver,
CapMonster Cloud: see :func:`~captcha_tasks.core.pingback.read_json_callback`).  Which one
the receiver reads is the ticket's provider's kind, known once the MAC is checked.

A callback whose captcha is not on the board yet (the provider called back before the
worker registered it) is kept for a while, bounded, and applied when it is registered
(``202 early``).  Every answer a callback brings, and every callback that comes after a
poll found the answer (late, not lost), tells the callback channel how callbacks are
doing (:meth:`~captcha_tasks.worker.adapter.Runner.heard`).

Anything else is answered with a 4xx and changes nothing; each rejection is counted by
reason.  An address that keeps sending rejected callbacks is throttled (429) for a while;
an address outside ``CAPTCHAAI_PINGBACK_ALLOW`` is refused (403).  Behind a reverse proxy
the address is the client's (see :meth:`Receiver.client_address`).
An accepted callback goes through the one completion path
(:class:`~captcha_tasks.worker.completion.Completer`), as if a poll had read its answer.

:meth:`Receiver.handle` knows no HTTP framework: :mod:`.server` (``captcha-tasks
pingback-server``) and :func:`~.wsgi.make_wsgi_app` serve it, and a Flask or Django view
can call :meth:`Receiver.handle_request` (see the pingback guide, docs/guides/pingback.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import parse_qsl

from .. import errors
from ..core import pingback, steps
from ..core.answers import NOT_READY
from ..core.dialects import DIALECTS
from ..core.job import Job
from ..providers.jsonapi import callback_reading
from ..serving import addresses
from ..serving.buckets import Buckets
from ..worker.adapter import Runner
from ..worker.app import app as worker_app

log = logging.getLogger(__name__)

#: Bytes a callback body may have (``id`` and ``code``, or a JSON provider's
#: ``getTaskResult`` body: a token is a few KiB at most).
MAX_BODY = 16 * 1024
#: Rejected callbacks an address may send in a burst, and per second after that.
STRIKES_BURST = 30
STRIKES_PER_S = 1.0
#: Addresses whose strikes are remembered (least recently seen are forgotten first).
STRIKES_REMEMBERED = 10_000

ACCEPTED = "accepted"
#: A callback kept until its captcha is registered (neither accepted nor refused yet).
EARLY = "early"
#: Rejection reasons, with their HTTP status.
REJECTIONS = {
    "not_allowed": 403,
    "method_not_allowed": 405,
    "too_large": 413,
    "bad_path": 404,
    "bad_mac": 403,
    "missing_field": 400,
    "not_json": 400,
    "bad_code": 400,
    "unknown_id": 404,
    "mismatch": 403,
    "replay": 409,
    "rate_limited": 429,
    "unavailable": 503,
    "early_full": 503,
}
#: Rejections that are no fault of the caller: no strike.  A replay has a right MAC and
#: names the attempt's captcha: the provider repeating itself, or a callback that came
#: after a poll found the answer.
NOT_THEIR_FAULT = frozenset({"unavailable", "early_full", "replay"})


@dataclass(frozen=True)
class Verdict:
    """What the receiver did with one callback: ``reason`` is ``"accepted"`` or one of
    :data:`REJECTIONS`."""

    status: int
    reason: str

    @property
    def accepted(self) -> bool:
        return self.reason == ACCEPTED

    @property
    def refused(self) -> bool:
        return self.reason in REJECTIONS


def _reject(reason: str) -> Verdict:
    return Verdict(REJECTIONS[reason], reason)


class Strikes:
    """Per-address token buckets of rejected callbacks (bounded, thread-safe)."""

    def __init__(
        self,
        burst: int = STRIKES_BURST,
        per_s: float = STRIKES_PER_S,
        remembered: int = STRIKES_REMEMBERED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst, self.per_s, self.remembered = burst, per_s, remembered
        self._buckets = Buckets(remembered, clock)

    def blocked(self, address: str) -> bool:
        """Whether ``address`` has used up its rejections."""
        return self._buckets.empty(address, self.per_s, self.burst)

    def strike(self, address: str) -> None:
        """Count one rejected callback from ``address``."""
        self._buckets.spend(address, self.per_s, self.burst)


class Receiver:
    """Judges callbacks and completes the genuine ones (one per process; thread-safe)."""

    def __init__(self, runner: Runner, strikes: Strikes | None = None) -> None:
        self.settings = runner.settings
        if len(self.settings.pingback.secret) < 16:
            raise errors.ConfigurationError(
                "CAPTCHAAI_PINGBACK_SECRET must be set (at least 16 characters) to receive"
                " callbacks"
            )
        self.runner = runner
        self.state = runner.state
        self.strikes = strikes or Strikes()

    def client_address(self, peer: str, forwarded_for: str | Sequence[str] | None = None) -> str:
        """The address to pass to :meth:`handle_request`: ``peer`` (the connection's
        address), or, when ``peer`` is one of ``CAPTCHAAI_PINGBACK_TRUSTED_PROXIES``, the
        client its ``X-Forwarded-For`` header (``forwarded_for``) names."""
        return addresses.client_address(peer, forwarded_for, self.settings.pingback.trusted_proxies)

    def allows(self, address: str) -> bool:
        """Whether ``CAPTCHAAI_PINGBACK_ALLOW`` lets ``address`` call (empty: anyone)."""
        return addresses.allowed(address, self.settings.pingback.allow)

    def is_proxy(self, address: str) -> bool:
        """Whether ``address`` is one of ``CAPTCHAAI_PINGBACK_TRUSTED_PROXIES``."""
        return addresses.within(address, self.settings.pingback.trusted_proxies)

    def handle_request(
        self,
        verb: str,
        segment: str,
        fields: Mapping[str, str],
        address: str,
        body_size: int = 0,
        body: bytes = b"",
    ) -> Verdict:
        """Judge one HTTP request: ``segment`` is the last path segment (the ticket),
        ``fields`` the query and form fields merged, ``body_size`` its body's length,
        ``address`` the client's (see :meth:`client_address`); ``body`` its body as read
        (a JSON provider's callback is read from it)."""
        if not self.allows(address):
            verdict = _reject("not_allowed")
        elif self.strikes.blocked(address):
            verdict = _reject("rate_limited")
        else:
            verdict = self._judge(verb, segment, fields, body_size, body)
            if verdict.refused and verdict.reason not in NOT_THEIR_FAULT:
                self.strikes.strike(address)
        if verdict.refused:
            log.info("callback from %s refused: %s %s", address, verdict.status, verdict.reason)
        return self._count(verdict)

    def _judge(
        self, verb: str, segment: str, fields: Mapping[str, str], body_size: int, body: bytes
    ) -> Verdict:
        if verb not in ("GET", "POST"):
            return _reject("method_not_allowed")
        if body_size > MAX_BODY:
            return _reject("too_large")
        try:
            ticket = pingback.read_ticket(self.settings.pingback.secret, segment)
        except pingback.BadMac:
            return _reject("bad_mac")
        except pingback.BadTicket:
            return _reject("bad_path")
        if ticket.provider is not None and ticket.provider not in self.state.providers:
            return _reject("unknown_id")
        said = self._callback(ticket, fields, body)
        if isinstance(said, Verdict):
            return said
        captcha_id, code = said
        try:
            self.state.master_changes.report("receiver")
            return self.handle(ticket, captcha_id, code)
        except errors.StoreUnavailable:
            log.warning("callback for captcha %s not taken: Redis is unavailable", captcha_id)
            return _reject("unavailable")

    def _callback(
        self, ticket: pingback.Ticket, fields: Mapping[str, str], body: bytes
    ) -> tuple[str, str] | Verdict:
        """The captcha id a callback names and what it says of it, as the ticket's
        provider's kind sends them (or the refusal of a callback that does not)."""
        if self.state.provider(ticket.provider).spec.kind in DIALECTS:
            found = pingback.read_json_callback(body)
            if isinstance(found, pingback.NotACallback):
                return _reject(found.reason)
            return found.captcha_id, found.body
        captcha_id, code = fields.get("id", "").strip(), fields.get("code", "").strip()
        if not captcha_id or not code:
            return _reject("missing_field")
        return captcha_id, code

    def handle(self, ticket: pingback.Ticket, captcha_id: str, code: str) -> Verdict:
        """End the captcha ``captcha_id`` of the ticket's attempt (at the ticket's
        provider: ids are the provider's own) with ``code`` (as its kind sends it: see
        :func:`~captcha_tasks.providers.jsonapi.callback_reading`), or keep the callback
        until that captcha is registered."""
        if ticket.provider is not None and ticket.provider not in self.state.providers:
            return _reject("unknown_id")
        at = self.state.provider(ticket.provider)
        entry, ended = at.board.lookup(captcha_id, ticket.solve_id)
        if entry is None and ended:
            # the answer was in before (a poll found it): the callback is late, not lost
            self.runner.heard([steps.heard_late(captcha_id)], at.name)
            return _reject("replay")
        if entry is None:
            return self._early(ticket, captcha_id, code)
        job = Job.from_json(entry.job).at(at.name)
        if job.solve_id != ticket.solve_id or job.attempt != ticket.attempt:
            return _reject("mismatch")
        done = self.runner.answer_callback(entry, job, code)
        if done is None:
            return _reject("bad_code")
        return Verdict(200, ACCEPTED) if done else _reject("replay")

    def _early(self, ticket: pingback.Ticket, captcha_id: str, code: str) -> Verdict:
        """A callback for a captcha not on the board: maybe its worker has not registered it
        yet.  Kept (its code must end a captcha) until it does, or a while."""
        kind = self.state.provider(ticket.provider).spec.kind
        answer = callback_reading(kind, code, captcha_id)
        if answer is NOT_READY or isinstance(answer, errors.RetryableError):
            return _reject("bad_code")
        board = self.state.provider(ticket.provider).board
        kept = board.keep_early(ticket.solve_id, ticket.attempt, captcha_id, code)
        if kept == "registered":  # registered meanwhile: judged as any other
            return self.handle(ticket, captcha_id, code)
        if kept == "kept":
            return Verdict(202, EARLY)
        return _reject({"again": "replay", "full": "early_full"}.get(kept, "unknown_id"))

    def _count(self, verdict: Verdict) -> Verdict:
        try:
            self.state.stats.count_callback(verdict.reason)
        except errors.StoreUnavailable:  # counting must never change the answer
            log.debug("could not count a %s callback", verdict.reason)
        return verdict


def request_fields(query: str, body: bytes = b"") -> dict[str, str]:
    """The fields of a callback: its query's and its form body's (the body wins)."""
    fields = dict(parse_qsl(query, keep_blank_values=True))
    if body:
        fields.update(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))
    return fields


def last_segment(path: str) -> str:
    """The last segment of a callback's path: its ticket, under any prefix."""
    return path.rstrip("/").rpartition("/")[2]


@lru_cache(maxsize=1)
def default_receiver() -> Receiver:
    """The process's receiver, for views mounted in a web app (settings from the
    environment; raises :class:`~captcha_tasks.errors.ConfigurationError` without a
    secret)."""
    return Receiver(worker_app.runtime().runner)
