"""What the deployment is owed: task messages that must show up, at every provider alike.

Two kinds, both kept under the deployment's keys (the same whichever provider a solve is
at, so one sweep covers them all):

* a submit *owed a message*: the limiter handed it out (a slot freed for it, its deferral's
  time came, its provider went out of rotation), a failed captcha was retired, or it is
  published again later (:meth:`OwedMessages.owe`).  Its job waits in Redis until that
  message starts, and when the message counts as lost is kept with it;
* a solve message on its way (:meth:`OwedMessages.expect`), until it starts.

Housekeeping sweeps both once per tick for the whole deployment
(:meth:`OwedMessages.sweep`): a message that never showed up (its worker died between
Redis handing it out and publishing it, or the broker dropped it) is handed out again.
The limiter's and the board's scripts keep these entries with the Lua functions of
``lib/owed.lua`` (see :mod:`.lua`).  Nothing Redis hands out exists only in one process's
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..core.admission import Parked
from .db import Db
from .keys import Keys
from .lua import Script, ms, text

T = TypeVar("T")

EXPECT = Script("owed/expect")
OWE = Script("owed/owe")
SWEEP = Script("owed/sweep")


def owed_keys(keys: Keys) -> dict[str, str]:
    """The keys of ``lib/owed.lua`` (the deployment's, whatever the scope of ``keys``)."""
    return {
        "waiting": keys.waiting(),
        "dispatch": keys.dispatch(),
        "requested": keys.requested(),
        "requested_messages": keys.requested_messages(),
    }


@dataclass(frozen=True)
class OwedConfig:
    #: Seconds a submit's owed message may take to start before it is sent again.
    dispatch_grace_s: float = 5.0
    #: Seconds a solve message may wait to start (the queue empty) before it is sent again
    #: (longer than a dead worker's unacknowledged messages take to come back).
    message_grace_s: float = 70.0


@dataclass(frozen=True)
class Swept:
    """What one sweep found: submits whose message was lost (``lost``: lease id and job)
    and solve messages that never started (``unstarted``: the solve id and the message's
    keyword arguments, JSON), each handed out again."""

    lost: list[Parked]
    unstarted: list[Parked]


class OwedMessages:
    """The messages the deployment is owed, and the sweep that sends lost ones again."""

    def __init__(self, db: Db, config: OwedConfig | None = None) -> None:
        self.db = db
        self.keys = db.keys
        self.config = config or OwedConfig()
        self._expect = db.bind(EXPECT)
        self._owe = db.bind(OWE)
        self._sweep = db.bind(SWEEP)

    def expect(self, solve_id: str, message: str) -> None:
        """A solve message (its keyword arguments, JSON) is about to be published: wait for
        it to start (the limiter's admission), and publish it again from :meth:`sweep` if it
        is lost on its way to a worker."""
        args = {"id": solve_id, "message": message, "wait_ms": ms(self.config.message_grace_s)}
        self._guarded(lambda: self._expect(owed_keys(self.keys), args))

    def owe(
        self, solve_id: str, job: str, *, deadline_in_s: float, countdown_s: float, unclaim: bool
    ) -> None:
        """The submit of ``job`` is published again after ``countdown_s``: owe it, so that
        :meth:`sweep` hands it out again if that message is lost (and give up the submit
        claim unless another message holds it)."""
        keys = {**owed_keys(self.keys), "claim": self.keys.submit_claim(solve_id)}
        args = {
            "id": solve_id,
            "job": job,
            "due_ms": ms(countdown_s + self.config.dispatch_grace_s),
            "deadline_ms": ms(max(0.0, deadline_in_s)),
            "unclaim": unclaim,
        }
        self._guarded(lambda: self._owe(keys, args))

    def sweep(
        self,
        tick_s: float,
        solve_queues: Sequence[str],
        submit_queue: str = "",
        most: int = 500,
    ) -> Swept | None:
        """Hand out again the submits and solves whose message was lost, at every provider;
        None when another process swept within ``tick_s`` (the process that sweeps runs
        every provider's housekeeping too).  ``solve_queues`` (the solve queues of every
        lane) and ``submit_queue`` are the broker's lists of those messages: while one is
        backed up, its messages are only waiting ("": none known)."""
        keys: dict[str, Any] = {
            **owed_keys(self.keys),
            "lock": self.keys.housekeeping_lock(),
            "submit_queue": submit_queue,
            "solve_queues": list(solve_queues),
        }
        args = {
            "lock_ms": max(1, ms(tick_s)),
            "most": most,
            "grace_ms": ms(self.config.dispatch_grace_s),
            "message_grace_ms": ms(self.config.message_grace_s),
        }
        reply = self._guarded(lambda: self._sweep(keys, args))
        if int(reply[0]) == 0:
            return None
        return Swept(parked_list(reply[1]), parked_list(reply[2]))

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "nothing is submitted until it is back")


def parked_list(flat: list[Any]) -> list[Parked]:
    """A flat reply ``[id, job, id, job, ...]`` as values."""
    items = [text(x) for x in flat]
    return [Parked(items[i], items[i + 1]) for i in range(0, len(items), 2)]
