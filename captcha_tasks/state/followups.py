"""What runs when a solve ends: its caller's follow-ups (Celery's callbacks, chain and chord
part), kept in Redis from the solve's start to its end, and owed until they have run.

The state layer keeps them as opaque JSON; the worker knows what is in them.  The
completion takes a solve's follow-up (``lib/followups.lua``) in the same atomic step
that ends it, and leaves it *owed*: if the process that should run it dies first,
housekeeping finds it past its grace (:meth:`Followups.lost`) and runs it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .db import Db
from .keys import Keys
from .lua import Script, ms, text

T = TypeVar("T")

LOST = Script("followups/lost")


def followup_keys(keys: Keys, solve_id: str) -> dict[str, str]:
    """The keys of ``lib/followups.lua`` for one solve."""
    return {
        "followup": keys.followup(solve_id),
        "followups_owed": keys.followups_owed(),
        "followups_due": keys.followups_due(),
    }


class Followups:
    """Follow-ups of solves: kept until the solve ends, owed until they have run."""

    def __init__(self, db: Db, grace_s: float = 30.0) -> None:
        self.db = db
        self.grace_s = grace_s
        self._lost = db.bind(LOST)

    def keep(self, solve_id: str, followup: str, ttl_s: int) -> None:
        """Keep ``followup`` (JSON) until ``solve_id`` ends (at most ``ttl_s``)."""
        key, r = self.db.keys.followup(solve_id), self.db.redis
        self._guarded(lambda: r.set(key, followup, ex=ttl_s))

    def done(self, solve_id: str) -> None:
        """The follow-up of ``solve_id`` has run: it is owed no more."""
        k = self.db.keys
        pipe = self.db.pipeline()
        pipe.hdel(k.followups_owed(), solve_id)
        pipe.zrem(k.followups_due(), solve_id)
        self._guarded(pipe.execute)

    def lost(self, most: int = 100) -> list[tuple[str, str]]:
        """Owed follow-ups past their grace, handed out again: (solve id, follow-up)."""
        keys = followup_keys(self.db.keys, "-")
        args: dict[str, Any] = {"most": most, "grace_ms": ms(self.grace_s)}
        flat = [text(x) for x in self._guarded(lambda: self._lost(keys, args))]
        return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "follow-ups are unavailable")
