"""A whole deployment behind real sentinels through both failover events, mid-batch.

A 300-captcha ``captcha-tasks batch`` runs on two workers with beat, the metrics exporter
and the pingback receiver, behind a master, a replica and three sentinels.  At 80 solved
the sentinels switch the master (``SENTINEL FAILOVER``); at 180 solved the then master is
SIGKILLed and the replica promoted.  The batch command survives and reports every index
once, with at least 297 solved; no token is delivered twice; at most 315 captchas are paid
(the sandbox's journal counts them); no thread lease is left 20 s after the end; ten more
``solve.delay(...).get()`` calls succeed; every process is alive and serving afterwards,
and the exporter shows the master changes.
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

from captcha_tasks.dev.devstack import (
    CeleryProcess,
    SandboxProcess,
    SentinelCluster,
    free_port,
    queue_names,
    redis_client,
    wait_until,
    write_tasks,
)
from captcha_tasks.keys import Keys

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("solve_probe.py")
PAGE = "https://example.com/failover-batch"
COUNT = 300
SWITCH_AT, KILL_AT = 80, 180
MIN_SOLVED, MOST_PAID = 297, 315
THREADS = 20
DEADLINE_S = 40
#: A solve whose every trace a failover took is failed by the batch when this late.
TASK_TIMEOUT_S = DEADLINE_S + 15
LEASES_GONE_S = 20
#: Short HTTP timeouts allow a short visibility timeout: messages a lost connection left
#: unacknowledged come back within seconds.
FAST = {
    "CAPTCHAAI_THREADS": str(THREADS),
    "CAPTCHAAI_POLL_INTERVAL": "0.25",
    "CAPTCHAAI_INITIAL_WAIT": "0.3",
    "CAPTCHAAI_CONNECT_TIMEOUT": "2",
    "CAPTCHAAI_READ_TIMEOUT": "5",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "10",
    "CAPTCHAAI_SOLVE_TIMEOUT": str(DEADLINE_S),
    "CAPTCHAAI_SLOT_LEASE": "15",
    "CAPTCHAAI_PREWARM_EVERY": "1",
    "CAPTCHAAI_THREADS_CHECK_EVERY": "5",
    "CAPTCHAAI_PINGBACK_SECRET": "failover-" + os.urandom(8).hex(),
}


class Deployment:
    """The sandbox, two workers, beat, the exporter and the receiver on ``cluster``."""

    def __init__(self, cluster: SentinelCluster, log_dir: Path, tag: str) -> None:
        self.cluster, self.log_dir, self.tag = cluster, log_dir, tag
        self.sandbox = SandboxProcess(
            "failover",
            options=["--threads", "60", "--solve-time", "0.6", "--jitter", "0.2"],
            log_dir=log_dir,
        )
        self.env = {
            **FAST,
            **cluster.env(),
            "CAPTCHAAI_API_KEY": self.sandbox.api_key,
            "CAPTCHAAI_BASE_URL": self.sandbox.url,
            "CAPTCHAAI_KEY_PREFIX": tag,
            "CAPTCHAAI_QUEUE_PREFIX": tag,
        }
        self.celery: list[CeleryProcess] = []
        self.servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    def start(self) -> None:
        self.sandbox.start()
        for n in range(2):
            worker = CeleryProcess("worker", env=self.env, log_dir=self.log_dir, name=f"w{n}")
            self.celery.append(worker.start())
        beat = CeleryProcess("beat", env=self.env, log_dir=self.log_dir, name="beat")
        self.celery.append(beat.start())
        self._serve("metrics", "metrics", "/metrics")
        self._serve("receiver", "pingback-server", "/health")

    def _serve(self, name: str, command: str, path: str) -> None:
        port = free_port()
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "captcha_tasks.cli", command, "--port", str(port)],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.servers[name] = (proc, f"http://127.0.0.1:{port}{path}")
        wait_until(lambda: self.get(name) is not None, 20, what=name)

    def get(self, name: str) -> str | None:
        """The body of a 200 from server ``name``, or None."""
        try:
            reply = requests.get(self.servers[name][1], timeout=5)
        except requests.ConnectionError:
            return None
        return reply.text if reply.status_code == 200 else None

    def alive(self) -> list[str]:
        dead = [p.name for p in self.celery if not p.alive()]
        dead += [name for name, (proc, _) in self.servers.items() if proc.poll() is not None]
        dead += [] if self.sandbox.alive() else ["sandbox"]
        return dead

    def stop(self) -> None:
        for proc, _ in self.servers.values():
            proc.terminate()
            proc.wait(10)
        for celery in self.celery:
            celery.stop()
        self.sandbox.stop()


@pytest.fixture
def deployment(output_dir: Path) -> Iterator[Deployment]:
    log_dir = output_dir / "failover-batch"
    cluster = SentinelCluster(
        log_dir=log_dir / "sentinel",
        password="server-" + os.urandom(4).hex(),
        sentinel_password="sentinel-" + os.urandom(4).hex(),
    )
    with cluster.start():
        built = Deployment(cluster, log_dir, "failover-" + os.urandom(3).hex())
        try:
            built.start()
            yield built
        finally:
            built.stop()


def dump_state(d: Deployment) -> None:
    """The deployment's keys on the master at the end (for diagnosis, never asserted)."""
    master = redis_client(d.cluster.master().url)
    found: dict[str, Any] = {}
    for key in master.scan_iter(f"{d.tag}*"):
        kind = master.type(key)
        if kind == "hash":
            found[key] = master.hgetall(key)
        elif kind == "zset":
            found[key] = master.zrange(key, 0, -1, withscores=True)
        elif kind == "string":
            found[key] = master.get(key)
        else:
            found[key] = kind
    (d.log_dir / "state-after.json").write_text(json.dumps(found, indent=1, default=str))


def results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(t) for t in path.read_text().splitlines() if t.strip()]


def solved_count(path: Path) -> int:
    return sum(line["status"] == "solved" for line in results(path))


@pytest.mark.timeout(TASK_TIMEOUT_S + 240)
def test_a_batch_rides_out_a_switch_and_a_kill(deployment: Deployment) -> None:
    d, cluster = deployment, deployment.cluster
    source = write_tasks(d.log_dir / "in.jsonl", COUNT, PAGE)
    out = d.log_dir / "out.jsonl"
    out.unlink(missing_ok=True)
    with open(d.log_dir / "batch.err", "w") as err:
        batch = subprocess.Popen(
            [
                *(sys.executable, "-m", "captcha_tasks.cli", "batch", str(source)),
                *("-o", str(out), "--timeout-per-task", str(TASK_TIMEOUT_S)),
            ],
            env={**os.environ, **d.env},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_until(lambda: solved_count(out) >= SWITCH_AT, 90, what=f"{SWITCH_AT} solved")
        cluster.failover()
        wait_until(lambda: solved_count(out) >= KILL_AT, 90, what=f"{KILL_AT} solved")
        cluster.kill_master()
        batch.wait(timeout=TASK_TIMEOUT_S + 120)
    finally:
        if batch.poll() is None:  # a test that fails leaves no batch running
            batch.kill()
            batch.wait()
    ended = time.monotonic()
    dump_state(d)
    summary = (d.log_dir / "batch.err").read_text()
    assert batch.returncode in (0, 1), summary[-2000:]  # it did not die of the failovers

    lines = results(out)
    assert sorted(line["index"] for line in lines) == list(range(COUNT)), summary[-2000:]
    solved = [line for line in lines if line["status"] == "solved"]
    failed = [line for line in lines if line["status"] != "solved"]
    assert len(solved) >= MIN_SOLVED, failed
    assert all(line["error"].startswith("ERROR_") for line in failed), failed
    tokens = [line["token"] for line in solved]
    assert len(set(tokens)) == len(tokens)  # no token delivered twice
    paid = d.sandbox.paid()
    assert len(paid) <= MOST_PAID, len(paid)

    # No thread lease is left once the leases of lost writes had their time.
    master = redis_client(cluster.master().url)
    keys = Keys(d.env["CAPTCHAAI_KEY_PREFIX"])
    ours = lambda: [m for m in master.zrange(keys.slots(), 0, -1) if not m.startswith("external:")]  # noqa: E731
    wait_until(lambda: not ours(), LEASES_GONE_S - (time.monotonic() - ended), what="no lease")

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
    assert not d.alive(), d.alive()
    assert not any(master.llen(q) for q in queue_names(d.env))
    assert d.get("receiver") is not None
    scraped = d.get("metrics") or ""
    assert metric(scraped, "captcha_tasks_redis_master_changes_total") == 2
    for process in ("worker", "beat", "exporter", "app"):
        name = f'captcha_tasks_redis_reconnects_total{{process="{process}"}}'
        assert metric(scraped, name) >= 1, (process, scraped[-3000:])


def metric(scraped: str, name: str) -> float:
    """The value of sample ``name`` (with its labels) in a Prometheus text page (0: none)."""
    for line in scraped.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
