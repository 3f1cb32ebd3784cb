#!/usr/bin/env python3
"""Batch benchmark against the sandbox: ``captcha-tasks batch`` vs the seed's asyncio solver.

Sandbox: a 15-thread plan, 1.5 s ± 0.3 s solves; poll interval 0.5 s, initial wait 1 s
(one tenth of real 15 s solves and 5 s polls); 200 captchas.  In one invocation it runs:

  (a) ``captcha-tasks batch`` with two worker processes, bulk polling (``ids=``);
  (a') the same with ``CAPTCHAAI_BULK_POLL=off`` (one id per request);
  (b) ``scripts/seed_asyncio_solver.py`` (asyncio + aiohttp, max_concurrent=15,
      sleep-then-poll), the peer.

and prints wall time, time to first result, res.php requests per solved captcha, failures
and peak RSS.  (``bench_pipeline.py --inflight`` is the 10,000-in-flight scale mode.)

Not a timed test: the targets are printed as MET / MISSED.

    python scripts/bench_batch.py [--count 200] [--plot DIR]

``--plot DIR`` also draws the results so far against time for the three runs
(``batch-results.svg``), the ideal marked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plots
import repo_root  # noqa: F401  (puts harness/ on sys.path)

from captcha_tasks.testing.processes import CeleryProcess, RedisServer, redis_client, wait_until
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from harness.batch_files import write_tasks

KEY = "bench-key"
PAGE = "https://example.com/bench-batch"
HERE = Path(__file__).resolve().parent


@dataclass
class Run:
    name: str
    wall_s: float
    first_s: float
    solved: int
    failed: int
    res_requests: int
    res_ids: int
    submits: int
    rss_mb: float
    #: seconds from the start at which each result line came
    arrivals: list[float] = field(default_factory=list)


def rss_mb(pid: int) -> float:
    """Peak resident memory (VmHWM) of a process and its children, in MiB."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total / 1024


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(c) for c in text.split()]


def follow(
    proc: subprocess.Popen[str], out: Path | None
) -> tuple[float, list[dict[str, Any]], list[float]]:
    """Wait for a producer of JSON lines; returns time to its first line, the lines and the
    seconds at which each came."""
    start = time.monotonic()
    first = None
    lines: list[dict[str, Any]] = []
    arrivals: list[float] = []
    stream = proc.stdout if out is None else None
    while True:
        if stream is not None:
            text = stream.readline()
            done = not text
            lines += [json.loads(text)] if text else []
        else:
            done = proc.poll() is not None
            if out is not None and out.exists():
                lines = _complete_lines(out)
            if not done:
                time.sleep(0.01)
        now = time.monotonic() - start
        arrivals += [now] * (len(lines) - len(arrivals))
        if lines and first is None:
            first = now
        if done:
            break
    proc.wait()
    return (first if first is not None else float("nan")), lines, arrivals


def _complete_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines written so far (a line still being written is left for later)."""
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(t) for t in complete.splitlines() if t.strip()]


def run_ours(
    name: str,
    env: dict[str, str],
    sandbox: SandboxServer,
    count: int,
    log_dir: Path,
    workers: int = 2,
    concurrency: int = 16,
) -> Run:
    redis_client(env["REDIS_URL"]).flushall()
    procs = [
        CeleryProcess(
            "worker", env=env, concurrency=concurrency, log_dir=log_dir, name=f"{name}-w{n}"
        ).start()
        for n in range(workers)
    ]
    try:
        source = write_tasks(log_dir / f"{name}-in.jsonl", count, PAGE)
        out = log_dir / f"{name}-out.jsonl"
        sandbox.reset()
        start = time.monotonic()
        cli = subprocess.Popen(
            [sys.executable, "-m", "captcha_tasks.cli", "batch", str(source), "-o", str(out)],
            env={**os.environ, **env},
            text=True,
            stderr=subprocess.DEVNULL,
        )
        first, lines, arrivals = follow(cli, out)
        wall = time.monotonic() - start
        rss = sum(rss_mb(p.pid) for p in procs)
    finally:
        for p in procs:
            p.stop()
    return _summarise(name, wall, first, lines, sandbox, rss, arrivals)


def run_peer(sandbox: SandboxServer, count: int) -> Run:
    sandbox.reset()
    start = time.monotonic()
    peer = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "seed_asyncio_solver.py"),
            "--base-url",
            sandbox.url,
            "--key",
            KEY,
            "--count",
            str(count),
            "--max-concurrent",
            "15",
            "--sleep",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    first, lines, arrivals = follow(peer, None)
    wall = time.monotonic() - start
    peer_name = "(b) seed asyncio peer"
    return _summarise(peer_name, wall, first, lines, sandbox, float("nan"), arrivals)


def _summarise(
    name: str,
    wall: float,
    first: float,
    lines: list[dict[str, Any]],
    sandbox: SandboxServer,
    rss: float,
    arrivals: list[float],
) -> Run:
    stats = sandbox.stats()
    solved = sum(1 for line in lines if line["status"] == "solved")
    return Run(
        name,
        wall,
        first,
        solved,
        len(lines) - solved,
        stats["res_php_requests"],
        stats["res_php_ids"],
        stats["submits"],
        rss,
        arrivals,
    )


def print_table(runs: list[Run]) -> None:
    print(
        f"\n{'run':<28} {'wall s':>7} {'first s':>8} {'solved':>6} {'failed':>6} "
        f"{'res.php':>7} {'res/solve':>9} {'ids/req':>7} {'RSS MiB':>8}"
    )
    for r in runs:
        per = r.res_requests / max(1, r.solved)
        ids = r.res_ids / max(1, r.res_requests)
        print(
            f"{r.name:<28} {r.wall_s:>7.2f} {r.first_s:>8.2f} {r.solved:>6} {r.failed:>6} "
            f"{r.res_requests:>7} {per:>9.2f} {ids:>7.1f} {r.rss_mb:>8.1f}"
        )


def batch_mode(
    args: argparse.Namespace, base_env: dict[str, str], sandbox: SandboxServer, log_dir: Path
) -> int:
    env = {
        **base_env,
        "CAPTCHAAI_THREADS": "15",
        "CAPTCHAAI_POLL_INTERVAL": "0.5",
        "CAPTCHAAI_INITIAL_WAIT": "1",
    }
    bulk = run_ours("(a) batch, bulk ids=", env, sandbox, args.count, log_dir)
    per_id = run_ours(
        "(a') batch, one id per req",
        {**env, "CAPTCHAAI_BULK_POLL": "off"},
        sandbox,
        args.count,
        log_dir,
    )
    peer = run_peer(sandbox, args.count)
    print_table([bulk, per_id, peer])
    ideal = args.count * 1.5 / 15
    checks = [
        (f"wall within 10% of ideal {ideal:.1f}s", bulk.wall_s <= ideal * 1.1),
        ("wall at least 10% below the peer's", bulk.wall_s <= peer.wall_s * 0.9),
        ("<= 1.3 res.php per solved (bulk)", bulk.res_requests / max(1, bulk.solved) <= 1.3),
        ("first result <= 1.5 s + 0.5 s", bulk.first_s <= 2.0),
        ("no failures", bulk.failed == 0 and bulk.solved == args.count),
    ]
    if args.plot:
        plot(args, [bulk, per_id, peer], ideal)
    print()
    for text, ok in checks:
        print(f"{'MET   ' if ok else 'MISSED'} {text}")
    return 0 if all(ok for _, ok in checks) else 1


def plot(args: argparse.Namespace, runs: list[Run], ideal: float) -> None:
    path = plots.timeline(
        plots.target(args, "batch-results"),
        {r.name: r.arrivals for r in runs},
        title="A batch against the seed's asyncio solver: results so far",
        params=(
            f"{args.count} captchas; sandbox 15 threads, 1.5 s ± 0.3 s solves; poll interval "
            f"0.5 s, initial wait 1 s; ours: two workers -c 16; the peer: asyncio + aiohttp, "
            f"max_concurrent 15; {args.machine}"
        ),
        events=[plots.Marker(ideal, f"ideal {ideal:.1f} s")],
        counted="results",
        cumulative=True,
        xlabel="time since the batch started (s)",
    )
    print(f"plot: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=None)
    plots.add_options(parser)
    args = parser.parse_args()
    args.machine = plots.machine()
    args.count = args.count or 200
    log_dir = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    config = SandboxConfig(threads=15, solve_time=1.5, jitter=0.3, api_keys=(KEY,))
    with RedisServer(log_dir=log_dir) as redis_server:
        redis_server.start()
        sandbox = SandboxServer(config).start()
        base_env = {
            "REDIS_URL": redis_server.url,
            "CAPTCHAAI_BASE_URL": sandbox.url,
            "CAPTCHAAI_API_KEY": KEY,
            "CAPTCHAAI_KEY_PREFIX": "bench",
        }
        os.environ.update(base_env)
        try:
            return batch_mode(args, base_env, sandbox, log_dir)
        finally:
            sandbox.stop()
            wait_until(lambda: True, 1)


if __name__ == "__main__":
    sys.exit(main())
