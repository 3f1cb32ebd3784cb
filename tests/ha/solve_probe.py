"""An app process for the failover tests: it starts a ``solve.delay(...).get()`` every
``INTERVAL_S`` (each in a thread of its own, so a call whose result was lost holds up
nothing else) until it is stopped, and prints one JSON line per call on stdout: task id,
monotonic start and end, solved or the error.  Run as ``python solve_probe.py PAGEURL``;
``python solve_probe.py PAGEURL COUNT`` makes COUNT calls one after the other and exits."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from captcha_tasks import solve

#: Longest wait for one result: a call whose result was lost is reported, not waited on.
GET_TIMEOUT_S = 8
INTERVAL_S = 0.2

_out = threading.Lock()


def call(n: int, pageurl: str) -> None:
    line: dict[str, object] = {"n": n, "began": time.monotonic()}
    try:
        result = solve.delay(method="turnstile", sitekey=f"probe-{n}", pageurl=pageurl)
        line["task_id"] = result.id
        line["ok"] = result.get(timeout=GET_TIMEOUT_S)["status"] == "solved"
    except Exception as exc:  # every failure is a line for the test to judge
        line.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
    line["ended"] = time.monotonic()
    with _out:
        print(json.dumps(line), flush=True)


def main(pageurl: str) -> None:
    # Enough threads for every call of a GET_TIMEOUT_S-long outage at once.
    with ThreadPoolExecutor(max_workers=4 * int(GET_TIMEOUT_S / INTERVAL_S)) as pool:
        for n in itertools.count():
            pool.submit(call, n, pageurl)
            time.sleep(INTERVAL_S)  # a cadence, not a synchronisation


def one_by_one(pageurl: str, count: int) -> None:
    for n in range(count):
        call(n, pageurl)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        one_by_one(sys.argv[1], int(sys.argv[2]))
    else:
        main(sys.argv[1])
