"""The gateway's request counts (``state.gateway.GatewayStats``) against a real Redis: kept
in memory between flushes, and a flush a barrier for every count made before it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from captcha_tasks.state.db import Db
from captcha_tasks.state.gateway import GatewayStats
from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import wait_until

pytestmark = pytest.mark.redis

WHERE = ("shop", "2captcha", "res.php:getbalance")


def test_a_flush_returns_only_once_a_flush_already_writing_has_written(
    redis_conn: Any, keys: Keys
) -> None:
    """A request thread's flush (one a count made due) can be writing when the gateway
    shuts down, or a reader flushes: that flush finds nothing left in memory, and must
    still not return before those counts are in Redis."""
    stats = GatewayStats(Db(redis_conn, keys))
    stats.count(*WHERE, None, 0.01)
    redis_conn.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")  # the first flush blocks
    try:
        writing = threading.Thread(target=stats.flush)
        writing.start()
        # it has taken the counts out of memory and waits on Redis
        wait_until(lambda: not stats._pending, 5, what="the first flush to take the counts")
        second = threading.Thread(target=stats.flush)
        second.start()
        second.join(0.5)  # a flush that did not wait returns at once: nothing to write
        assert second.is_alive()
    finally:
        redis_conn.execute_command("CLIENT", "UNPAUSE")
    second.join(5)
    writing.join(5)
    assert not second.is_alive() and not writing.is_alive()
    assert stats.read()[WHERE].requests == 1
