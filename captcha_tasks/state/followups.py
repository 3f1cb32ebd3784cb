"""What runs when a solve ends: its caller's follow-ups (Celery's callbacks, chain and chord
part), kept in Redis from the solve's start to its end, and owed until they have run.

The state layer keeps them as opaque JSON; the worker knows what is in them.  The
completion script takes a solve's follow-up (:data:`FOLLOWUPS`) in the same atomic step
that ends it, and leaves it *owed*: if the process that should run it dies first,
housekeeping finds it past its grace (:meth:`Followups.lost`) and runs it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..keys import Keys
from .db import Db
from .lua import Lib, Script, ms, text

T = TypeVar("T")

#: Lua: K.followup (string with a TTL: the solve's follow-up), K.followups_owed (hash:
#: solve id -> follow-up), K.followups_due (zset: solve id -> when it counts as lost, ms).
FOLLOWUPS = Lib(
    name="FOLLOWUPS",
    keys=("followup", "followups_owed", "followups_due"),
    source="""
-- Take the ending solve's follow-up (false when it has none); it is owed until done.
local function followup_take(K, id, grace_ms)
  local followup = redis.call('GET', K.followup)
  if not followup then return false end
  redis.call('DEL', K.followup)
  redis.call('HSET', K.followups_owed, id, followup)
  redis.call('ZADD', K.followups_due, now + grace_ms, id)
  return followup
end
""",
)

LOST = Script(
    """
-- Follow-ups owed past their grace (the process that should have run them died): each is
-- handed out again, owed for another grace.
-- K: FOLLOWUPS (K.followup unused)
-- A.most, A.grace_ms
-- returns {id, follow-up, id, follow-up, ...}
""",
    libs=(FOLLOWUPS,),
    body="""
local out = {}
local ids = redis.call('ZRANGEBYSCORE', K.followups_due, '-inf', now, 'LIMIT', 0, A.most)
for _, id in ipairs(ids) do
  local followup = redis.call('HGET', K.followups_owed, id)
  if followup then
    redis.call('ZADD', K.followups_due, now + A.grace_ms, id)
    table.insert(out, id)
    table.insert(out, followup)
  else
    redis.call('ZREM', K.followups_due, id)
  end
end
return out
""",
)


def followup_keys(keys: Keys, solve_id: str) -> dict[str, str]:
    """The keys of :data:`FOLLOWUPS` for one solve."""
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
