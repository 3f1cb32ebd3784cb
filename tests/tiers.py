"""The suite's tiers, by what a test starts, and the guards that keep each test honest to
its tier.

- ``unit``: opens no socket.
- ``redis``: a Redis server and the in-process sandbox; no Celery worker process.
- ``e2e``: starts worker, beat or receiver processes (or an in-process Celery worker).
- ``system``: packaging, the docs site with Chromium, compose files, the quickstart and
  README steps, the examples, Kafka through Maven, npm, the SDK conformance test, the HA
  cluster.

Every test carries exactly one tier marker (its module's ``pytestmark``, or its own in a
module of mixed tiers); a test without one, or with two, is a collection error.
``./scripts/test`` runs ``unit or redis``; ``--all`` runs every tier.  A unit test that
opens a socket, or a redis-tier test that starts a worker, beat, receiver or Flower
process, fails with a message naming its tier.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

TIERS = ("unit", "redis", "e2e", "system")

#: Fixtures that start worker, beat or receiver processes: no unit or redis test uses them.
PROCESS_FIXTURES = frozenset({"worker", "start_worker", "cluster", "kafka_broker"})

#: Words in a command line that make it a worker, beat, receiver or gateway process (or
#: Flower):
#: a redis-tier test starts none (a CLI command, Node or the Redis server itself is fine).
PROCESS_WORDS = frozenset({"worker", "beat", "receiver", "gateway", "flower", "celery"})


class TierViolation(AssertionError):
    """A test did what its tier marker says it does not."""


def tier_of(item: pytest.Item) -> str | None:
    """The test's one tier (``None`` without one, ``"many"`` with two: ``-m`` would select
    it for either, so a module of mixed tiers marks each test instead of ``pytestmark``)."""
    marks = {m.name for m in item.iter_markers() if m.name in TIERS}
    return marks.pop() if len(marks) == 1 else ("many" if marks else None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wrong = sorted(
        {
            f"{item.nodeid}: {tier_of(item) or 'no'} tier"
            for item in items
            if tier_of(item) in (None, "many")
        }
    )
    if wrong:
        raise pytest.UsageError(
            "every test needs exactly one tier marker (unit, redis, e2e or system):\n  "
            + "\n  ".join(wrong[:20])
        )


def _refuse_sockets(tier: str, nodeid: str) -> Iterator[None]:
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def refuse(self: socket.socket, address: Any) -> Any:
        raise TierViolation(
            f"{nodeid} is a {tier} test but connected to {address!r}: mark it redis"
        )

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex  # type: ignore[method-assign]


def _refuse_processes(nodeid: str) -> Iterator[None]:
    real_popen = subprocess.Popen

    class GuardedPopen(real_popen):  # type: ignore[valid-type,misc]
        def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
            argv = [
                str(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else args)
            ]
            if PROCESS_WORDS.intersection(os.path.basename(a) for a in argv):
                raise TierViolation(f"{nodeid} is a redis test but started {argv[:3]}: mark it e2e")
            super().__init__(args, *rest, **kwargs)

    subprocess.Popen = GuardedPopen  # type: ignore[misc]
    try:
        yield
    finally:
        subprocess.Popen = real_popen  # type: ignore[misc]


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    tier = tier_of(request.node)
    nodeid = request.node.nodeid
    if tier in ("unit", "redis"):
        started = PROCESS_FIXTURES.intersection(request.fixturenames)
        if started:
            raise TierViolation(
                f"{nodeid} is a {tier} test but uses {sorted(started)}: mark it e2e"
            )
    if tier == "unit":
        yield from _refuse_sockets(tier, nodeid)
    elif tier == "redis":
        yield from _refuse_processes(nodeid)
    else:
        yield
