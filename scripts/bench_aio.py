#!/usr/bin/env python3
"""asyncio benchmark: what ``await aio.solve()`` adds over ``solve.delay().get()``, and
1,000 concurrent ``await aio.solve()`` in one event loop.

Set-up: a throwaway Redis, the sandbox answering at once (0 s solves) in a process of its
own, and one worker process (``-P threads -c 32``) that polls right after each submit.

1. Latency: ``--count`` solves one after the other each way, interleaved (a sync one, an
   asyncio one, ...) so both see the same worker and Redis; p50 / p99 of each and the
   difference (the latency ``aio`` adds; negative: it is faster).
2. Concurrency: ``--concurrent`` ``aio.solve()`` calls gathered in one loop; every one must
   complete; the process's thread count (``/proc/self/status``, sampled every 10 ms; target
   at most 8) and its RSS.

    python scripts/bench_aio.py [--count 300] [--concurrent 1000] [--plot DIR]

``--plot DIR`` also draws both ways' latencies as CDFs (``aio-latency.svg``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plots
from bench_pipeline import KEY, Sandbox, spawn, stop

PAGE = "https://example.com/bench-aio"
THREADS_TARGET = 8


def proc_status(field: str) -> int:
    """A number from ``/proc/self/status`` (``Threads``, ``VmRSS`` kB, ``VmHWM`` kB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def latencies(count: int) -> tuple[list[float], list[float]]:
    from captcha_tasks import aio, solve

    sync: list[float] = []
    async_: list[float] = []

    async def run() -> None:
        for i in range(count):
            started = time.perf_counter()
            # a blocking call inside the loop on purpose: one after the other, same conditions
            solve.delay(method="turnstile", sitekey=f"s{i}", pageurl=PAGE).get(timeout=30)
            sync.append(time.perf_counter() - started)
            started = time.perf_counter()
            await aio.solve(method="turnstile", sitekey=f"a{i}", pageurl=PAGE)
            async_.append(time.perf_counter() - started)

    asyncio.run(run())
    return sync, async_


def concurrent(n: int) -> dict[str, Any]:
    from captcha_tasks import aio

    peak = {"threads": proc_status("Threads")}

    async def sample(stop_: asyncio.Event) -> None:
        while not stop_.is_set():
            peak["threads"] = max(peak["threads"], proc_status("Threads"))
            await asyncio.sleep(0.01)

    async def one(i: int) -> bool:
        outcome = await aio.solve(method="turnstile", sitekey=f"c{i}", pageurl=PAGE)
        return outcome["status"] == "solved"

    async def run() -> tuple[list[bool | BaseException], float]:
        stop_ = asyncio.Event()
        sampler = asyncio.create_task(sample(stop_))
        started = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
        wall = time.perf_counter() - started
        stop_.set()
        await sampler
        return done, wall

    rss_before = proc_status("VmRSS")
    done, wall = asyncio.run(run())
    failures = [d for d in done if d is not True]
    if failures:
        print(f"first failure: {failures[0]!r}", flush=True)
    return {
        "n": n,
        "completed": sum(1 for d in done if d is True),
        "wall_s": wall,
        "threads": peak["threads"],
        "rss_mb": proc_status("VmRSS") / 1024,
        "rss_peak_mb": proc_status("VmHWM") / 1024,
        "rss_before_mb": rss_before / 1024,
    }


def table(sync: list[float], async_: list[float], conc: dict[str, Any]) -> list[tuple[str, bool]]:
    def ms(v: float) -> str:
        return f"{1000 * v:8.2f}"

    print(f"\nlatency, {len(sync)} solves each, sandbox answering at once (ms)")
    print(f"{'':<28} {'p50':>8} {'p99':>8} {'mean':>8}")
    for name, values in (("solve.delay().get()", sync), ("await aio.solve()", async_)):
        mean = statistics.fmean(values)
        print(f"{name:<28} {ms(percentile(values, 50))} {ms(percentile(values, 99))} {ms(mean)}")
    added50 = percentile(async_, 50) - percentile(sync, 50)
    added99 = percentile(async_, 99) - percentile(sync, 99)
    mean_added = statistics.fmean(async_) - statistics.fmean(sync)
    print(f"{'added by aio':<28} {ms(added50)} {ms(added99)} {ms(mean_added)}")

    print(f"\n{conc['n']:,} concurrent await aio.solve() in one event loop")
    print(f"{'completed':<28} {conc['completed']:>8} of {conc['n']}")
    print(f"{'wall s':<28} {conc['wall_s']:>8.2f}")
    print(f"{'threads (peak, process)':<28} {conc['threads']:>8}")
    print(f"{'RSS MiB (before / after)':<28} {conc['rss_before_mb']:>8.1f} / {conc['rss_mb']:.1f}")
    print(f"{'RSS MiB (process peak)':<28} {conc['rss_peak_mb']:>8.1f}")
    return [
        ("every concurrent solve completed", conc["completed"] == conc["n"]),
        (f"at most {THREADS_TARGET} threads", conc["threads"] <= THREADS_TARGET),
    ]


def plot(args: argparse.Namespace, sync: list[float], async_: list[float]) -> None:
    path = plots.latency_cdf(
        plots.target(args, "aio-latency"),
        {
            "solve.delay().get()": [1000 * v for v in sync],
            "await aio.solve()": [1000 * v for v in async_],
        },
        title="What await aio.solve() adds over solve.delay().get()",
        params=(
            f"{len(sync)} solves each way, interleaved, one after the other; the sandbox "
            f"answering at once; one worker -P threads -c 32, poll right after the submit; "
            f"{args.machine}"
        ),
        unit="ms",
        counted="solves",
        log_x=True,
        marks=(50, 99),
        percentile=percentile,
    )
    print(f"plot: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="solves per way (latency)")
    parser.add_argument("--concurrent", type=int, default=1000)
    plots.add_options(parser)
    args = parser.parse_args()
    args.machine = plots.machine()

    from captcha_tasks.testing.processes import RedisServer

    log_dir = Path(tempfile.mkdtemp(prefix="bench-aio-"))
    threads = max(1000, args.concurrent)
    options = ["--threads", str(2 * threads), "--solve-time", "0", "--jitter", "0"]
    with RedisServer(log_dir=log_dir) as redis_server, Sandbox(options, log_dir) as sandbox:
        redis_server.start()
        env = {
            "REDIS_URL": redis_server.url,
            "CAPTCHAAI_BASE_URL": sandbox.url,
            "CAPTCHAAI_API_KEY": KEY,
            "CAPTCHAAI_KEY_PREFIX": "bench-aio",
            "CAPTCHAAI_THREADS": str(threads),
            "CAPTCHAAI_SUBMIT_RATE": "1000000",
            # the sandbox answers at once: poll right after the submit
            "CAPTCHAAI_INITIAL_WAIT": "0",
            "CAPTCHAAI_POLL_INTERVAL": "0.05",
        }
        os.environ.update(env)
        argv = [
            sys.executable, "-m", "celery", "-A", "captcha_tasks", "worker",
            "-P", "threads", "-c", "32", "-l", "INFO", "-n", "bench-aio@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        worker = spawn(argv, dict(os.environ), log_dir / "worker.log")
        try:
            latencies(20)  # warm-up: connections, scripts, the worker's pools
            sync, async_ = latencies(args.count)
            conc = concurrent(args.concurrent)
        finally:
            stop(worker)
    checks = table(sync, async_, conc)
    if args.plot:
        plot(args, sync, async_)
    print()
    for text, ok in checks:
        print(f"{'MET   ' if ok else 'MISSED'} {text}")
    print(f"(logs in {log_dir})", flush=True)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    # os._exit: Celery's result consumer would unsubscribe from the stopped Redis server.
    os._exit(main())
