"""A whole deployment behind real sentinels through both failover events, mid-batch.

A 300-captcha ``captcha-tasks batch`` runs on two workers with beat, the metrics exporter
and the pingback receiver, behind a master, a replica and three sentinels.  At 80 solved
the sentinels switch the master (``SENTINEL FAILOVER``); at 180 solved the then master is
SIGKILLed and the replica promoted.  The batch command survives and reports every index
once, with at least 297 solved; no token is delivered twice; at most 315 captchas are paid
(the sandbox's journal counts them); no thread lease is left 20 s after the end; ten more
``solve.delay(...).get()`` calls succeed; every process is alive and serving afterwards,
and the exporter counts the master changes and every kind of process's reconnects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from captcha_tasks.core import pingback
from captcha_tasks.testing.processes import queue_names, redis_client, wait_until
from harness.sentinel_cluster import SentinelCluster
from harness.sentinel_deployment import FAST, PAGE, Event, SentinelDeployment, run_batch

pytestmark = pytest.mark.system

PROBE = Path(__file__).with_name("solve_probe.py")
COUNT = 300
EVENTS = (Event("switch", 80), Event("kill", 180))
MIN_SOLVED, MOST_PAID = 297, 315
#: A solve whose every trace a failover took, and that the batch could not send again, is
#: failed by the batch when this late.
TASK_TIMEOUT_S = float(FAST["CAPTCHAAI_SOLVE_TIMEOUT"]) + 15
LEASES_GONE_S = 20


@pytest.fixture
def deployment(output_dir: Path) -> Iterator[SentinelDeployment]:
    log_dir = output_dir / "failover-batch"
    cluster = SentinelCluster(
        log_dir=log_dir / "sentinel",
        password="server-" + os.urandom(4).hex(),
        sentinel_password="sentinel-" + os.urandom(4).hex(),
    )
    with cluster.start():
        tag = "failover-" + os.urandom(3).hex()
        with SentinelDeployment(cluster, log_dir, tag).start() as built:
            yield built


def dump_state(d: SentinelDeployment) -> None:
    """The deployment's keys on the master at the end (for diagnosis, never asserted)."""
    master = redis_client(d.cluster.master().url)
    found: dict[str, Any] = {}
    for key in master.scan_iter(f"{d.tag}*"):
        kind = master.type(key)
        if kind == "hash":
            found[key] = master.hgetall(key)
        elif kind == "zset":
            found[key] = master.zrange(key, 0, -1, withscores=True)
        else:
            found[key] = master.get(key) if kind == "string" else kind
    (d.log_dir / "state-after.json").write_text(json.dumps(found, indent=1, default=str))


def metric(scraped: str, name: str) -> float:
    """The value of sample ``name`` (with its labels) in a Prometheus text page (0: none)."""
    for line in scraped.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.timeout(TASK_TIMEOUT_S + 300)
def test_a_batch_rides_out_a_switch_and_a_kill(deployment: SentinelDeployment) -> None:
    d = deployment
    run = run_batch(d, COUNT, EVENTS, TASK_TIMEOUT_S)
    dump_state(d)
    assert run.returncode in (0, 1), run.summary  # it did not die of the failovers

    assert sorted(line["index"] for line in run.lines) == list(range(COUNT)), run.summary
    solved = run.solved()
    failed = [line for line in run.lines if line["status"] != "solved"]
    assert len(solved) >= MIN_SOLVED, failed
    assert all(line["error"].startswith("ERROR_") for line in failed), failed
    tokens = [line["token"] for line in solved]
    assert len(set(tokens)) == len(tokens)  # no token delivered twice
    paid = d.sandbox.paid()
    assert len(paid) <= MOST_PAID, len(paid)

    # No thread lease is left once the leases of lost writes had their time.
    wait_until(lambda: not d.leases(), LEASES_GONE_S - (time.monotonic() - run.ended))

    # Ten more calls, from a fresh app process, succeed.
    calls = subprocess.run(
        [sys.executable, str(PROBE), PAGE, "10"],
        env={**os.environ, **d.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    made = [json.loads(line) for line in calls.stdout.splitlines()]
    assert len(made) == 10 and all(c["ok"] for c in made), (made, calls.stderr[-2000:])

    # Every process is alive and serving; the exporter counts the master changes.
    assert not d.dead(), d.dead()
    master = redis_client(d.cluster.master().url)
    assert not any(master.llen(q) for q in queue_names(d.env))
    assert d.get("receiver") is not None
    # The receiver judges a callback on the new master: a good ticket for a captcha not
    # registered (yet) is kept there as an early callback.
    ticket = pingback.ticket(d.env["CAPTCHAAI_PINGBACK_SECRET"], "no-such-solve", 0)
    callback = d.servers["receiver"][1].replace("/health", f"/captcha/pingback/{ticket}")
    reply = requests.post(callback, data={"id": "123", "code": "0.tok"}, timeout=10)
    assert (reply.status_code, reply.text) == (202, "early")
    scraped = d.get("metrics") or ""
    assert metric(scraped, "captcha_tasks_redis_master_changes_total") == len(EVENTS)
    for process in ("worker", "beat", "exporter", "app"):
        name = f'captcha_tasks_redis_reconnects_total{{process="{process}"}}'
        assert metric(scraped, name) >= 1, (process, scraped[-3000:])
