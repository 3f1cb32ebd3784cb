"""Celery behind real sentinels: a worker, beat and an app process calling
``solve.delay(...).get()`` ride out a graceful switch and a kill -9 of the master without a
restart.  After each event the worker consumes from the new master, results reach the
caller through it, beat (and RedBeat) keeps ticking, and every process is still alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import EVENTS, happen  # tests/ha/conftest.py

from captcha_tasks.state.connections import FOLLOW_S
from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import CeleryProcess, redis_client, wait_until
from harness.sentinel_cluster import SentinelCluster, role

pytestmark = pytest.mark.system

PROBE = Path(__file__).with_name("solve_probe.py")
PAGE = "https://example.com/sentinel"
#: Short HTTP timeouts allow a short visibility timeout: messages a lost connection left
#: unacknowledged come back within seconds.
FAST = {
    "CAPTCHAAI_CONNECT_TIMEOUT": "2",
    "CAPTCHAAI_READ_TIMEOUT": "5",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "10",
    "CAPTCHAAI_SOLVE_TIMEOUT": "60",
    "CAPTCHAAI_SLOT_LEASE": "20",
    "CAPTCHAAI_PREWARM_EVERY": "1",
}
#: Seconds the stack may take to serve again after an event (recorded, not asserted).
RECOVER_S = 60


class Probe:
    """``solve_probe.py`` as a child process; its lines are collected as they come."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.calls: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [sys.executable, str(PROBE), PAGE],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=open(log, "ab"),  # noqa: SIM115  (closed with the process)
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.calls.append(json.loads(line))

    def solved(self, began_after: float = 0.0) -> list[dict[str, Any]]:
        return [c for c in list(self.calls) if c["ok"] and c["began"] >= began_after]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.reader.join(5)


@pytest.fixture
def stack(
    cluster: SentinelCluster, output_dir: Path, sandbox: Any, request: pytest.FixtureRequest
) -> Iterator[tuple[CeleryProcess, CeleryProcess, Probe]]:
    sandbox.configure(solve_time=0.2, jitter=0.05)
    tag = request.node.name.replace("[", "-").rstrip("]")
    log_dir = output_dir / "sentinel" / tag
    env = {**FAST, **cluster.env(), "CAPTCHAAI_KEY_PREFIX": tag, "CAPTCHAAI_QUEUE_PREFIX": tag}
    env["CAPTCHAAI_BASE_URL"] = sandbox.url  # the module's own sandbox
    worker = CeleryProcess("worker", env=env, log_dir=log_dir, name=f"{tag}-worker")
    beat = CeleryProcess("beat", env=env, log_dir=log_dir, name=f"{tag}-beat")
    probe: Probe | None = None
    try:
        worker.start()
        beat.start()
        probe = Probe(env, log_dir / "probe.log")
        yield worker, beat, probe
    finally:
        if probe is not None:
            probe.stop()
        beat.stop()
        worker.stop()


def ticks(proc: CeleryProcess, marker: str, after: int, also: str = "") -> int:
    """Lines of ``proc``'s log past ``after`` that say ``marker`` (and ``also``)."""
    return sum(marker in line and also in line for line in proc.log_text()[after:].splitlines())


@pytest.mark.parametrize("event", EVENTS)
def test_worker_beat_and_results_ride_out_the_event(
    cluster: SentinelCluster,
    stack: tuple[CeleryProcess, CeleryProcess, Probe],
    event: str,
    record: Callable[..., None],
) -> None:
    worker, beat, probe = stack
    wait_until(lambda: len(probe.solved()) >= 3, 60, what="three solves before the event")
    beat_mark, worker_mark = len(beat.log_text()), len(worker.log_text())
    started = time.monotonic()
    old, new = happen(cluster, event)
    in_place = time.monotonic()

    # Results: calls begun once every client could have moved are solved, through the new
    # master.  (What the old master took between the promotion and the moves is lost with
    # it: reconciling that is the next phase's.)
    settled = in_place + FOLLOW_S + 1
    wait_until(lambda: len(probe.solved(settled)) >= 5, RECOVER_S, what="solves after")
    on_new = redis_client(new.url)

    def through_new(call: dict[str, Any]) -> bool:
        return bool(call["ok"] and on_new.exists(f"celery-task-meta-{call['task_id']}"))

    assert all(through_new(call) for call in probe.solved(settled))
    served = [c for c in probe.solved(in_place) if through_new(c)]

    # Beat keeps ticking, and the worker runs what it sends.
    wait_until(
        lambda: (
            ticks(beat, "Sending due task captcha-tasks-prewarm", beat_mark) >= 3
            and ticks(worker, "succeeded", worker_mark, "Task captcha_tasks.prewarm[") >= 4
        ),
        RECOVER_S,
        what="beat's ticks run after the event",
    )
    assert worker.alive() and beat.alive()
    assert "Unrecoverable error" not in worker.log_text()
    assert "No master found for None" not in beat.log_text() + worker.log_text()
    assert old.port != new.port

    # Every call begun before the first settled solve has ended (lost ones time out).
    last = min(c["n"] for c in probe.solved(settled))
    wait_until(lambda: set(range(last)) <= {c["n"] for c in probe.calls}, RECOVER_S)
    around = [c for c in probe.calls if c["began"] >= started - 2 and c["n"] < last]
    # solve.delay() raises StoreUnavailable while no master answers: nothing was queued.
    refused = [c for c in around if "StoreUnavailable" in c.get("error", "")]
    record(
        event=event,
        client="solve.delay().get() (worker, broker, results)",
        event_seconds=round(in_place - started, 2),
        seconds=round(min(c["ended"] for c in served) - started, 2),
        calls_refused=len(refused),
        calls_lost=len([c for c in around if not through_new(c) and c not in refused]),
    )


@pytest.mark.parametrize("event", EVENTS)
def test_redbeat_keeps_ticking_on_the_new_master(
    cluster: SentinelCluster, output_dir: Path, event: str, request: pytest.FixtureRequest
) -> None:
    """RedBeat keeps its schedule and lock in Redis: behind Sentinel it reaches them
    through the ``redis-sentinel://`` URL and the sentinels in its options."""
    tag = request.node.name.replace("[", "-").rstrip("]")
    env = {**FAST, **cluster.env(), "CAPTCHAAI_KEY_PREFIX": tag, "CAPTCHAAI_QUEUE_PREFIX": tag}
    beat = CeleryProcess(
        "beat",
        env=env,
        log_dir=output_dir / "sentinel" / tag,
        name=f"{tag}-redbeat",
        extra_args=["-S", "captcha_tasks.worker.beat:RedBeatScheduler"],
    )
    entry = f"{Keys(tag).redbeat_prefix()}captcha-tasks-prewarm"
    with beat.start():
        wait_until(lambda: ticks(beat, "Sending due task captcha-tasks-prewarm", 0) >= 2, 30)
        mark = len(beat.log_text())
        old, new = happen(cluster, event)
        on_new = redis_client(new.url)
        last_run = lambda: json.loads(on_new.hget(entry, "meta") or "{}").get("last_run_at")  # noqa: E731
        seen = last_run()
        wait_until(
            lambda: (
                ticks(beat, "Sending due task captcha-tasks-prewarm", mark) >= 3
                and last_run() != seen
            ),
            RECOVER_S,
            what="RedBeat ticking on the new master",
        )
        if event == "switch":
            # The sentinels demote the old master some ten seconds on and cut its clients
            # (RedBeat's lock holds one): beat goes on.
            wait_until(lambda: role(old) == "slave", RECOVER_S, what="the old master demoted")
            mark = len(beat.log_text())
            wait_until(
                lambda: ticks(beat, "Sending due task captcha-tasks-prewarm", mark) >= 2,
                RECOVER_S,
                what="RedBeat ticking after the old master's demotion",
            )
        assert beat.alive()
