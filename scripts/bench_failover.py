#!/usr/bin/env python3
"""Failover benchmark: a batch through a graceful switch, and through a kill -9 of the master.

For each event, a fresh deployment on loopback (a master, a replica and three sentinels
with a 1 s ``down-after-milliseconds``; the sandbox with 0.6 s ± 0.2 s solves; two workers,
beat, the exporter and the receiver: ``harness.sentinel_deployment``) runs a
``captcha-tasks batch`` of ``--count`` captchas, and the event happens once a third of
them are solved.  It prints, per event:

* the time the event took (until every sentinel names the new master and it answers), the
  longest gap with no result line, and the recovery time (from the event until results
  come back for good: the end of the longest gap after it);
* captchas paid twice (the sandbox's journal against the batch's distinct captchas),
  results failed, and the thread leases left at the end and how long they took to go;
* the master changes and the reconnects that the exporter counted.

Not a timed test: the figures are quoted in docs/guides/sentinel.md and, with their
plots, in docs/benchmarks/failover.md.

    python scripts/bench_failover.py [--count 300] [--events switch,kill] [--runs 1] [--plot DIR]

``--plot DIR`` also draws, per event, the results per second with the event and the
recovery marked (``failover-switch.svg``, ``failover-kill.svg``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import plots
import repo_root  # noqa: F401  (puts harness/ on sys.path)

from captcha_tasks.testing.processes import wait_until
from harness.sentinel_cluster import SentinelCluster
from harness.sentinel_deployment import (
    FAST,
    SANDBOX_OPTIONS,
    BatchRun,
    Event,
    SentinelDeployment,
    run_batch,
)

#: Seconds past the end a lease may take to go (a lease of a lost write expires).
LEASE_WAIT_S = float(FAST["CAPTCHAAI_SLOT_LEASE"]) + 10


@dataclass
class Row:
    event: str
    wall_s: float
    event_s: float
    gap_s: float
    recovery_s: float
    solved: int
    failed: int
    paid_twice: int
    leases_at_end: int
    leases_gone_s: float | None
    master_changes: float
    reconnects: float
    run: BatchRun = field(default_factory=BatchRun, repr=False)


def scraped_total(page: str, prefix: str) -> float:
    return sum(
        float(line.split()[-1])
        for line in page.splitlines()
        if line.startswith(prefix) and not line.startswith("#")
    )


def one(event: str, count: int, out: Path, run_no: int = 1) -> Row:
    log_dir = out / (event if run_no == 1 else f"{event}-{run_no}")
    cluster = SentinelCluster(log_dir=log_dir / "sentinel", password="bench-" + os.urandom(4).hex())
    with cluster.start():
        tag = f"bench-failover-{event}"
        with SentinelDeployment(cluster, log_dir, tag).start() as deployment:
            timeout = float(FAST["CAPTCHAAI_SOLVE_TIMEOUT"]) + 15
            run = run_batch(deployment, count, [Event(event, count // 3)], timeout)
            leases_at_end = len(deployment.leases())
            gone: float | None = None
            try:
                wait_until(lambda: not deployment.leases(), LEASE_WAIT_S, interval=0.2)
                gone = time.monotonic() - run.ended
            except TimeoutError:
                pass
            paid = deployment.sandbox.paid()
            page = deployment.get("metrics") or ""
    _, began, in_place = run.events[0]
    return Row(
        event=event,
        wall_s=run.ended - run.started,
        event_s=in_place - began,
        gap_s=run.longest_gap(),
        recovery_s=run.recovery(0),
        solved=len(run.solved()),
        failed=len(run.lines) - len(run.solved()),
        paid_twice=len(paid) - len({p["sitekey"] for p in paid}),
        leases_at_end=leases_at_end,
        leases_gone_s=gone,
        master_changes=scraped_total(page, "captcha_tasks_redis_master_changes_total"),
        reconnects=scraped_total(page, "captcha_tasks_redis_reconnects_total"),
        run=run,
    )


def fmt(value: float | None, digits: int = 1) -> str:
    return "never" if value is None else f"{value:.{digits}f}"


#: What each event is called on its plot.
EVENT_LABELS = {"switch": "SENTINEL FAILOVER", "kill": "kill -9 of the master"}


def plot(args: argparse.Namespace, row: Row) -> None:
    run = row.run
    _, began, in_place = run.events[0]
    times: dict[str, list[float]] = {"solved": [], "failed": []}
    for line, at in zip(run.lines, run.arrived, strict=True):
        times["solved" if line["status"] == "solved" else "failed"].append(at - run.started)
    label = EVENT_LABELS.get(row.event, row.event)
    path = plots.timeline(
        plots.target(args, f"failover-{row.event}"),
        {name: t for name, t in times.items() if t or name == "solved"},
        title=f"A batch through a {label}: results per second",
        params=(
            f"{args.count} captchas, the event at {args.count // 3} solved; a master, a "
            f"replica and three sentinels on loopback (down-after 1 s); sandbox "
            f"{' '.join(SANDBOX_OPTIONS)}, {FAST['CAPTCHAAI_THREADS']} threads; two workers, "
            f"beat, the exporter and the receiver; {args.machine}"
        ),
        events=[
            plots.Marker(
                began - run.started,
                f"{label}: new master in {in_place - began:.1f} s",
                until_s=in_place - run.started,
            ),
            plots.Marker(
                began - run.started + row.recovery_s,
                f"results back for good (+{row.recovery_s:.1f} s)",
            ),
        ],
        counted="results",
        xlabel="time since the batch started (s)",
    )
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--events", default="switch,kill")
    parser.add_argument("--runs", type=int, default=1, help="runs of each event (each fresh)")
    parser.add_argument("--out", type=Path, default=None, help="logs (default: a temp dir)")
    plots.add_options(parser)
    args = parser.parse_args()
    args.machine = plots.machine()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-failover-"))
    events = args.events.split(",")
    rows = [one(e, args.count, out, n) for e in events for n in range(1, args.runs + 1)]
    print(f"{args.count} captchas per run, the event at {args.count // 3} solved; logs in {out}")
    header = (
        "| event | wall s | event s | longest gap s | recovery s | solved | failed "
        "| paid twice | leases at end | leases gone after s | master changes | reconnects |"
    )
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for r in rows:
        print(
            f"| {r.event} | {r.wall_s:.1f} | {r.event_s:.1f} | {r.gap_s:.1f} "
            f"| {r.recovery_s:.1f} | {r.solved} | {r.failed} | {r.paid_twice} "
            f"| {r.leases_at_end} | {fmt(r.leases_gone_s)} | {r.master_changes:.0f} "
            f"| {r.reconnects:.0f} |"
        )
    if args.plot:
        for r in rows:
            plot(args, r)


if __name__ == "__main__":
    main()
