#!/usr/bin/env python3
"""Token-pool benchmark against the sandbox (not a timed test; prints tables).

1. Take latency from a warm pool: p50 / p99 of the direct Python call
   (``PoolStore.take`` and the public ``take_token``, which also triggers a top-up) and of
   ``solve.delay(...).get()`` answered from the pool.
2. Steady demand: one take per second on a pool whose tokens live 8 s, 1.5 s ± 0.3 s
   solves, ``CAPTCHAAI_PREWARM_EVERY=1``, for 60 s after a 10 s warm-up.
   Targets: hit rate >= 95 %, waste (expired unused / solved) <= 5 %.

    python scripts/bench_pools.py [--seconds 60] [--warmup 10] [--plot DIR]

``--plot DIR`` also draws the three take latencies as CDFs (``pools-take-latency.svg``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plots

from captcha_tasks.testing.processes import CeleryProcess, RedisServer, wait_until
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer

KEY = "bench-key"
PAGE = "https://example.com/bench-pool"
WARM = {
    "name": "warm",
    "method": "turnstile",
    "sitekey": "warm-key",
    "pageurl": PAGE,
    "size": 40,
    "ttl": 120,
    "min_remaining": 5,
}
STEADY = {
    "name": "steady",
    "method": "turnstile",
    "sitekey": "steady-key",
    "pageurl": PAGE,
    "size": 10,
    "ttl": 8,
    "min_remaining": 1,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--samples", type=int, default=150)
    plots.add_options(parser)
    args = parser.parse_args()
    args.machine = plots.machine()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-pools-"))
    with RedisServer(log_dir=log_dir) as redis_server:
        redis_server.start()
        sandbox = SandboxServer(
            SandboxConfig(threads=15, solve_time=1.5, jitter=0.3, api_keys=(KEY,))
        ).start()
        env = {
            "REDIS_URL": redis_server.url,
            "CAPTCHAAI_BASE_URL": sandbox.url,
            "CAPTCHAAI_API_KEY": KEY,
            "CAPTCHAAI_THREADS": "15",
            "CAPTCHAAI_POLL_INTERVAL": "0.5",
            "CAPTCHAAI_INITIAL_WAIT": "1",
            "CAPTCHAAI_PREWARM_EVERY": "1",
            "CAPTCHAAI_KEY_PREFIX": "bench",
            "CAPTCHAAI_POOLS": json.dumps([WARM, STEADY]),
        }
        os.environ.update(env)
        procs = [
            CeleryProcess("worker", env=env, concurrency=16, log_dir=log_dir).start(),
            CeleryProcess("beat", env=env, log_dir=log_dir).start(),
        ]
        try:
            latency_ok = bench_latency(args)
            steady_ok = bench_steady(args.seconds, args.warmup)
        finally:
            for proc in reversed(procs):
                proc.stop()
            sandbox.stop()
    return 0 if latency_ok and steady_ok else 1


def percentiles(samples: list[float]) -> tuple[float, float]:
    return table_percentile(samples, 50), table_percentile(samples, 99)


def table_percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def timed_takes(
    take: Callable[[], Any], samples: int, refill_wait: Callable[[], None]
) -> list[float]:
    out: list[float] = []
    while len(out) < samples:
        refill_wait()
        for _ in range(20):
            t0 = time.perf_counter()
            got = take()
            elapsed = time.perf_counter() - t0
            if got is not None:
                out.append(elapsed)
    return out[:samples]


def bench_latency(args: argparse.Namespace) -> bool:
    samples = args.samples
    from captcha_tasks import solve
    from captcha_tasks.worker.app import app
    from captcha_tasks.worker.tasks import take_token

    pools = app.runtime().state.pools

    def full() -> None:
        # Forget the burst's take history so the pool aims at its full size again (a
        # burst of 20 takes would otherwise set a small rate-based target).
        pools.reset_stats("warm")
        wait_until(lambda: pools.live("warm") >= 25, 60, what="the warm pool")

    def via_solve() -> Any:
        out = solve.delay(method="turnstile", sitekey="warm-key", pageurl=PAGE).get(timeout=30)
        return out if out["source"] == "pool" else None

    rows = [
        ("PoolStore.take (direct)", timed_takes(lambda: pools.take("warm"), samples, full)),
        ("take_token (direct + top-up)", timed_takes(lambda: take_token("warm"), samples, full)),
        ("solve.delay().get() from pool", timed_takes(via_solve, samples, full)),
    ]
    print(f"\nTake latency from a warm pool ({samples} takes each)")
    print(f"{'call':<32} {'p50 ms':>8} {'p99 ms':>8}")
    for name, values in rows:
        p50, p99 = percentiles(values)
        print(f"{name:<32} {p50 * 1000:>8.2f} {p99 * 1000:>8.2f}")
    if args.plot:
        path = plots.latency_cdf(
            plots.target(args, "pools-take-latency"),
            {name: [1000 * v for v in values] for name, values in rows},
            title="Take latency from a warm pool",
            params=(
                f"{samples} takes each, the pool refilled to 25 or more between bursts of 20; "
                f"one worker -c 16 and beat; sandbox 15 threads, 1.5 s ± 0.3 s solves; "
                f"{args.machine}"
            ),
            unit="ms",
            quantity="take latency",
            counted="takes",
            log_x=True,
            marks=(50, 99),
            percentile=table_percentile,
        )
        print(f"plot: {path}")
    return True


def bench_steady(seconds: int, warmup: int) -> bool:
    from captcha_tasks.worker.app import app
    from captcha_tasks.worker.tasks import take_token

    pools = app.runtime().state.pools
    run_demand(take_token, warmup)
    pools.reset_stats("steady")
    hits, misses = run_demand(take_token, seconds)
    time.sleep(STEADY["ttl"])  # let tokens added near the end live out their life
    pools.sweep("steady")
    status = pools.status("steady")
    solved = status["added"]
    waste = status["expired"] / solved if solved else 0.0
    hit_rate = hits / (hits + misses)
    print(
        f"\nSteady demand: 1 take/s for {seconds}s (after {warmup}s warm-up), "
        f"token life {STEADY['ttl']}s, 1.5s solves, prewarm every 1s"
    )
    print(
        f"{'takes':>6} {'hits':>6} {'misses':>7} {'hit rate':>9} {'solved':>7} "
        f"{'expired':>8} {'waste':>7}"
    )
    print(
        f"{hits + misses:>6} {hits:>6} {misses:>7} {hit_rate:>9.1%} {solved:>7} "
        f"{status['expired']:>8} {waste:>7.1%}"
    )
    ok = hit_rate >= 0.95 and waste <= 0.05
    print(
        f"hit rate target >= 95%: {'MET' if hit_rate >= 0.95 else 'MISSED'}; "
        f"waste target <= 5%: {'MET' if waste <= 0.05 else 'MISSED'}"
    )
    return ok


def run_demand(take: Callable[[str], Any], seconds: int) -> tuple[int, int]:
    hits = misses = 0
    start = time.monotonic()
    for i in range(seconds):
        # one take per second, on a fixed schedule
        delay = start + i - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if take("steady") is None:
            misses += 1
        else:
            hits += 1
    return hits, misses


if __name__ == "__main__":
    sys.exit(main())
