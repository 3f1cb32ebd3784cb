"""How the provider's callbacks are doing, and callbacks that came too early.

**The channel.**  Every answer of a captcha that asked for a callback is *heard*, with
the way it came (:class:`~captcha_tasks.core.channel.Heard`):

* ``callback``: its callback brought it;
* ``poll``: a poll found it first (its callback was lost, or is late);
* ``late``: its callback came after a poll had found the answer (late, not lost; counted
  once per captcha, and only for one a poll found in the last :data:`POLLED_KEEP_S`).

One hash, shared by every worker and receiver, keeps what the answers say (a
:class:`~captcha_tasks.core.channel.Channel`): the recent share of answers that came by
callback (a weighted mean: each answer moves it by a given weight), the answers by poll
and by callback in a row, and the answers since the channel's state last switched.
Which state that is (``up``, ``degraded``, ``down``) the core decides
(:func:`captcha_tasks.core.channel.judge_channel`); :meth:`CallbackChannel.switch`
switches it once, whichever process saw it first.

**Lateness.**  How long each heard answer waited at the provider before we had it (0 for
a callback), as a histogram, and how many a poll found after their callback was due.

**Early callbacks.**  The provider may call back before the worker that submitted the
captcha has registered it (before ``in.php``'s reply even reached it).  Such a callback,
its MAC checked, is kept under its ticket (one solve's attempt: a leaked URL can keep one)
for :data:`EARLY_KEEP_S`, at most :data:`EARLY_MOST` of them; the board's register script
takes it (:data:`EARLY`) and the worker applies it as if it had just come.  Taken, it
lives only in that worker's memory, so the same script has the captcha polled
:data:`EARLY_POLL_S` later: should the worker die first, the poll reads the answer.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..core.channel import STATES, UP, Channel, Heard
from .db import Db
from .keys import Keys
from .lua import Script, ms, text

T = TypeVar("T")

#: Seconds a captcha a poll answered is remembered, to tell a late callback from a lost one.
POLLED_KEEP_S = 300.0
#: Captchas remembered so at most.
POLLED_MOST = 10_000
#: Upper bounds (s) of the lateness histogram's buckets (then +Inf).
LATE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
#: Seconds an early callback waits for its captcha to be registered, and how many may wait.
EARLY_KEEP_S = 60.0
EARLY_MOST = 1000
#: Seconds after its registration a captcha whose early callback the worker took is polled,
#: should that worker die before it applied it (the provider has the answer).
EARLY_POLL_S = 5.0


@dataclass(frozen=True)
class Lateness:
    """The lateness histogram: cumulative ``(upper bound, count)`` pairs (``+Inf`` last),
    their sum (s), and answers found after their callback was due."""

    buckets: list[tuple[float, int]]
    sum_s: float
    overdue: int


def early_keys(keys: Keys) -> dict[str, str]:
    """The keys of ``lib/early.lua``."""
    return {"early": keys.pingback_early(), "early_due": keys.pingback_early_due()}


def early_ticket(solve_id: str, attempt: int) -> str:
    """What an early callback is kept under: one attempt of one solve."""
    return f"{solve_id}.{attempt}"


OBSERVE = Script("channel/observe")

SWITCH = Script("channel/switch")


class CallbackChannel:
    """The callback channel's figures and state, and the lateness of answers."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.keys = db.keys
        self._observe = db.bind(OBSERVE)
        self._switch = db.bind(SWITCH)

    def _keys(self) -> dict[str, str]:
        k = self.keys
        return {
            "channel": k.pingback_channel(),
            "polled": k.pingback_polled(),
            "lateness": k.pingback_lateness(),
        }

    def read(self) -> Channel:
        """The channel as recent answers left it."""
        r, key = self.db.redis, self.keys.pingback_channel()
        found = self._guarded(lambda: r.hmget(key, "state", "share", "misses", "hits", "since"))
        return _channel(found)

    def observe(self, heard: Sequence[Heard], weight: float) -> Channel:
        """Hear ``heard`` (each answer moves the share by ``weight``); the channel after."""
        args = {
            "heard": [
                [h.by, h.captcha_id, round(h.late_s, 3), late_bucket(h.late_s), int(h.overdue)]
                for h in heard
            ],
            "weight": weight,
            "keep_ms": ms(POLLED_KEEP_S),
            "most": POLLED_MOST,
        }
        return _channel(self._guarded(lambda: self._observe(self._keys(), args)))

    def switch(self, old: str, new: str, share: float | None = None) -> bool:
        """Switch the state from ``old`` to ``new`` (starting the share at ``share``);
        False when it was not ``old`` any more (another process switched it)."""
        args: dict[str, object] = {"from": old, "to": new}
        if share is not None:
            args["share"] = share
        return bool(self._guarded(lambda: self._switch(self._keys(), args)))

    def lateness(self) -> Lateness:
        """The lateness histogram of heard answers."""
        r, key = self.db.redis, self.keys.pingback_lateness()
        raw = {text(k): text(v) for k, v in self._guarded(lambda: r.hgetall(key)).items()}
        running, buckets = 0, []
        for index, bound in enumerate([*LATE_BUCKETS, float("inf")]):
            running += int(raw.get(f"b:{index}", 0))
            buckets.append((bound, running))
        return Lateness(buckets, float(raw.get("sum", 0.0)), int(raw.get("overdue", 0)))

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "the callback channel's figures are unavailable")


def late_bucket(late_s: float) -> int:
    """The index of the lateness bucket ``late_s`` falls in (``len(LATE_BUCKETS)``: +Inf)."""
    return bisect.bisect_left(LATE_BUCKETS, late_s)


def _channel(found: Sequence[object]) -> Channel:
    state, share, misses, hits, since = (None if v is None else text(v) for v in found)
    return Channel(
        state=state if state in STATES else UP,
        share=float(share) if share is not None else 1.0,
        misses=int(misses or 0),
        hits=int(hits or 0),
        since=int(since or 0),
    )
