"""The replica fence behind real sentinels: an admission that money follows (``go``: the
worker calls ``in.php`` next) must reach the replica first, while a replica could take
over; with none that could (the replica killed, marked down by the sentinels) admissions
go on without waiting."""

from __future__ import annotations

import os
import signal

import pytest

from captcha_tasks.errors import StoreUnavailable
from captcha_tasks.state import State
from captcha_tasks.testing.processes import wait_until
from harness.sentinel_cluster import SentinelCluster

pytestmark = pytest.mark.system


def admit(state: State, solve_id: str) -> str:
    return state.limiter.admit(solve_id, "{}", attempt=0, deadline_in_s=60).status


def test_an_admission_waits_for_the_replica_while_one_could_take_over(
    cluster: SentinelCluster,
) -> None:
    settings = cluster.settings()
    state = State.build(settings)
    assert state.db.fence is not None
    assert admit(state, "replicated") == "go"

    [replica] = [node for node in cluster.nodes if node is not cluster.master()]
    os.kill(replica.pid, signal.SIGSTOP)  # it acknowledges nothing, still "up" for now
    try:
        with pytest.raises(StoreUnavailable, match="nothing is submitted until a replica"):
            admit(state, "not-replicated")
    finally:
        os.kill(replica.pid, signal.SIGCONT)

    replica.kill()
    wait_until(lambda: not state.db.fence.needed(), 30, what="the sentinels to mark it down")
    assert admit(state, "alone") == "go"  # no replica to wait for: it goes on
