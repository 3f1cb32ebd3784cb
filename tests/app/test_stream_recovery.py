"""What a batch's caller does after a master change, without I/O: it reads its stream
from the start again once per move, and looks at the pending tasks old enough to have
left a trace in Redis, once per interval."""

from __future__ import annotations

import time

from captcha_tasks.stream import TRACE_EVERY_S, Batch


def test_a_master_move_rereads_the_stream_once() -> None:
    batch = Batch("b", timeout=60)
    batch.last_id = "1700000000000-5"
    assert not batch.master_moved(0)  # the generation it started with
    assert batch.last_id == "1700000000000-5"
    assert batch.master_moved(1)
    assert batch.last_id == "0-0"  # the new master's entries may sort before the old's
    batch.last_id = "1700000000001-0"
    assert not batch.master_moved(1)
    assert batch.last_id == "1700000000001-0"


def test_pending_tasks_are_looked_at_once_per_interval_and_when_old_enough() -> None:
    batch = Batch("b", timeout=60)
    batch.sent(0, "old", "turnstile", {"method": "turnstile", "sitekey": "k0"})
    batch.sent(1, "young", "turnstile", {"method": "turnstile", "sitekey": "k1"})
    batch.pending[0].sent_at -= 2 * TRACE_EVERY_S  # sent long ago (no sleeping)
    assert not batch.look_due(TRACE_EVERY_S)  # the batch has just started
    batch.looked_at -= TRACE_EVERY_S
    assert batch.look_due(TRACE_EVERY_S)
    looked = batch.to_look_at(TRACE_EVERY_S)
    assert [p.task_id for p in looked] == ["old"]
    assert looked[0].kwargs == {"method": "turnstile", "sitekey": "k0"}  # to send it again
    assert not batch.look_due(TRACE_EVERY_S)
    assert time.monotonic() - batch.looked_at < TRACE_EVERY_S
