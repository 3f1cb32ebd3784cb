#!/usr/bin/env python3
"""Session-lock recovery benchmark: how long a dead lock holder keeps the others waiting.

Each run starts ``--processes`` processes (24) that all find the same domain's session
stale and call :func:`captcha_tasks.toolkit.sessions.reauthenticate`.  One of them takes
the lock and logs in; its login hangs, and the script SIGKILLs it there.  The others must
notice that the lock lapsed, and one of them log in again.  Measured from the kill to the
new cookies' save (the new holder's login returns at once).  Target: <= 5 s.

    python scripts/bench_session_lock.py [--runs 3] [--processes 24] [--json]

Uses ``REDIS_URL`` when set, else starts a Redis server of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import redis

from captcha_tasks.state.keys import Keys
from captcha_tasks.testing.processes import RedisServer, wait_until
from captcha_tasks.toolkit.sessions import LOCK_TTL_MS, CookieStore, reauthenticate

DOMAIN = "example.com"
TARGET_S = 5.0


def contender(url: str, prefix: str, seen: int) -> None:
    """One contending process: log in once (the first login hangs until it is killed)."""
    r = redis.Redis.from_url(url, decode_responses=True)
    store = CookieStore(r, Keys(prefix))
    pid = os.getpid()

    def login() -> dict[str, str]:
        r.rpush(f"{prefix}:bench:logins", pid)
        if r.set(f"{prefix}:bench:first", pid, nx=True):
            threading.Event().wait()  # the hung login: this process is SIGKILLed here
        return {"sid": f"s-{pid}"}

    r.rpush(f"{prefix}:bench:ready", pid)
    cookies = reauthenticate(store, None, DOMAIN, login, seen_version=seen, wait_s=60, poll_s=0.05)
    done = {"pid": pid, "version": cookies.version, "at": time.time()}
    r.rpush(f"{prefix}:bench:done", json.dumps(done))


def run_once(url: str, processes: int) -> dict[str, Any]:
    prefix = f"bench-lock-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(url, decode_responses=True)
    seen = CookieStore(r, Keys(prefix)).save(DOMAIN, {"sid": "stale"})
    argv = [sys.executable, __file__, "--contender", url, prefix, str(seen)]
    started = [subprocess.Popen(argv) for _ in range(processes)]
    try:
        wait_until(lambda: r.get(f"{prefix}:bench:first"), 60, what="a holder in its login")
        wait_until(lambda: r.llen(f"{prefix}:bench:ready") == processes, 60, what="every contender")
        holder = int(r.get(f"{prefix}:bench:first") or 0)
        os.kill(holder, signal.SIGKILL)
        killed_at = time.time()
        others = processes - 1
        wait_until(lambda: r.llen(f"{prefix}:bench:done") == others, 60, what="the others")
        done = [json.loads(x) for x in r.lrange(f"{prefix}:bench:done", 0, -1)]
        logins = r.llen(f"{prefix}:bench:logins")
        versions = {d["version"] for d in done}
        return {
            "processes": processes,
            "ttl_ms": LOCK_TTL_MS,
            "recovery_s": round(min(d["at"] for d in done) - killed_at, 2),
            "all_had_s": round(max(d["at"] for d in done) - killed_at, 2),
            "logins": logins,
            "versions": sorted(versions),
            "stale_version": seen,
        }
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)
        r.close()


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--contender":
        contender(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=24)
    parser.add_argument("--json", action="store_true", help="one JSON line per run")
    args = parser.parse_args()
    server = None
    url = os.environ.get("REDIS_URL")
    if not url:
        server = RedisServer().start()
        url = server.url
    try:
        runs = [run_once(url, args.processes) for _ in range(args.runs)]
    finally:
        if server is not None:
            server.stop()
    if args.json:
        for run in runs:
            print(json.dumps(run))
        return 0
    print(f"session-lock recovery, {args.processes} processes, lock TTL {LOCK_TTL_MS} ms")
    print(f"{'run':>3}  {'recovery s':>10}  {'all had s':>9}  {'logins':>6}  {'target':>8}")
    for n, run in enumerate(runs, 1):
        ok = "met" if run["recovery_s"] <= TARGET_S else "MISSED"
        line = f"{n:>3}  {run['recovery_s']:>10.2f}  {run['all_had_s']:>9.2f}"
        print(f"{line}  {run['logins']:>6}  {ok:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
