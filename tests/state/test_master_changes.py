"""Reconciling after a master change, against a real Redis server: the change is noticed
once (by the master's run id, as Redis last saw it; a new run id at the same address is
a restart, at another one another master), every message Redis still owes is
made due at once, each process's reconnects are added to the deployment's count, and a
solve of which Redis holds no trace is told apart from one that is alive."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from captcha_tasks.errors import StoreUnavailable
from captcha_tasks.state.connections import MasterChangeLog, server_address
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys
from captcha_tasks.state.limiter import LimiterConfig, ThreadLimiter
from captcha_tasks.state.master_changes import MOVED, RESTARTED, MasterChanges
from captcha_tasks.state.owed import OwedConfig, OwedMessages
from captcha_tasks.state.records import Records
from captcha_tasks.testing.processes import free_port

pytestmark = pytest.mark.redis

#: The solve queue a sweep looks at: it holds a message, so lost ones are not yet overdue.
QUEUE = "t-failovers-solve-queue"


def limiter_on(redis_conn: Any, keys: Keys) -> ThreadLimiter:
    config = LimiterConfig(capacity=1, reserve=0, lease_s=30.0)
    return ThreadLimiter(Db(redis_conn, keys), config)


def owed_on(redis_conn: Any, keys: Keys) -> OwedMessages:
    return OwedMessages(Db(redis_conn, keys), OwedConfig(message_grace_s=60.0))


def job(solve_id: str) -> str:
    return json.dumps({"solve_id": solve_id, "attempt": 0})


class Connection:
    """Stands in for a redis-py connection: :class:`MasterChangeLog` reads one attribute."""

    _was_connected = False


def test_a_master_change_is_noticed_once_and_counted(redis_conn: Any, keys: Keys) -> None:
    master_changes = MasterChanges(Db(redis_conn, keys))
    assert master_changes.note_master() is None  # the first look: nothing to compare with
    assert master_changes.note_master() is None  # the same master
    redis_conn.set(keys.redis_master(), "10.9.9.9:6379 the-run-id-of-a-master-that-is-gone")
    assert master_changes.note_master() == MOVED  # another master took over ...
    assert master_changes.note_master() is None  # ... noticed by one look only
    assert master_changes.counts()["master_changes"] == 1


def test_a_new_run_id_at_the_same_address_is_a_restart(redis_conn: Any, keys: Keys) -> None:
    """A plain restart gives the server a new run id too: told apart from another master
    by the address the deployment names (REDIS_URL's here), reconciled and counted alike."""
    master_changes = MasterChanges(Db(redis_conn, keys))
    assert master_changes.note_master() is None
    address, run_id = redis_conn.get(keys.redis_master()).split(" ")
    assert address == server_address(redis_conn) and run_id == redis_conn.info()["run_id"]
    redis_conn.set(keys.redis_master(), f"{address} the-run-id-before-the-restart")
    assert master_changes.note_master() == RESTARTED
    assert master_changes.note_master() is None
    assert master_changes.counts()["master_changes"] == 1


def test_a_run_id_kept_before_addresses_were_kept(redis_conn: Any, keys: Keys) -> None:
    master_changes = MasterChanges(Db(redis_conn, keys))
    run_id = redis_conn.info()["run_id"]
    redis_conn.set(keys.redis_master(), run_id)  # what an older version stored
    assert master_changes.note_master() is None  # the same master: kept with its address now
    assert redis_conn.get(keys.redis_master()) == f"{server_address(redis_conn)} {run_id}"
    redis_conn.set(keys.redis_master(), "an-older-run-id")
    assert master_changes.note_master() == MOVED  # where it was is unknown: another master


def test_reconcile_makes_every_owed_message_due(redis_conn: Any, keys: Keys) -> None:
    owed = owed_on(redis_conn, keys)
    master_changes = MasterChanges(owed.db)
    owed.expect("queued", json.dumps({"method": "turnstile"}))
    owed.owe("owed", job("owed"), deadline_in_s=60, countdown_s=30, unclaim=False)
    redis_conn.rpush(QUEUE, "a message ahead of them")
    redis_conn.set(keys.poll_round(), "1")
    redis_conn.set(keys.threads_check_lock(), "1")
    swept = owed.sweep(0.001, [QUEUE])
    assert swept is not None and not swept.unstarted and not swept.lost  # not due yet

    assert master_changes.reconcile() == (1, 1)
    assert not redis_conn.exists(keys.poll_round(), keys.threads_check_lock())
    redis_conn.delete(keys.housekeeping_lock())
    swept = owed.sweep(0.001, [QUEUE])
    assert swept is not None
    assert [p.lease_id for p in swept.unstarted] == ["queued"]  # the queue notwithstanding
    assert [p.lease_id for p in swept.lost] == ["owed"]
    redis_conn.delete(QUEUE)


def test_reconnects_are_added_and_kept_through_an_outage(redis_conn: Any, keys: Keys) -> None:
    log, connection = MasterChangeLog(), Connection()
    log.connected(connection, "127.0.0.1", 1)
    log.connected(connection, "127.0.0.1", 1)  # the same connection again: a reconnect
    log.connected(connection, "127.0.0.1", 2)  # ... to another master
    assert log.generation == 1

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    away = MasterChanges(Db(dead, keys))
    with pytest.raises(StoreUnavailable):
        away.report("worker", log)
    master_changes = MasterChanges(Db(redis_conn, keys))
    master_changes.report("worker", log)  # what the outage kept
    master_changes.report("worker", log)  # nothing new: no Redis call, nothing added
    assert master_changes.counts() == {"reconnects:worker": 2}


def test_a_solve_without_a_trace_is_told_apart(redis_conn: Any, keys: Keys) -> None:
    limiter = limiter_on(redis_conn, keys)
    records = Records(limiter.db)
    owed_on(redis_conn, keys).expect("queued", "{}")  # its message is on its way
    redis_conn.set(keys.submit_claim("submitting"), "message-id")
    redis_conn.hset(keys.submission("at-the-provider"), "attempt", 0)
    assert limiter.admit("first", job("first"), attempt=0, deadline_in_s=60).status == "go"
    assert limiter.admit("parked", job("parked"), attempt=0, deadline_in_s=60).status == "parked"
    ids = ["queued", "submitting", "at-the-provider", "first", "parked", "lost"]
    assert records.traceless(ids) == ["lost"]
