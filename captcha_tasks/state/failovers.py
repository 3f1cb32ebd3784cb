"""Master changes: counting them, and reconciling what the old master took with it.

Behind Sentinel (or after a Redis restart without ``appendfsync always``) the writes of
the last moments before the change can be lost.  Housekeeping notices a change by the
master's ``run_id`` (:meth:`Failovers.note_master`: Redis keeps the one it last saw, so
exactly one process reconciles each change) and then makes every lost message that Redis
still remembers due at once (:meth:`Failovers.reconcile`): solve messages not started
yet, submits owed a message, the pending poll round.  A duplicate message is harmless
(each solve's record and claim stop it), a lost one would wait out its grace.

Each process also counts what it saw itself (reconnects, from
:data:`captcha_tasks.connections.FAILOVERS`) and adds it here once Redis answers
(:meth:`Failovers.report`), so the exporter serves the deployment's totals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..connections import FAILOVERS, FailoverLog
from .db import Db
from .limiter import MESSAGES, SLOTS
from .lua import Script, text

T = TypeVar("T")

NOTE_MASTER = Script(
    """
-- Remember the master's run id; count a change.
-- K.master (string: the run id last seen), K.events (hash: counters)
-- A.run_id = the master's run id now
-- returns 1 when the master changed since it was last seen (0 the first time, or same)
""",
    keys=("master", "events"),
    body="""
local seen = redis.call('GET', K.master)
if seen == A.run_id then return 0 end
redis.call('SET', K.master, A.run_id)
if not seen then return 0 end
redis.call('HINCRBY', K.events, 'master_changes', 1)
return 1
""",
)

RECONCILE = Script(
    """
-- After a master change: every message Redis remembers owing is due now, whatever the
-- solve queue holds (the next housekeeping sweep sends them again), a poll round is
-- scheduled anew and the provider's thread count looked at.
-- K: SLOTS, MESSAGES (the limiter's), K.round (the pending poll round), K.threads_check
-- A (none: an empty object)
-- returns {solve messages, owed submits} made due
""",
    keys=("round", "threads_check"),
    libs=(SLOTS, MESSAGES),
    body="""
local function all_due(key)
  local ids = redis.call('ZRANGE', key, 0, -1)
  for _, id in ipairs(ids) do redis.call('ZADD', key, 0, id) end
  return #ids
end
local solves = all_due(K.requested)
local owed = all_due(K.dispatch)
redis.call('DEL', K.round, K.threads_check)
return {solves, owed}
""",
)


class Failovers:
    """The deployment's record of master changes and of its processes' reconnects."""

    def __init__(self, db: Db, lua_keys: Callable[[], dict[str, str]]) -> None:
        self.db = db
        self.keys = db.keys
        self._lua_keys = lua_keys
        self._note = db.bind(NOTE_MASTER)
        self._reconcile = db.bind(RECONCILE)

    def report(self, process: str, log: FailoverLog = FAILOVERS) -> None:
        """Add what ``log`` (this process's) counted since the last report (``process``:
        the kind of process, a metric label); kept for the next report when Redis is
        away.  No Redis call when there is nothing to add."""
        reconnects = log.drain()
        if not reconnects:
            return
        key, r = self.keys.redis_events(), self.db.redis
        try:
            self._guarded(lambda: r.hincrby(key, f"reconnects:{process}", reconnects))
        except Exception:
            log.undrain(reconnects)
            raise

    def note_master(self) -> bool:
        """Whether the master changed since housekeeping last looked (True once per
        change, for one process)."""
        r = self.db.redis
        info: dict[str, Any] = self._guarded(lambda: r.info("server"))
        keys = {"master": self.keys.redis_master(), "events": self.keys.redis_events()}
        changed = self._guarded(lambda: self._note(keys, {"run_id": str(info["run_id"])}))
        return bool(changed)

    def reconcile(self) -> tuple[int, int]:
        """Make every message Redis still owes due now; returns (solve messages, owed
        submits)."""
        keys = {
            **self._lua_keys(),
            "round": self.keys.poll_round(),
            "threads_check": self.keys.threads_check_lock(),
        }
        solves, owed = self._guarded(lambda: self._reconcile(keys, {}))
        return int(solves), int(owed)

    def counts(self) -> dict[str, int]:
        """``master_changes`` and ``reconnects:<process>`` as counted so far."""
        key, r = self.keys.redis_events(), self.db.redis
        raw: dict[Any, Any] = self._guarded(lambda: r.hgetall(key))
        return {text(field): int(value) for field, value in raw.items()}

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "failover counts are unavailable")
