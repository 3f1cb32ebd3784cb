#!/usr/bin/env python3
"""Answer latency benchmark: provider callbacks (pingback) against polling.

Set-up (the issue's scale): the sandbox with a 15-thread plan and 1.5 s ± 0.3 s solves,
200 captchas, two worker processes (threads pool, 16 each) and beat, every other setting
at its default (poll interval 5 s, no initial wait).  For each of

  (c) pingback off:        polling only (bulk ``ids=``), the baseline;
  (a) pingback on:         the sandbox calls back ``captcha-tasks pingback-server``;
  (b) pingback, 20% lost:  the sandbox drops a fifth of the callbacks;
  (e) pingback, all lost:  ``CAPTCHAAI_PINGBACK_URL`` names a port nobody listens on (a
                           typo, a firewall, ``localhost``): no callback ever arrives,

it runs the captchas on a fresh Redis (the sandbox reseeded; every task takes the same
solve time in every run, whatever order it goes in):

  1. through ``captcha-tasks batch`` (input JSONL -> output JSONL): the span from the first
     ``in.php`` (the sandbox's journal) to the batch's last line, the wall time against
     the ideal N x solve / threads, res.php requests per solved captcha, failures, and
     the callback channel's state at the end;
  2. unless ``--no-get``, through ``solve.delay()`` and Celery's result consumer
     (``ResultSet.join_native``, what ``AsyncResult.get()`` waits on): for every captcha,
     the time its outcome reached the caller minus the time the sandbox had its answer
     ready (``GET /sandbox/ready``).

And (d), the attacked receiver: callbacks on, and while the batch runs (through
``captcha-tasks batch``) 600 slow connections from 127.0.0.2 and 400 from 40 other
addresses (127.0.0.3-42, 10 each) are held open against the receiver
(:mod:`harness.slowloris`, in a process of its own: connections the receiver
closes are opened again), and ``/health`` is asked every 0.5 s from the provider's
address (127.0.0.1, where the sandbox calls back from).  It reports the span from the
first solve's start to the last answer against 1.10 x ideal + 1 s, res.php requests per
captcha, and the worst /health latency.

Not a timed test: the targets are printed as MET / MISSED.  Every callback arriving costs
at most 0.1 res.php request per captcha from a cold start; 20% lost solves every captcha
within 1.03 x the polling run's span with at most 1 res.php request per captcha; all lost,
within 1.05 x.

    python scripts/bench_pingback.py [--count 200] [--only on|lossy|lost|off|attacked ...]
        [--solve-time 1.5 --jitter 0.3] [--method turnstile] [--no-get] [--plot DIR]

At real time scale (the issue's "Done when": 60 reCAPTCHAs, 15 ± 3 s solves, polling,
20% lost and all lost; about five minutes): ``--real-time-scale``.

With ``--plot DIR``: the CDFs of how long answers waited after the sandbox had them, in the
batch's output and through ``get()``, one curve per run (``pingback-image-*.svg``, or
``pingback-real-time-*.svg`` at real time scale).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plots
import repo_root  # noqa: F401  (puts harness/ on sys.path)
import requests

from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import (
    CeleryProcess,
    RedisServer,
    free_port,
    redis_client,
    wait_until,
)
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from harness.slowloris import Attack

KEY = "bench-key"
PAGE = "https://example.com/bench-pingback"
SECRET = "bench-pingback-secret-0123456789"
PREFIX = "bench"
SEED = 20
THREADS, SOLVE_S, JITTER_S, METHOD = 15, 1.5, 0.3, "turnstile"
#: The attacked run: 600 slow connections from one address, 10 from each of 40 others.
CROWDS = ("127.0.0.2=600", "127.0.0.3-42=10")
HEALTH_EVERY_S, HEALTH_BUDGET_S = 0.5, 0.5
#: Lost callbacks against polling: span ratios and res.php per captcha (about one poll per
#: lost callback, however cold the start); every callback arriving: almost no poll.
LOSSY_SPAN, LOSSY_RES, LOST_SPAN, ON_RES = 1.03, 1.0, 1.05, 0.1


@dataclass
class Run:
    name: str
    wall_s: float = float("nan")
    solved: int = 0
    failed: int = 0
    res_per_solved: float = float("nan")
    delays: list[float] = field(default_factory=list)
    get_res_per_solved: float = float("nan")
    sources: dict[str, int] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list)
    span_s: float = float("nan")
    #: From the first in.php to the last answer the sandbox had ready: what no client could
    #: beat with the order its captchas were submitted in (which solve times went to which
    #: thread differs from run to run).
    ready_span_s: float = float("nan")
    #: Per solved captcha: its batch line's arrival minus when the sandbox had the answer.
    waited: list[float] = field(default_factory=list)
    channel: str = "-"
    health: list[float] = field(default_factory=list)
    attack: dict[str, Any] = field(default_factory=dict)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Stack:
    """Fresh Redis state, two workers, beat and (with callbacks) a receiver, for one run."""

    def __init__(self, env: dict[str, str], log_dir: Path, name: str, receiver: bool) -> None:
        self.env, self.log_dir, self.name, self.receiver = env, log_dir, name, receiver
        self.procs: list[Any] = []

    def __enter__(self) -> Stack:
        redis_client(self.env["REDIS_URL"]).flushall()
        for n in range(2):
            worker = CeleryProcess(
                "worker", env=self.env, log_dir=self.log_dir, name=f"{self.name}-w{n}"
            )
            self.procs.append(worker.start())
        beat = CeleryProcess("beat", env=self.env, log_dir=self.log_dir, name=f"{self.name}-beat")
        self.procs.append(beat.start())
        if self.receiver:
            port = _port(self.env)
            log = (self.log_dir / f"{self.name}-receiver.log").open("w")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "captcha_tasks.cli", "pingback-server"]
                    + ["--port", str(port)],
                    env={**os.environ, **self.env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            wait_until(lambda: _listening(port), 15, what="the receiver")
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if isinstance(proc, subprocess.Popen):
                proc.terminate()
                proc.wait(10)
            else:
                proc.stop()


def _port(env: dict[str, str]) -> int:
    return int(env["CAPTCHAAI_PINGBACK_URL"].rsplit(":", 1)[1].split("/")[0])


def _listening(port: int) -> bool:
    try:
        requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
        return True
    except requests.ConnectionError:
        return False


def write_tasks(path: Path, count: int) -> Path:
    """``count`` tasks of the benchmark's method, each with a site key of its own."""
    lines = (
        json.dumps({"method": METHOD, "sitekey": f"k{i}", "pageurl": PAGE}) + "\n"
        for i in range(count)
    )
    path.write_text("".join(lines))
    return path


def submitted_since(journal: Path, since: float) -> dict[str, float]:
    """The captchas the sandbox accepted at or after ``since``: id -> when (Unix time)."""
    found = (json.loads(line) for line in journal.read_text().splitlines() if line)
    return {str(c["id"]): float(c["at"]) for c in found if c["at"] >= since}


def through_batch(
    env: dict[str, str],
    sandbox: SandboxServer,
    count: int,
    log_dir: Path,
    name: str,
    clock: LineClock,
) -> tuple[float, list[dict[str, Any]], dict[str, Any]]:
    source = write_tasks(log_dir / f"{name}-in.jsonl", count)
    out = log_dir / f"{name}-out.jsonl"
    sandbox.reset()
    clock.watch(out)
    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "captcha_tasks.cli", "batch", str(source), "-o", str(out)],
        env={**os.environ, **env},
        stderr=subprocess.DEVNULL,
        check=False,
    )
    wall = time.monotonic() - start
    clock.finish()
    lines = [json.loads(t) for t in out.read_text().splitlines() if t.strip()]
    return wall, lines, sandbox.stats()


class LineClock(threading.Thread):
    """When each line of a batch's output appeared (Unix time, sampled every 20 ms), for
    the span from the first solve's start (or the first in.php) to the last answer: a
    solve started its elapsed_s before its line appeared, at or before its in.php."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.arrivals: list[tuple[float, dict[str, Any]]] = []
        self.started = time.time()
        self._path: Path | None = None
        self._done = threading.Event()

    def watch(self, path: Path) -> None:
        self._path = path
        self.started = time.time()
        self.start()

    def finish(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        assert self._path is not None
        buffered, offset = "", 0
        while True:
            last_round = self._done.is_set()
            if self._path.exists():
                with self._path.open() as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                now = time.time()
                buffered += chunk
                *complete, buffered = buffered.split("\n")
                self.arrivals += [(now, json.loads(t)) for t in complete if t.strip()]
            if last_round:
                return
            self._done.wait(0.02)

    def _solved(self) -> list[tuple[float, dict[str, Any]]]:
        return [(at, line) for at, line in self.arrivals if line.get("status") == "solved"]

    def span(self) -> float:
        solved = self._solved()
        if not solved:
            return float("nan")
        starts = [at - float(line["elapsed_s"]) for at, line in solved]
        return max(at for at, _ in solved) - min(starts)

    def last(self) -> float:
        return max((at for at, _ in self._solved()), default=float("nan"))

    def waited(self, sandbox: SandboxServer) -> list[float]:
        """How long after the sandbox had each answer its line appeared."""
        solved = [(at, line["token"]) for at, line in self._solved()]
        ready = sandbox.token_ready_times([t for _, t in solved if isinstance(t, str)])
        return [at - ready[t] for at, t in solved if isinstance(t, str) and t in ready]


class HealthProbe(threading.Thread):
    """``GET /health`` every HEALTH_EVERY_S from the provider's address; the seconds each
    took (a failure counts as infinite)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.latencies: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.done.is_set():
            started = time.monotonic()
            try:
                ok = requests.get(f"http://127.0.0.1:{self.port}/health", timeout=5).ok
            except requests.RequestException:
                ok = False
            self.latencies.append(time.monotonic() - started if ok else float("inf"))
            next_at += HEALTH_EVERY_S
            self.done.wait(max(0.0, next_at - time.monotonic()))


def attacked(env: dict[str, str], sandbox: SandboxServer, count: int, log_dir: Path) -> Run:
    result = Run("(d) attacked receiver")
    port = _port(env)
    with Stack(env, log_dir, "attacked-batch", receiver=True):
        attack = Attack(port, *CROWDS)
        probe = HealthProbe(port)
        try:

            def in_place() -> bool:
                crowds = attack.last
                if not crowds:
                    return False
                one = crowds["127.0.0.2"]
                tried = one["opened"] + one["failed"]
                return bool(crowds["127.0.0.3-42"]["open"] == 400 and tried >= 600)

            wait_until(in_place, 60, what="the attack in place")
            probe.start()
            clock = LineClock()
            wall, lines, stats = through_batch(env, sandbox, count, log_dir, "attacked", clock)
        finally:
            probe.done.set()
            result.attack = attack.stop()
        probe.join()
        result.sources = solved_sources(env)
    result.wall_s, result.span_s, result.health = wall, clock.span(), probe.latencies
    result.solved = sum(1 for line in lines if line.get("status") == "solved")
    result.failed = count - result.solved
    result.res_per_solved = stats["res_php_requests"] / max(1, result.solved)
    return result


def solved_sources(env: dict[str, str]) -> dict[str, int]:
    r = redis_client(env["REDIS_URL"])
    raw = r.hgetall(Keys(PREFIX).solved_counter(METHOD))
    return {str(k): int(v) for k, v in raw.items()}


def channel_state(env: dict[str, str]) -> str:
    r = redis_client(env["REDIS_URL"])
    found = r.hmget(Keys(PREFIX).pingback_channel(), "state", "share")
    state, share = str(found[0] or "up"), float(found[1] or 1.0)
    return f"{state} {share:.2f}"


def through_get(
    sandbox: SandboxServer, count: int
) -> tuple[list[float], list[dict[str, Any]], dict[str, Any]]:
    # imported once the environment points at the benchmark's stack (read at import)
    from celery.result import ResultSet

    from captcha_tasks import solve

    sandbox.reset()
    results = [solve.delay(method=METHOD, sitekey=f"g{i}", pageurl=PAGE) for i in range(count)]
    received: dict[str, tuple[float, Any]] = {}

    def arrived(task_id: str, value: Any) -> None:
        received[task_id] = (time.time(), value)

    ResultSet(results).join_native(timeout=300, propagate=False, callback=arrived)
    outcomes = [v for _, v in received.values() if isinstance(v, dict)]
    ids = [str(o["captcha_id"]) for o in outcomes]
    ready = sandbox.ready_times(ids)
    delays = [
        at - ready[str(v["captcha_id"])]
        for at, v in received.values()
        if isinstance(v, dict) and str(v.get("captcha_id")) in ready
    ]
    return delays, outcomes, sandbox.stats()


@dataclass(frozen=True)
class Bench:
    """What every run shares."""

    sandbox: SandboxServer
    journal: Path
    count: int
    log_dir: Path
    get: bool


def run(name: str, env: dict[str, str], bench: Bench, receiver: bool) -> Run:
    result = Run(name)
    slug = name.split()[0].strip("()")
    sandbox = bench.sandbox
    with Stack(env, bench.log_dir, f"{slug}-batch", receiver):
        sandbox.update_config(seed=SEED)
        clock = LineClock()
        wall, lines, stats = through_batch(env, sandbox, bench.count, bench.log_dir, slug, clock)
        result.channel = channel_state(env)
    result.wall_s = wall
    submitted = submitted_since(bench.journal, clock.started)
    first = min(submitted.values(), default=float("nan"))
    ready = sandbox.ready_times(list(submitted))
    result.span_s = clock.last() - first
    result.ready_span_s = max(ready.values(), default=float("nan")) - first
    result.waited = clock.waited(sandbox)
    result.solved = sum(1 for line in lines if line.get("status") == "solved")
    result.failed = bench.count - result.solved
    result.res_per_solved = stats["res_php_requests"] / max(1, result.solved)
    result.sources = solved_sources(env)
    if not bench.get:
        return result
    with Stack(env, bench.log_dir, f"{slug}-get", receiver):
        delays, outcomes, stats = through_get(sandbox, bench.count)
        r = redis_client(env["REDIS_URL"])
        result.samples = [float(x) for x in r.lrange(Keys(PREFIX).solve_times(METHOD), 0, -1)]
    result.delays = delays
    result.get_res_per_solved = stats["res_php_requests"] / max(1, len(outcomes))
    return result


def print_attacked(r: Run, ideal: float) -> None:
    print(
        f"\n(d) attacked receiver: {' and '.join(CROWDS)} slow connections held open"
        f" during the batch; /health every {HEALTH_EVERY_S} s from 127.0.0.1"
    )
    print(
        f"{'solved':>7} {'span s':>7} {'target s':>8} {'x ideal':>7} {'wall s':>7}"
        f" {'res/captcha':>11} {'/health n':>9} {'worst ms':>8} {'p50 ms':>6}  sources"
    )
    worst = max(r.health, default=float("nan")) * 1000
    print(
        f"{r.solved:>3}/{r.solved + r.failed:<3} {r.span_s:>7.2f} {1.10 * ideal + 1:>8.2f}"
        f" {r.span_s / ideal:>7.3f} {r.wall_s:>7.2f} {r.res_per_solved:>11.2f}"
        f" {len(r.health):>9} {worst:>8.1f} {pct(r.health, 50) * 1000:>6.1f}  {r.sources}"
    )
    for crowd, c in r.attack.items():
        print(
            f"  attackers {crowd}: {c['opened'] + c['failed']} connections made, of which"
            f" {c['failed']} reset before the attacker saw them open and {c['closed']} closed"
            f" later by the receiver; at most {c['max_open']} open at once (attacker's count)"
        )


def attacked_checks(r: Run, count: int, ideal: float) -> list[tuple[str, bool]]:
    return [
        (f"attacked: {count}/{count} solved", r.solved == count),
        (
            f"attacked: span <= 1.10 x ideal + 1 = {1.10 * ideal + 1:.1f} s",
            r.span_s <= 1.10 * ideal + 1,
        ),
        ("attacked: <= 0.3 res.php per captcha", r.res_per_solved <= 0.3),
        (
            f"attacked: /health answered within {HEALTH_BUDGET_S} s every time",
            bool(r.health) and max(r.health) <= HEALTH_BUDGET_S,
        ),
    ]


def print_table(runs: dict[str, Run], ideal: float, count: int) -> None:
    print(
        f"\n{count} {METHOD} captchas, {SOLVE_S:g} ± {JITTER_S:g} s solves (seed {SEED}),"
        f" {THREADS} threads;"
        f" ideal wall N x {SOLVE_S:g} s / {THREADS} threads = {ideal:.1f} s;"
        " span: first in.php to the batch's last line"
    )
    polling = runs["off"].span_s if "off" in runs else float("nan")
    print(
        f"{'run':<24} {'span s':>7} {'vs poll':>7} {'ready s':>7} {'wall s':>7} {'x ideal':>7}"
        f" {'solved':>6} {'res/captcha':>11} {'waited mean':>11} {'p90':>5} {'max':>5}"
        f" {'channel':>13}  sources"
    )
    for r in runs.values():
        waited = statistics.fmean(r.waited) if r.waited else float("nan")
        print(
            f"{r.name:<24} {r.span_s:>7.2f} {r.span_s / polling:>7.3f} {r.ready_span_s:>7.2f}"
            f" {r.wall_s:>7.2f} {r.wall_s / ideal:>7.3f} {r.solved:>3}/{r.solved + r.failed:<3}"
            f" {r.res_per_solved:>11.2f} {waited:>10.2f}s {pct(r.waited, 90):>4.1f}s"
            f" {max(r.waited, default=float('nan')):>4.1f}s {r.channel:>13}  {r.sources}"
        )
    print(
        "ready: from the first in.php to the last answer the sandbox had ready (the order"
        " the captchas went in decides it);\nwaited: from the sandbox having an answer to"
        " its line in the batch's output"
    )
    got = [r for r in runs.values() if r.delays]
    if not got:
        return
    print("\nthrough solve.delay().get(): answer ready at the sandbox -> get() returned")
    print(
        f"{'run':<24} {'p50':>7} {'p90':>6} {'p99':>6} {'mean':>6} {'res/get':>7}"
        "  solve times learnt (submit -> answer seen), s: p5 / p50 / p95"
    )
    for r in got:
        ms = [d * 1000 for d in r.delays]
        q = [pct(r.samples, p) for p in (5, 50, 95)]
        print(
            f"{r.name:<24} {pct(ms, 50):>5.0f}ms {pct(ms, 90):>4.0f}ms {pct(ms, 99):>4.0f}ms"
            f" {statistics.fmean(ms):>4.0f}ms {r.get_res_per_solved:>7.2f}"
            f"  {q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} ({len(r.samples)} samples)"
        )


def checks(runs: dict[str, Run], count: int, ideal: float) -> list[tuple[str, bool]]:
    found: list[tuple[str, bool]] = []
    if "on" in runs and runs["on"].delays:
        on = runs["on"]
        ms = [d * 1000 for d in on.delays]
        found += [
            (
                f"pingback wall <= 1.07 x ideal + 0.5 = {1.07 * ideal + 0.5:.1f} s",
                on.wall_s <= 1.07 * ideal + 0.5,
            ),
            ("pingback <= 0.2 res.php per solved captcha", on.res_per_solved <= 0.2),
            ("pingback ready -> get() p50 <= 30 ms", pct(ms, 50) <= 30),
            ("pingback ready -> get() p99 <= 150 ms", pct(ms, 99) <= 150),
        ]
    if "off" in runs and runs["off"].delays:
        off = runs["off"]
        off_s = list(off.delays)
        found += [
            ("no pingback: mean delay <= 0.3 s", statistics.fmean(off_s) <= 0.3),
            ("no pingback: p90 delay <= 0.6 s", pct(off_s, 90) <= 0.6),
            (
                "no pingback: <= 4 res.php per solved captcha",
                off.res_per_solved <= 4 and off.get_res_per_solved <= 4,
            ),
        ]
    found += lost_checks(runs, count)
    found.append(("every run solved every captcha", all(r.failed == 0 for r in runs.values())))
    return found


def lost_checks(runs: dict[str, Run], count: int) -> list[tuple[str, bool]]:
    """Callbacks save the polls, and lost ones cost (almost) nothing against polling."""
    found: list[tuple[str, bool]] = []
    polling = runs["off"].span_s if "off" in runs else float("nan")
    if "on" in runs:
        polls = runs["on"].res_per_solved
        found.append((f"every callback: <= {ON_RES:g} res.php per captcha", polls <= ON_RES))
    if "lossy" in runs:
        lossy = runs["lossy"]
        found += [
            (f"20% lost: {count}/{count} solved", lossy.solved == count),
            (
                f"20% lost: span <= {LOSSY_SPAN} x polling's = {LOSSY_SPAN * polling:.1f} s",
                lossy.span_s <= LOSSY_SPAN * polling,
            ),
            (f"20% lost: <= {LOSSY_RES:g} res.php per captcha", lossy.res_per_solved <= LOSSY_RES),
        ]
    if "lost" in runs:
        lost = runs["lost"]
        found += [
            (f"all lost: {count}/{count} solved", lost.solved == count),
            (
                f"all lost: span <= {LOST_SPAN} x polling's = {LOST_SPAN * polling:.1f} s",
                lost.span_s <= LOST_SPAN * polling,
            ),
        ]
    return found


#: The log scale starts here: a delay below it (an answer the caller had within the same
#: millisecond) is drawn at it.
FLOOR_MS = 1.0


def plot(args: argparse.Namespace, runs: dict[str, Run], ideal: float) -> None:
    """How long each run's answers waited after the sandbox had them: in the batch's output
    (every run), and through ``get()`` (when that pass ran)."""
    scale = "real-time" if args.real_time_scale else "image"
    setup = (
        f"{args.count} {METHOD} captchas, {SOLVE_S:g} ± {JITTER_S:g} s solves, {THREADS}"
        f" threads, two workers and beat, default settings; ideal {ideal:.1f} s;"
        f" {args.machine}"
    )
    batch = "How long an answer waited, from the provider having it to its batch line"
    get = "From the provider having the answer to solve.delay().get() returning it"
    figures = [
        ("batch", "wait", batch, {r.name: r.waited for r in runs.values()}),
        ("get", "delay", get, {r.name: r.delays for r in runs.values()}),
    ]
    for name, quantity, title, seconds in figures:
        floor = FLOOR_MS / 1000
        series = {k: [1000 * max(floor, v) for v in vs] for k, vs in seconds.items() if vs}
        if not series:  # no get() pass
            continue
        path = plots.latency_cdf(
            plots.target(args, f"pingback-{scale}-{name}"),
            series,
            title=title,
            params=setup,
            unit="ms",
            quantity=quantity,
            counted="captchas",
            log_x=True,
            marks=(50, 90, 99),
            percentile=pct,
        )
        print(f"plot: {path}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=None, help="Captchas per run (200).")
    parser.add_argument(
        "--only",
        choices=["on", "lossy", "lost", "off", "attacked"],
        action="append",
        help="Run only these.",
    )
    parser.add_argument(
        "--solve-time", type=float, default=None, help=f"Mean solve seconds ({SOLVE_S})."
    )
    parser.add_argument("--jitter", type=float, default=None, help=f"± seconds ({JITTER_S}).")
    parser.add_argument("--method", default=None, help=f"The captchas' method ({METHOD}).")
    parser.add_argument(
        "--no-get", action="store_true", help="Skip the solve.delay().get() pass of each run."
    )
    parser.add_argument(
        "--seed", type=int, default=SEED, help=f"The sandbox's seed for every run ({SEED})."
    )
    parser.add_argument(
        "--real-time-scale",
        action="store_true",
        help="60 reCAPTCHAs, 15 ± 3 s solves; polling, 20%% lost and all lost; no get() pass.",
    )
    plots.add_options(parser)
    args = parser.parse_args()
    args.machine = plots.machine()
    real = args.real_time_scale
    args.count = args.count or (60 if real else 200)
    args.solve_time = args.solve_time if args.solve_time is not None else 15.0 if real else SOLVE_S
    args.jitter = args.jitter if args.jitter is not None else 3.0 if real else JITTER_S
    args.method = args.method or ("userrecaptcha" if real else METHOD)
    args.only = args.only or (["off", "lossy", "lost"] if real else None)
    args.no_get = args.no_get or real
    return args


def main() -> int:
    global SOLVE_S, JITTER_S, METHOD, SEED
    args = parse_args()
    SOLVE_S, JITTER_S, METHOD, SEED = args.solve_time, args.jitter, args.method, args.seed
    log_dir = Path(tempfile.mkdtemp(prefix="bench-pingback-"))
    journal = log_dir / "sandbox.paid.jsonl"
    # every task takes the same solve time in every run: the runs differ in what the
    # policy does, not in which solve times fell to which thread (a span moves by a few
    # per cent with that alone)
    config = SandboxConfig(
        threads=THREADS,
        solve_time=SOLVE_S,
        jitter=JITTER_S,
        api_keys=(KEY,),
        seed=SEED,
        solve_times_by_task=True,
    )
    with RedisServer(log_dir=log_dir) as redis_server:
        redis_server.start()
        sandbox = SandboxServer(config, journal=journal).start()
        base = {
            "REDIS_URL": redis_server.url,
            "CAPTCHAAI_BASE_URL": sandbox.url,
            "CAPTCHAAI_API_KEY": KEY,
            "CAPTCHAAI_THREADS": str(THREADS),
            "CAPTCHAAI_KEY_PREFIX": PREFIX,
        }
        callbacks = {
            **base,
            "CAPTCHAAI_PINGBACK_URL": f"http://127.0.0.1:{free_port()}/captcha/pingback",
            "CAPTCHAAI_PINGBACK_SECRET": SECRET,
        }
        # nobody listens there: every callback is refused, as a typo or a firewall would
        nowhere = {
            **callbacks,
            "CAPTCHAAI_PINGBACK_URL": f"http://127.0.0.1:{free_port()}/captcha/pingback",
        }
        os.environ.update(base)  # this process's solve.delay() talks to the same stack
        bench = Bench(sandbox, journal, args.count, log_dir, get=not args.no_get)
        runs: dict[str, Run] = {}
        steps: list[tuple[str, str, dict[str, str], float, bool]] = [
            ("off", "(c) pingback off", base, 0.0, False),
            ("on", "(a) pingback on", callbacks, 0.0, True),
            ("lossy", "(b) pingback, 20% lost", callbacks, 0.2, True),
            ("lost", "(e) pingback, all lost", nowhere, 0.0, False),
        ]
        hit = None
        try:
            for key, name, env, drop, receiver in steps:
                if args.only and key not in args.only:
                    continue
                sandbox.update_config(pingback_drop_rate=drop)
                runs[key] = run(name, env, bench, receiver)
                print(f"done: {name}", file=sys.stderr, flush=True)
            if not args.only or "attacked" in args.only:
                sandbox.update_config(pingback_drop_rate=0.0)
                hit = attacked(callbacks, sandbox, args.count, log_dir)
                print("done: (d) attacked receiver", file=sys.stderr, flush=True)
        finally:
            sandbox.stop()
    ideal = args.count * SOLVE_S / THREADS
    results = []
    if runs:
        print_table(runs, ideal, args.count)
        results += checks(runs, args.count, ideal)
    if hit is not None:
        print_attacked(hit, ideal)
        results += attacked_checks(hit, args.count, ideal)
    if args.plot and runs:
        plot(args, runs, ideal)
    print()
    for text, ok in results:
        print(f"{'MET   ' if ok else 'MISSED'} {text}")
    print(f"\nlogs: {log_dir}")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
