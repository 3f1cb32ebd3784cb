#!/usr/bin/env python3
"""What the gateway costs: 2captcha's own SDK through ``captcha-tasks gateway`` against
``solve.delay(...).get()`` directly, on the same stack (the sandbox, one worker process).

1. **Added latency.**  After :data:`WARM_UP` unmeasured solves (the worker polls a method
   whose solve times it has not learned on a cold schedule: the path measured first would
   pay that alone), ``--count`` Turnstile captchas through ``2captcha-python``
   (``TwoCaptcha(key, server=...)``, HTTPS with a certificate made here; its polling
   interval ``--sdk-poll`` seconds, ``--concurrency`` solves at once), then as many through
   ``solve.delay().get()``.  For each captcha, the time its token reached the caller minus
   the time the sandbox had the answer ready (``GET /sandbox/ready``): p50 and p99 of both,
   and the difference.  The SDK asks every ``--sdk-poll`` seconds, so it waits up to that
   long by design (after each answer, not each second: its period is the interval plus
   a request on a new TLS connection): the target is an added p99 within the polling
   interval + 50 ms.  Each path's time is also split where the outcome was stored: the
   worker's part (provider ready -> stored) and the caller's read (stored -> it has it).
2. **Cost per request.**  The gateway's CPU time (its process's ``utime + stime``, from
   ``/proc``) over the requests it answered in part 1.
3. **res.php/s.**  ``--load-seconds`` of ``res.php?action=get`` for solved ids from
   ``--connections`` keep-alive connections (aiohttp, in this process), to a gateway
   serving HTTPS itself and to one serving plain HTTP (TLS ended by a reverse proxy): the
   answers per second, and the answers per second of the gateway's own CPU time (what one
   core holds, whatever the load generator took of the machine's other core).  Target:
   >= 1,000.

Not a timed test: the targets are printed as MET / MISSED.

    python scripts/bench_gateway.py [--count 200] [--concurrency 20] [--sdk-poll 1]
        [--load-seconds 10] [--connections 32] [--solve-time 0.5 --jitter 0.2]

Needs the ``bench`` extra (aiohttp) and the ``test`` extra (2captcha-python, cryptography).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
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
from harness.tls import self_signed

KEY = "bench-gateway-key"
GATEWAY_KEY = "0123456789abcdef" * 2
PAGE = "https://example.com/bench-gateway"
THREADS = 50
TENANTS = {"bench": {"key_env": "BENCH_GATEWAY_KEY", "requests_per_s": 1_000_000}}
ADDED_P99_MARGIN_S = 0.050
RES_PHP_PER_CORE = 1000
#: Solves before the measured ones: more than the samples the worker needs to learn a
#: method's solve times (CAPTCHAAI_ADAPTIVE_SAMPLES, 10).
WARM_UP = 40


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class Gateway:
    """``captcha-tasks gateway`` as a child process, over TLS or plain HTTP (behind a
    proxy that ends TLS)."""

    def __init__(self, env: dict[str, str], log_dir: Path, tls: bool) -> None:
        self.port = free_port()
        self.tls = tls
        argv = [sys.executable, "-m", "captcha_tasks.cli", "gateway", "--port", str(self.port)]
        folder = log_dir / ("tls" if tls else "plain")
        folder.mkdir()
        self.certfile, keyfile = self_signed(folder)
        if tls:
            argv += ["--certfile", str(self.certfile), "--keyfile", str(keyfile)]
        log = (log_dir / f"gateway-{'tls' if tls else 'plain'}.log").open("w")
        self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._up, 20, what="the gateway")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def _up(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", verify=str(self.certfile), timeout=1).ok
        except requests.ConnectionError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


#: One captcha of part 1: when the caller had its token, the token, and when its outcome
#: was stored in the result backend (the worker's completion).
Done = tuple[float, str, float]


def through_sdk(
    gateway: Gateway, sandbox: SandboxServer, count: int, concurrency: int, poll: int
) -> list[Done]:
    from twocaptcha import TwoCaptcha

    os.environ["REQUESTS_CA_BUNDLE"] = str(gateway.certfile)
    solver = TwoCaptcha(GATEWAY_KEY, server=f"127.0.0.1:{gateway.port}", pollingInterval=poll)

    def one(n: int) -> tuple[float, str, str]:
        result = solver.turnstile(sitekey=f"0x4-sdk-{n}", url=PAGE)
        return time.time(), str(result["code"]), str(result["captchaId"])

    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(one, range(count)))
    stored = _stored_at([captcha_id for _, _, captcha_id in done])
    return [(at, token, stored[captcha_id]) for at, token, captcha_id in done]


def _stored_at(captcha_ids: list[str]) -> dict[str, float]:
    """When the outcome of each gateway captcha was stored (its record's ``date_done``)."""
    from captcha_tasks.worker.app import app
    from captcha_tasks.worker.results import Results

    state, results = app.runtime().state, Results(app)
    tickets = state.gateway.look_up(captcha_ids)
    found = {}
    for captcha_id, ticket in zip(captcha_ids, tickets, strict=True):
        assert ticket is not None and ticket.task_id is not None
        raw = state.db.redis.get(results.key(ticket.task_id))
        found[captcha_id] = _unix(json.loads(raw)["date_done"])
    return found


def _unix(iso: Any) -> float:
    from datetime import datetime

    return iso.timestamp() if isinstance(iso, datetime) else datetime.fromisoformat(iso).timestamp()


def delays(sandbox: SandboxServer, done: list[Done]) -> dict[str, list[float]]:
    """Per captcha: from the provider having the answer to the caller having it
    (``total``), split at the moment its outcome was stored (``stored``, then ``read``)."""
    ready = sandbox.token_ready_times([token for _, token, _ in done])
    found: dict[str, list[float]] = {"total": [], "stored": [], "read": []}
    for at, token, stored in done:
        if token in ready:
            found["total"].append(at - ready[token])
            found["stored"].append(stored - ready[token])
            found["read"].append(at - stored)
    return found


def through_get(count: int, concurrency: int) -> list[Done]:
    from captcha_tasks import solve

    def one(n: int) -> Done:
        result = solve.delay(method="turnstile", sitekey=f"0x4-get-{n}", pageurl=PAGE)
        outcome = result.get(60)
        return time.time(), str(outcome["token"]), _unix(result.date_done)

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(count)))


async def _hammer(url: str, ids: list[str], seconds: float, connections: int) -> int:
    connector = aiohttp.TCPConnector(limit=connections, ssl=False)
    answered = 0
    deadline = time.monotonic() + seconds

    async def client(n: int, session: aiohttp.ClientSession) -> None:
        nonlocal answered
        i = n
        while time.monotonic() < deadline:
            params = {"key": GATEWAY_KEY, "action": "get", "id": ids[i % len(ids)]}
            async with session.get(f"{url}/res.php", params=params) as resp:
                body = await resp.text()
                if resp.status == 200 and body.startswith("OK|"):
                    answered += 1
            i += connections

    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(n, session) for n in range(connections)))
    return answered


def res_php_load(
    gateway: Gateway, ids: list[str], seconds: float, connections: int
) -> dict[str, float]:
    before = cpu_seconds(gateway.proc.pid)
    started = time.monotonic()
    answered = asyncio.run(_hammer(gateway.url, ids, seconds, connections))
    wall = time.monotonic() - started
    cpu = cpu_seconds(gateway.proc.pid) - before
    return {
        "answered": answered,
        "per_s": answered / wall,
        "cpu_s": cpu,
        "per_cpu_s": answered / cpu if cpu > 0 else float("nan"),
        "cpu_ms_per_request": 1000 * cpu / answered if answered else float("nan"),
    }


def solved_ids(gateway: Gateway, count: int) -> list[str]:
    """Ids of ``count`` captchas submitted through the gateway and solved."""
    session = requests.Session()
    session.verify = str(gateway.certfile)
    ids = []
    for n in range(count):
        data = {
            "key": GATEWAY_KEY,
            "method": "turnstile",
            "sitekey": f"0x4-load-{n}",
            "pageurl": PAGE,
        }
        ids.append(session.post(f"{gateway.url}/in.php", data=data, timeout=10).text[3:])

    def all_solved() -> bool:
        got = session.get(
            f"{gateway.url}/res.php",
            params={"key": GATEWAY_KEY, "action": "get", "ids": ",".join(ids)},
            timeout=10,
        ).text
        return "CAPCHA_NOT_READY" not in got

    wait_until(all_solved, 60, interval=0.2, what="the load test's captchas solved")
    return ids


def server_side(redis_url: str) -> dict[str, tuple[int, float, float]]:
    """Per endpoint: requests, and the p50 and p99 of the gateways' answer times (the
    upper bound of the histogram bucket each falls in)."""
    from captcha_tasks.state.gateway import LATENCY_BUCKETS, _tabulate

    raw = redis_client(redis_url).hgetall(Keys().gateway_stats())
    table = _tabulate((str(k), str(v)) for k, v in raw.items())
    found = {}
    bounds = [*LATENCY_BUCKETS, float("inf")]
    for (_, _, endpoint), row in table.items():
        total = sum(row.buckets)

        def quantile(q: float, row: Any = row, total: int = total) -> float:
            seen = 0
            for bound, n in zip(bounds, row.buckets, strict=True):
                seen += n
                if seen >= q * total:
                    return bound
            return bounds[-1]

        found[endpoint] = (total, quantile(0.5), quantile(0.99))
    return found


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--sdk-poll", type=int, default=1, help="the SDK's polling interval (s)")
    parser.add_argument("--load-seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--solve-time", type=float, default=0.5)
    parser.add_argument("--jitter", type=float, default=0.2)
    plots.add_options(parser)
    args = parser.parse_args()
    args.machine = plots.machine()
    return args


def plot(args: argparse.Namespace, sdk: list[float], direct: list[float]) -> None:
    path = plots.latency_cdf(
        plots.target(args, "gateway-latency"),
        {"solve.delay().get()": direct, "2captcha-python via the gateway": sdk},
        title="From the provider having the answer to the caller having it",
        params=(
            f"{len(sdk)} Turnstile captchas each way, {args.concurrency} at once; the SDK "
            f"polls every {args.sdk_poll} s; sandbox {args.solve_time} s ± {args.jitter} s; "
            f"{args.machine}"
        ),
        counted="captchas",
        marks=(50, 99),
        percentile=pct,
    )
    print(f"plot: {path}")


def main() -> int:
    args = parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    config = SandboxConfig(
        threads=THREADS, solve_time=args.solve_time, jitter=args.jitter, api_keys=(KEY,)
    )
    with RedisServer(log_dir=log_dir) as redis_server:
        redis_server.start()
        sandbox = SandboxServer(config).start()
        env = {
            **os.environ,
            "REDIS_URL": redis_server.url,
            "CAPTCHAAI_BASE_URL": sandbox.url,
            "CAPTCHAAI_API_KEY": KEY,
            "CAPTCHAAI_THREADS": str(THREADS),
            "CAPTCHAAI_TENANTS": json.dumps(TENANTS),
        }
        os.environ.update(env)  # this process's solve.delay() talks to the same stack
        worker = CeleryProcess("worker", env=env, concurrency=32, log_dir=log_dir).start()
        genv = {**env, "BENCH_GATEWAY_KEY": GATEWAY_KEY}
        gateways = [Gateway(genv, log_dir, tls=True), Gateway(genv, log_dir, tls=False)]
        tls, plain = gateways
        try:
            # Both paths meet a worker that knows Turnstile's solve times (it polls a method
            # it has not seen yet on a cold schedule): whichever ran first paid that alone.
            through_get(WARM_UP, args.concurrency)
            cpu_before = cpu_seconds(tls.proc.pid)
            sdk_done = through_sdk(tls, sandbox, args.count, args.concurrency, args.sdk_poll)
            sdk_cpu = cpu_seconds(tls.proc.pid) - cpu_before
            sdk = delays(sandbox, sdk_done)
            direct = delays(sandbox, through_get(args.count, args.concurrency))
            ids = solved_ids(tls, 50)
            loads = {
                g.url: res_php_load(g, ids, args.load_seconds, args.connections) for g in gateways
            }
        finally:
            for gateway in gateways:
                gateway.stop()  # each writes its last counts as it stops
            worker.stop()
            sandbox.stop()
        answer_times = server_side(redis_server.url)
    report(args, sdk["total"], direct["total"], sdk_cpu, loads[tls.url], loads[plain.url])
    split(sdk, direct)
    if args.plot:
        plot(args, sdk["total"], direct["total"])
    print("\nthe gateways' own answer times (their histogram; upper bounds of its buckets):")
    for endpoint, (count, p50, p99) in sorted(answer_times.items()):
        bounds = f"p50 <= {p50 * 1000:g} ms   p99 <= {p99 * 1000:g} ms"
        print(f"  {endpoint:<22}{count:>8} requests   {bounds}")
    print(f"\nlogs: {log_dir}")
    return 0


def split(sdk: dict[str, list[float]], direct: dict[str, list[float]]) -> None:
    """Where each path's time goes: the worker (provider ready -> outcome stored) and the
    caller's read of it (stored -> the caller has it: a poll for the SDK)."""
    print("\nwhere the time goes (s)             p50 stored   p99 stored   p50 read   p99 read")
    for name, found in (("solve.delay().get()", direct), ("2captcha-python via the gateway", sdk)):
        print(
            f"{name:<34}{pct(found['stored'], 50):>12.3f}{pct(found['stored'], 99):>13.3f}"
            f"{pct(found['read'], 50):>11.3f}{pct(found['read'], 99):>11.3f}"
        )


def report(
    args: argparse.Namespace,
    sdk: list[float],
    direct: list[float],
    sdk_cpu: float,
    tls: dict[str, float],
    plain: dict[str, float],
) -> None:
    added50, added99 = pct(sdk, 50) - pct(direct, 50), pct(sdk, 99) - pct(direct, 99)
    print(
        f"\n{args.count} Turnstile captchas, sandbox {args.solve_time} s ± {args.jitter} s, "
        f"{args.concurrency} at once; 2captcha-python polls every {args.sdk_poll} s\n"
    )
    print(f"{'path':<34}{'p50 (s)':>10}{'p99 (s)':>10}")
    print(f"{'solve.delay().get()':<34}{pct(direct, 50):>10.3f}{pct(direct, 99):>10.3f}")
    print(f"{'2captcha-python via the gateway':<34}{pct(sdk, 50):>10.3f}{pct(sdk, 99):>10.3f}")
    print(f"{'added by the gateway and the SDK':<34}{added50:>10.3f}{added99:>10.3f}")
    print(
        f"\ngateway CPU during the SDK run: {sdk_cpu:.2f} s,"
        f" {1000 * sdk_cpu / args.count:.1f} ms per captcha (its in.php and every poll)"
    )
    print(f"\nres.php load: {args.connections} keep-alive connections, {args.load_seconds:g} s\n")
    print(f"{'gateway':<34}{'answers':>9}{'per s':>8}{'CPU ms/req':>12}{'per CPU-s':>11}")
    for name, load in (("HTTPS (--certfile)", tls), ("HTTP (TLS ended by a proxy)", plain)):
        print(
            f"{name:<34}{load['answered']:>9.0f}{load['per_s']:>8.0f}"
            f"{load['cpu_ms_per_request']:>12.3f}{load['per_cpu_s']:>11.0f}"
        )
    checks = [
        (
            f"added p99 {added99 * 1000:.0f} ms <= the SDK's polling interval + 50 ms"
            f" ({args.sdk_poll * 1000 + 50:.0f} ms)",
            added99 <= args.sdk_poll + ADDED_P99_MARGIN_S,
        ),
        (
            f"res.php answers per CPU-second of the gateway behind a TLS proxy"
            f" {plain['per_cpu_s']:.0f} >= {RES_PHP_PER_CORE}",
            plain["per_cpu_s"] >= RES_PHP_PER_CORE,
        ),
        (
            f"res.php answers per CPU-second of the gateway serving TLS itself"
            f" {tls['per_cpu_s']:.0f} >= {RES_PHP_PER_CORE}",
            tls["per_cpu_s"] >= RES_PHP_PER_CORE,
        ),
    ]
    print()
    for text, ok in checks:
        print(f"{'MET   ' if ok else 'MISSED'} {text}")


if __name__ == "__main__":
    sys.exit(main())
