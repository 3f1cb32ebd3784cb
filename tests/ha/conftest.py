"""Redis behind Sentinel for the failover tests: one master, one replica and three
sentinels on loopback (passwords on the servers and on the sentinels), fresh for each
test, and the two events a deployment rides out."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from captcha_tasks.testing.processes import RedisServer
from harness.sentinel_cluster import SentinelCluster

#: A graceful switch (SENTINEL FAILOVER) and a kill -9 of the master (a replica promoted).
EVENTS = ("switch", "kill")


@pytest.fixture
def cluster(output_dir: Path, request: pytest.FixtureRequest) -> Iterator[SentinelCluster]:
    name = request.node.name.replace("[", "-").rstrip("]")
    deployment = SentinelCluster(
        log_dir=output_dir / "sentinel" / name,
        password="server-" + os.urandom(4).hex(),
        sentinel_password="sentinel-" + os.urandom(4).hex(),
    )
    with deployment.start():
        yield deployment


def happen(cluster: SentinelCluster, event: str) -> tuple[RedisServer, RedisServer]:
    """Run ``event``; returns (old master, new master) once the new one is in place."""
    return cluster.failover() if event == "switch" else cluster.kill_master()


@pytest.fixture
def record(output_dir: Path) -> Callable[..., None]:
    """Note how long a client took to ride out an event (read for the reports, never
    asserted: speed targets live in the benchmark scripts)."""

    def note(**fields: object) -> None:
        with open(output_dir / "failover-times.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps({"at": time.time(), **fields}) + "\n")

    return note
