#!/usr/bin/env python3
"""Lanes, tenants and budgets benchmark: issue 23's "Done when" runs, printed as tables.

Set-up (the issue's measured one): the sandbox with a 15-thread plan and 1.5 s ± 0.3 s
solves, two worker processes (threads pool, 16 each), every other setting at its default,
and ``CAPTCHAAI_TENANTS`` declaring shop (weight 2), crawler (weight 1) and thrifty
(``daily_captchas`` 40).  Redis starts empty for every run.

(a) lanes under a backlog: two 200-captcha ``captcha-tasks batch`` runs started together;
    3 s later, 12 plain ``solve.delay(...).get()`` calls, one every 1.5 s.  Their latency
    (median, max); the span from the first solve's start to the last answer of both
    batches against 1.10 x ideal + 3 s (ideal: 400 x 1.5 s / 15 threads), and each batch
    command's wall time; the sandbox's peak of captchas in flight and its refusals.
    Twice: with lanes (the calls in the interactive lane), and without (the same calls in
    the bulk lane, with the batches: one first-come queue, as before lanes).
(b) fair shares: a 300-captcha batch ``--tenant shop`` and one ``--tenant crawler``
    started together: how the first 240 solved split, its error against 2 : 1, and both
    complete.
(c) a budget: a 50-captcha batch ``--tenant thrifty``: solved, failed with
    ``ERROR_BUDGET_EXCEEDED``, and the captchas the API received.
(d) what lanes cost the bulk work: the batches' span in (a), with lanes against
    without.

Not a timed test: the targets are printed as MET / MISSED.

    python scripts/bench_lanes.py [--only lanes|shares|budget ...] [--solve-time 1.5 --jitter 0.3]
        [--plot DIR]

With ``--plot DIR``: the calls' latency CDFs with lanes and without (``lanes-calls.svg``),
and each tenant's solved captchas over time (``lanes-shares.svg``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plots
import repo_root  # noqa: F401  (puts harness/ on sys.path)

from captcha_tasks.testing.processes import CeleryProcess, RedisServer, redis_client
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from harness.batch_files import write_tasks

KEY = "bench-key"
PAGE = "https://example.com/bench-lanes"
THREADS, SOLVE_S, JITTER_S = 15, 1.5, 0.3
BATCH, CALLS, CALL_EVERY_S, CALLS_AFTER_S = 200, 12, 1.5, 3.0
SHARE_BATCH, SHARE_AT, WEIGHTS = 300, 240, {"shop": 2, "crawler": 1}
BUDGET, BUDGET_BATCH = 40, 50
TENANTS = {
    "shop": {"weight": WEIGHTS["shop"]},
    "crawler": {"weight": WEIGHTS["crawler"]},
    "thrifty": {"daily_captchas": BUDGET},
}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Stack:
    """An empty Redis and two workers, for one run."""

    def __init__(self, env: dict[str, str], log_dir: Path, name: str) -> None:
        self.env, self.log_dir, self.name = env, log_dir, name
        self.workers: list[CeleryProcess] = []

    def __enter__(self) -> Stack:
        redis_client(self.env["REDIS_URL"]).flushall()
        for n in range(2):
            worker = CeleryProcess(
                "worker", env=self.env, log_dir=self.log_dir, name=f"{self.name}-w{n}"
            )
            self.workers.append(worker.start())
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.workers:
            worker.stop()


class Batch:
    """``captcha-tasks batch`` in a process of its own, its output lines timestamped as
    they appear (read every 20 ms)."""

    def __init__(self, env: dict[str, str], log_dir: Path, name: str, count: int, *args: str):
        self.source = write_tasks(log_dir / f"{name}-in.jsonl", count, PAGE)
        self.out = log_dir / f"{name}-out.jsonl"
        self.name = name
        self.argv = [sys.executable, "-m", "captcha_tasks.cli", "batch", str(self.source)]
        self.argv += ["-o", str(self.out), *args]
        self.env = {**os.environ, **env}
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.wall_s = float("nan")
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)

    def start(self) -> Batch:
        self.started = time.monotonic()
        self._proc = subprocess.Popen(self.argv, env=self.env, stderr=subprocess.DEVNULL)
        self._reader.start()
        return self

    def wait(self, timeout: float = 600) -> Batch:
        assert self._proc is not None
        self._proc.wait(timeout)
        self.wall_s = time.monotonic() - self.started
        self._reader.join()
        return self

    def _read(self) -> None:
        offset, buffered = 0, ""
        while True:
            done = self._proc is not None and self._proc.poll() is not None
            if self.out.exists():
                with self.out.open() as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                now = time.monotonic()
                buffered += chunk
                *complete, buffered = buffered.split("\n")
                self.lines += [(now, json.loads(t)) for t in complete if t.strip()]
            if done:
                return
            time.sleep(0.02)  # a sampling period, not a synchronisation

    def statuses(self) -> Counter[str]:
        return Counter(line.get("error") or line["status"] for _, line in self.lines)

    def first_start(self) -> float:
        """When its first solve started: a line appears ``elapsed_s`` after its solve."""
        return min((at - float(line["elapsed_s"] or 0) for at, line in self.lines), default=0.0)

    def last_answer(self) -> float:
        return max((at for at, _ in self.lines), default=0.0)


def span(batches: list[Batch]) -> float:
    """From the first solve's start to the last answer, over ``batches`` run together (as
    scripts/bench_pingback.py measures it: a process's start-up is not solving)."""
    return max(b.last_answer() for b in batches) - min(b.first_start() for b in batches)


@dataclass
class LanesRun:
    name: str
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    span_s: float = float("nan")
    solved: int = 0
    peak: int = 0
    refused: int = 0
    waits: dict[str, tuple[float, int]] = field(default_factory=dict)


def calls(lane: str | None) -> tuple[list[float], list[str]]:
    """CALLS plain solve.delay().get() calls, one every CALL_EVERY_S, each in a thread."""
    from captcha_tasks import solve  # once the environment names the bench's stack

    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        extra = {"lane": lane} if lane else {}
        started = time.monotonic()
        try:
            solve.delay(method="turnstile", sitekey=f"view-{i}", pageurl=PAGE, **extra).get(60)
        except Exception as exc:  # reported in the table
            with lock:
                failures.append(type(exc).__name__)
            return
        with lock:
            latencies.append(time.monotonic() - started)

    threads = []
    first = time.monotonic()
    for i in range(CALLS):
        time.sleep(max(0.0, first + i * CALL_EVERY_S - time.monotonic()))  # the call rate
        thread = threading.Thread(target=one, args=(i,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return latencies, failures


def lanes_run(
    name: str, env: dict[str, str], sandbox: SandboxServer, log_dir: Path, lane: str | None
) -> LanesRun:
    from captcha_tasks.worker.app import app

    result = LanesRun(name)
    slug = "with" if lane is None else "without"
    with Stack(env, log_dir, f"lanes-{slug}"):
        sandbox.reset()
        batches = [Batch(env, log_dir, f"lanes-{slug}-{n}", BATCH).start() for n in range(2)]
        time.sleep(CALLS_AFTER_S)  # the backlog builds up first, as in the run
        result.latencies, result.failures = calls(lane)
        for batch in batches:
            batch.wait()
        stats = sandbox.stats()
        result.walls = [b.wall_s for b in batches]
        result.span_s = span(batches)
        result.solved = sum(b.statuses()["solved"] for b in batches)
        result.peak, result.refused = stats["peak_in_flight"], stats["thread_rejections"]
        waits = app.runtime().state.limiter.wait_times()
        for lane_name in ("interactive", "bulk"):
            times = waits.get((lane_name, "default"))
            if times and times.count:
                result.waits[lane_name] = (times.sum_s / times.count, times.count)
    return result


def shares_run(env: dict[str, str], sandbox: SandboxServer, log_dir: Path) -> list[Batch]:
    with Stack(env, log_dir, "shares"):
        sandbox.reset()
        batches = [
            Batch(env, log_dir, f"shares-{t}", SHARE_BATCH, "--tenant", t).start() for t in WEIGHTS
        ]
        return [b.wait() for b in batches]


def budget_run(env: dict[str, str], sandbox: SandboxServer, log_dir: Path) -> tuple[Batch, int]:
    with Stack(env, log_dir, "budget"):
        sandbox.reset()
        batch = Batch(env, log_dir, "budget", BUDGET_BATCH, "--tenant", "thrifty").start().wait()
        return batch, int(sandbox.stats()["submits"])


def print_lanes(runs: list[LanesRun], ideal: float) -> list[tuple[str, bool]]:
    print(
        f"\n(a) lanes under a backlog: 2 x {BATCH} captchas (captcha-tasks batch) and {CALLS}"
        f" solve.delay().get() calls, one every {CALL_EVERY_S} s from {CALLS_AFTER_S} s on;"
        f" ideal {2 * BATCH} x {SOLVE_S} s / {THREADS} threads = {ideal:.1f} s"
    )
    print(
        f"{'run':<26} {'calls p50':>9} {'max':>6} {'mean':>6} {'failed':>6} {'span s':>6}"
        f" {'x ideal':>7} {'walls s':>11} {'solved':>7} {'peak':>4} {'refused':>7}"
        "  mean wait for a thread"
    )
    for r in runs:
        walls = " / ".join(f"{w:.1f}" for w in r.walls)
        mean = statistics.fmean(r.latencies) if r.latencies else float("nan")
        waits = ", ".join(f"{lane} {s:.2f} s (n={n})" for lane, (s, n) in r.waits.items())
        print(
            f"{r.name:<26} {pct(r.latencies, 50):>8.2f}s {max(r.latencies, default=0):>5.2f}s"
            f" {mean:>5.2f}s {len(r.failures):>6} {r.span_s:>6.1f} {r.span_s / ideal:>7.3f}"
            f" {walls:>11} {r.solved:>3}/{2 * BATCH:<3} {r.peak:>4} {r.refused:>7}  {waits}"
        )
    print(
        "span: from the first solve's start to the last answer of both batches; walls: each"
        " batch command's, its start-up included"
    )
    found: list[tuple[str, bool]] = []
    with_lanes = next((r for r in runs if r.name.startswith("with lanes")), None)
    if with_lanes is not None:
        limit = 1.10 * ideal + 3
        found += [
            ("lanes: the calls' median <= 2.0 s", pct(with_lanes.latencies, 50) <= 2.0),
            ("lanes: the calls' max <= 3.0 s", max(with_lanes.latencies, default=99) <= 3.0),
            (f"lanes: every call answered ({CALLS})", len(with_lanes.latencies) == CALLS),
            (
                f"lanes: both batches complete within 1.10 x ideal + 3 = {limit:.1f} s",
                with_lanes.solved == 2 * BATCH and with_lanes.span_s <= limit,
            ),
            (f"lanes: at most {THREADS} captchas in flight", with_lanes.peak <= THREADS),
            ("lanes: no captcha refused by the provider", with_lanes.refused == 0),
        ]
    without = next((r for r in runs if r.name.startswith("without")), None)
    if with_lanes is not None and without is not None:
        slow, base = with_lanes.span_s, without.span_s
        print(
            f"\n(d) what lanes cost the bulk work: both batches took {slow:.1f} s with lanes,"
            f" {base:.1f} s without ({slow - base:+.1f} s, {(slow - base) / base:+.1%})"
        )
    return found


def print_shares(batches: list[Batch]) -> list[tuple[str, bool]]:
    arrivals = sorted(
        (at, batch.name.removeprefix("shares-"))
        for batch in batches
        for at, line in batch.lines
        if line["status"] == "solved"
    )
    first = Counter(tenant for _, tenant in arrivals[:SHARE_AT])
    ratio = first["shop"] / max(1, first["crawler"])
    # the first threads go to whichever batch asked first: nobody else was waiting yet
    shared = Counter(tenant for _, tenant in arrivals[THREADS : THREADS + SHARE_AT])
    steady = shared["shop"] / max(1, shared["crawler"])
    target = WEIGHTS["shop"] / WEIGHTS["crawler"]
    complete = [b.statuses()["solved"] for b in batches]
    print(
        f"\n(b) fair shares: weights shop {WEIGHTS['shop']}, crawler {WEIGHTS['crawler']};"
        f" {SHARE_BATCH} captchas each, started together"
    )
    later = f"from the {THREADS + 1}th on"
    print(
        f"{'first solved':>12} {'shop':>5} {'crawler':>7} {'ratio':>6} {'error':>6}"
        f" {later:>20} {'solved shop/crawler':>20} {'walls s':>12}"
    )
    walls = " / ".join(f"{b.wall_s:.1f}" for b in batches)
    print(
        f"{SHARE_AT:>12} {first['shop']:>5} {first['crawler']:>7} {ratio:>6.2f}"
        f" {abs(ratio - target) / target:>6.1%} {steady:>20.2f}"
        f" {' / '.join(map(str, complete)):>20} {walls:>12}"
    )
    return [
        (f"shares: the first {SHARE_AT} split 1.7 to 2.3 : 1", 1.7 <= ratio <= 2.3),
        (
            f"shares: both batches complete ({SHARE_BATCH} each)",
            complete == [SHARE_BATCH] * len(batches),
        ),
    ]


def print_budget(batch: Batch, received: int) -> list[tuple[str, bool]]:
    statuses = batch.statuses()
    print(
        f"\n(c) a budget: tenant thrifty, daily_captchas {BUDGET}, a {BUDGET_BATCH}-captcha batch"
    )
    print(f"{'solved':>6} {'ERROR_BUDGET_EXCEEDED':>21} {'other':>5} {'API received':>12}")
    other = BUDGET_BATCH - statuses["solved"] - statuses["ERROR_BUDGET_EXCEEDED"]
    print(
        f"{statuses['solved']:>6} {statuses['ERROR_BUDGET_EXCEEDED']:>21} {other:>5} {received:>12}"
    )
    return [
        (f"budget: exactly {BUDGET} solved", statuses["solved"] == BUDGET),
        (
            f"budget: the other {BUDGET_BATCH - BUDGET} fail with ERROR_BUDGET_EXCEEDED",
            statuses["ERROR_BUDGET_EXCEEDED"] == BUDGET_BATCH - BUDGET,
        ),
        (f"budget: the API received at most {BUDGET}", received <= BUDGET),
    ]


def setup(args: argparse.Namespace) -> str:
    return (
        f"{THREADS} threads, {SOLVE_S:g} ± {JITTER_S:g} s solves, two workers, default"
        f" settings; {args.machine}"
    )


def plot_calls(args: argparse.Namespace, runs: list[LanesRun]) -> None:
    """The plain calls' latency under the backlog, with lanes and without."""
    path = plots.latency_cdf(
        plots.target(args, "lanes-calls"),
        {run.name: run.latencies for run in runs if run.latencies},
        title="solve.delay().get() behind two 200-captcha batches, with lanes and without",
        params=f"{CALLS} calls, one every {CALL_EVERY_S:g} s; {setup(args)}",
        quantity="latency",
        counted="calls",
        marks=(50, 100),
        percentile=pct,
    )
    print(f"plot: {path}")


def plot_shares(args: argparse.Namespace, batches: list[Batch]) -> None:
    """Each tenant's solved captchas over time, and where the first SHARE_AT were split."""
    start = min(b.first_start() for b in batches)
    solved = {
        f"{b.name.removeprefix('shares-')} (weight {WEIGHTS[b.name.removeprefix('shares-')]})": [
            at - start for at, line in b.lines if line["status"] == "solved"
        ]
        for b in batches
    }
    arrivals = sorted(t for times in solved.values() for t in times)
    events = [plots.Marker(arrivals[SHARE_AT - 1], f"{SHARE_AT} solved")] if arrivals else []
    path = plots.timeline(
        plots.target(args, "lanes-shares"),
        solved,
        title="Two tenants' batches started together: solved captchas over time",
        params=f"{SHARE_BATCH} captchas each; {setup(args)}",
        events=events,
        counted="captchas solved",
        cumulative=True,
        xlabel="time since the first solve started (s)",
    )
    print(f"plot: {path}")


def main() -> int:
    global SOLVE_S, JITTER_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["lanes", "shares", "budget"], action="append")
    parser.add_argument("--solve-time", type=float, default=SOLVE_S, help="Mean solve seconds.")
    parser.add_argument("--jitter", type=float, default=JITTER_S, help="± seconds.")
    plots.add_options(parser)
    args = parser.parse_args()
    args.machine = plots.machine()
    SOLVE_S, JITTER_S = args.solve_time, args.jitter
    wanted = set(args.only or ("lanes", "shares", "budget"))
    log_dir = Path(tempfile.mkdtemp(prefix="bench-lanes-"))
    config = SandboxConfig(threads=THREADS, solve_time=SOLVE_S, jitter=JITTER_S, api_keys=(KEY,))
    results: list[tuple[str, bool]] = []
    with RedisServer(log_dir=log_dir) as redis_server:
        redis_server.start()
        sandbox = SandboxServer(config).start()
        env = {
            "REDIS_URL": redis_server.url,
            "CAPTCHAAI_BASE_URL": sandbox.url,
            "CAPTCHAAI_API_KEY": KEY,
            "CAPTCHAAI_THREADS": str(THREADS),
            "CAPTCHAAI_KEY_PREFIX": "bench",
            "CAPTCHAAI_TENANTS": json.dumps(TENANTS),
        }
        os.environ.update(env)  # this process's solve.delay() talks to the same stack
        try:
            if "lanes" in wanted:
                runs = []
                for name, lane in (("with lanes", None), ("without (one bulk lane)", "bulk")):
                    runs.append(lanes_run(name, env, sandbox, log_dir, lane))
                    print(f"done: (a) {name}", file=sys.stderr, flush=True)
                results += print_lanes(runs, 2 * BATCH * SOLVE_S / THREADS)
                if args.plot:
                    plot_calls(args, runs)
            if "shares" in wanted:
                shared = shares_run(env, sandbox, log_dir)
                results += print_shares(shared)
                if args.plot:
                    plot_shares(args, shared)
            if "budget" in wanted:
                results += print_budget(*budget_run(env, sandbox, log_dir))
        finally:
            sandbox.stop()
    print()
    for text, ok in results:
        print(f"{'MET   ' if ok else 'MISSED'} {text}")
    print(f"\nlogs: {log_dir}")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
