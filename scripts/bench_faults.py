#!/usr/bin/env python3
"""What each real-world fault does to a running batch, measured.

Set-up: the sandbox with a 15-thread plan and 0.5 s ± 0.2 s solves, 200 captchas through
``captcha-tasks batch``, two workers (threads pool, 8 each), Redis with an append-only
file, short HTTP timeouts (2 s + 5 s) and a 10 s visibility timeout.  Each fault hits
when a third of the batch is done:

  worker SIGKILL       one of the two workers is killed (and not replaced)
  Redis restart        SIGTERM (the append-only file is synced), 2 s down, same port
  Redis kill -9        appendfsync everysec, SIGKILL, 2 s down, same port
  HTTP 429 storm       every API request answered 429, Retry-After 2 s, for 3 s
  hanging API          every request hangs past the read timeout, for 3 s
  another client       5 of the 15 threads taken by another key's captchas (10 s solves)

For each: time to recover (the longest gap between two results after the fault, against
the longest before it), solves lost (did not end solved), duplicates (captchas paid beyond
one per attempt, except those nobody lived to ask about), orphans (paid, never asked: an
``in.php`` reply that died with a killed worker), thread rejections and peak in flight.

    python scripts/bench_faults.py [--count 200] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import repo_root  # noqa: F401  (puts harness/ on sys.path)
import requests

from captcha_tasks.testing.processes import CeleryProcess, RedisServer
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from harness.batch_files import write_tasks

KEY = "bench-key"
OTHER_KEY = "bench-other-client"
PAGE = "https://example.com/bench-faults"
THREADS = 15
ENV = {
    "CAPTCHAAI_API_KEY": KEY,
    "CAPTCHAAI_THREADS": str(THREADS),
    "CAPTCHAAI_CONNECT_TIMEOUT": "2",
    "CAPTCHAAI_READ_TIMEOUT": "5",
    "CAPTCHAAI_VISIBILITY_TIMEOUT": "10",
    "CAPTCHAAI_SLOT_LEASE": "20",
    "CAPTCHAAI_SOLVE_TIMEOUT": "120",
    "CAPTCHAAI_THREADS_CHECK_EVERY": "1",
}


@dataclass
class Result:
    name: str
    wall_s: float
    recover_s: float
    gap_before_s: float
    lost: int
    duplicates: int
    orphans: int
    rejections: int
    peak: int


class Run:
    """One batch on a fresh Redis, two workers; ``fault`` is called at a third done."""

    def __init__(self, name: str, sandbox: SandboxServer, log_dir: Path, fsync: str) -> None:
        self.name, self.sandbox = name, sandbox
        self.other_submits = 0  # captchas another client of the key paid for
        self.log_dir = log_dir / name.replace(" ", "-")
        self.server = RedisServer(log_dir=self.log_dir, appendfsync=fsync).start()
        self.env = {**ENV, "CAPTCHAAI_BASE_URL": sandbox.url, "REDIS_URL": self.server.url}
        self.workers = [
            CeleryProcess("worker", env=self.env, concurrency=8, log_dir=self.log_dir, name=f"w{n}")
            for n in range(2)
        ]

    def go(self, count: int, fault: Callable[[Run], None]) -> Result:
        for worker in self.workers:
            worker.start()
        source = write_tasks(self.log_dir / "in.jsonl", count, PAGE)
        out = self.log_dir / "out.jsonl"
        self.sandbox.reset()
        arrivals: list[float] = []
        started = time.monotonic()
        batch = subprocess.Popen(
            [sys.executable, "-m", "captcha_tasks.cli", "batch", str(source), "-o", str(out)],
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        faulted_at = None
        while batch.poll() is None:
            lines = out.read_text().count("\n") if out.exists() else 0
            while len(arrivals) < lines:
                arrivals.append(time.monotonic())
            if faulted_at is None and lines >= count // 3:
                faulted_at = time.monotonic()
                threading.Thread(target=fault, args=(self,), daemon=True).start()
            time.sleep(0.02)  # sampling the output file's growth
        wall = time.monotonic() - started
        outcomes = [json.loads(t) for t in out.read_text().splitlines() if t.strip()]
        stats = self.sandbox.stats()
        self.stop()
        return self._result(wall, arrivals, faulted_at or wall, outcomes, stats, count)

    def _result(
        self,
        wall: float,
        arrivals: list[float],
        faulted_at: float,
        outcomes: list[dict[str, Any]],
        stats: dict[str, Any],
        count: int,
    ) -> Result:
        before = [t for t in arrivals if t <= faulted_at]
        after = [faulted_at, *[t for t in arrivals if t > faulted_at]]
        gaps = lambda ts: max((b - a for a, b in zip(ts, ts[1:], strict=False)), default=0.0)  # noqa: E731
        solved = sum(1 for o in outcomes if o["status"] == "solved")
        ours = stats["submits"] - self.other_submits
        extra = ours - count - stats["unsolvable_created"]
        orphans = stats["never_asked"] - self.other_submits  # the other client's: not ours
        return Result(
            self.name,
            wall,
            gaps(after),
            gaps(before),
            count - solved,
            extra - orphans,
            orphans,
            stats["thread_rejections"],
            stats["peak_in_flight"],
        )

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.server.stop()


def kill_worker(run: Run) -> None:
    run.workers[0].kill()


def restart(graceful: bool) -> Callable[[Run], None]:
    return lambda run: run.server.restart(graceful=graceful, down_s=2.0)


def for_a_while(**changes: Any) -> Callable[[Run], None]:
    def fault(run: Run) -> None:
        run.sandbox.update_config(**changes)
        time.sleep(3.0)  # the fault lasts this long
        run.sandbox.update_config(**{k: 0.0 for k in changes if k.endswith("rate")})

    return fault


def other_client(run: Run) -> None:
    config = run.sandbox.config
    run.sandbox.update_config(solve_time=10.0, jitter=0.0)
    for _ in range(5):
        reply = requests.post(
            f"{run.sandbox.url}/in.php",
            data={"key": OTHER_KEY, "method": "turnstile", "sitekey": "x", "pageurl": PAGE},
            timeout=5,
        )
        run.other_submits += reply.text.startswith("OK|")  # the plan may be full
    run.sandbox.update_config(solve_time=config.solve_time, jitter=config.jitter)


FAULTS: dict[str, tuple[Callable[[Run], None], str]] = {
    "worker SIGKILL": (kill_worker, "always"),
    "Redis restart": (restart(True), "always"),
    "Redis kill -9": (restart(False), "everysec"),
    "HTTP 429 storm": (for_a_while(status_429_rate=1.0, retry_after=2), "always"),
    "hanging API": (for_a_while(hang_rate=1.0, hang_s=30.0), "always"),
    "another client": (other_client, "always"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--only", action="append", choices=sorted(FAULTS))
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    config = SandboxConfig(
        threads=THREADS, solve_time=0.5, jitter=0.2, api_keys=(KEY, OTHER_KEY), seed=1
    )
    sandbox = SandboxServer(config).start()
    results = []
    try:
        for name, (fault, fsync) in FAULTS.items():
            if args.only and name not in args.only:
                continue
            sandbox.update_config(**config.public_dict())
            results.append(Run(name, sandbox, log_dir, fsync).go(args.count, fault))
            print(f"done: {name}", file=sys.stderr, flush=True)
    finally:
        sandbox.stop()
    print(
        f"\n{args.count} captchas, {THREADS} threads, 0.5 s solves; the fault at a third done\n"
        f"{'fault':<16} {'wall s':>7} {'recover s':>9} {'(gap before)':>12} {'lost':>5}"
        f" {'dupes':>6} {'orphans':>7} {'rejected':>8} {'peak':>5}"
    )
    for r in results:
        print(
            f"{r.name:<16} {r.wall_s:>7.1f} {r.recover_s:>9.2f} {r.gap_before_s:>12.2f}"
            f" {r.lost:>5} {r.duplicates:>6} {r.orphans:>7} {r.rejections:>8} {r.peak:>5}"
        )
    print(f"\nlogs: {log_dir}")
    return 0 if all(r.lost == 0 and r.duplicates == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
