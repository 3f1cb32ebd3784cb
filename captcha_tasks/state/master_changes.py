"""Master changes: counting them, and reconciling what the old master took with it.

Behind Sentinel (or after a Redis restart without ``appendfsync always``) the writes of
the last moments before the change can be lost.  Housekeeping notices a change by the
master's ``run_id`` (:meth:`MasterChanges.note_master`: Redis keeps the one it last saw, so
exactly one process reconciles each change) and then makes every lost message that Redis
still remembers due at once (:meth:`MasterChanges.reconcile`): solve messages not started
yet, submits owed a message, the pending poll round.  A duplicate message is harmless
(each solve's record and claim stop it), a lost one would wait out its grace.  A new
``run_id`` at the address the master was at is the same server restarted (:data:`RESTARTED`);
at another address, another master took over (:data:`MOVED`): reconciled alike, told
apart in the log.

Each process also counts what it saw itself (reconnects, from
:data:`captcha_tasks.state.connections.MASTER_CHANGES`) and adds it here once Redis answers
(:meth:`MasterChanges.report`), so the exporter serves the deployment's totals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

from .connections import MASTER_CHANGES, MasterChangeLog, server_address
from .db import Db
from .lua import Script, text
from .owed import owed_keys

T = TypeVar("T")

#: What :meth:`MasterChanges.note_master` found: the same server restarted, or another master.
Change = Literal["restarted", "moved"]
RESTARTED: Change = "restarted"
MOVED: Change = "moved"
_CHANGES: dict[int, Change] = {1: MOVED, 2: RESTARTED}

NOTE_MASTER = Script("master_changes/note_master")

RECONCILE = Script("master_changes/reconcile")


class MasterChanges:
    """The deployment's record of master changes and of its processes' reconnects."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.keys = db.keys
        self._note = db.bind(NOTE_MASTER)
        self._reconcile = db.bind(RECONCILE)

    def report(self, process: str, log: MasterChangeLog = MASTER_CHANGES) -> None:
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

    def note_master(self) -> Change | None:
        """What changed of the master since housekeeping last looked (once per change,
        for one process): :data:`RESTARTED` (a new ``run_id`` at the same address),
        :data:`MOVED` (another address), or None (the same master, or the first look)."""
        r = self.db.redis
        info: dict[str, Any] = self._guarded(lambda: r.info("server"))
        where = self._guarded(lambda: server_address(r))
        keys = {"master": self.keys.redis_master(), "events": self.keys.redis_events()}
        args = {"run_id": str(info["run_id"]), "address": where}
        changed = int(self._guarded(lambda: self._note(keys, args)))
        return _CHANGES.get(changed)

    def reconcile(self) -> tuple[int, int]:
        """Make every message Redis still owes due now; returns (solve messages, owed
        submits)."""
        keys = {
            **owed_keys(self.keys),
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
        return self.db.guard(call, "master-change counts are unavailable")
