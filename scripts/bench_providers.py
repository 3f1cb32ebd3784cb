#!/usr/bin/env python3
"""Several providers: what a failover costs, and what one provider's budgets let through.

Three runs, each on a Redis of its own, sandbox processes (one per provider, on its own
port, with its own key, issuing the same captcha ids) and two worker processes:

* **primary dies** (issue 22, phase 1): both providers 15 threads, 1 s solves; a
  ``captcha-tasks batch`` of 600 captchas; the primary is SIGKILLed at 150 solved and a
  fresh one starts on the same port 15 s later.  Printed: the longest gap without results
  after the kill, captchas paid twice (paid - solved), every index solved and no token
  twice, and the time until captchas go to the restarted primary again.
* **balance runs out** (phase 2): the primary's balance runs out after 40 captchas of 150.
  Printed: solved, submits the empty primary refused, and every request sent to it once it
  was empty (refused submits and balance probes).
* **throughput**: one CaptchaAI-kind provider, a 300-thread plan, 0.5 s solves, default
  settings, 1,500 captchas queued at once.  Printed: captchas per second and task messages
  per captcha.
* **JSON family** (issue 31): the failover run's primary dies for good at 150 solved, once
  with a ``2captcha``-kind (``in.php``) fallback and once with an ``anticaptcha``-kind (JSON)
  one, the same sandbox timings.  Printed per fallback: the longest gap without results
  after the kill, captchas paid twice, and the fallback's captchas per second once it had
  the work.
* **acceptance** (issue 33): two ``in.php`` providers, 20 threads each, 0.2 s solves; a
  site that rejects 60% of the primary's tokens and 5% of the backup's, and one that takes
  them all; 440 captchas through ``solve.delay`` in rounds of 20 alternating the two
  sites, each token checked at the issuing sandbox's siteverify and reported (the pieces
  of :mod:`harness.acceptance`, which the e2e test runs too).  Printed: of the
  first and of the last 100 captchas of each site, the bad site's share at the backup and
  accepted, the good site's at the primary, and the bad reports each sandbox counted.

Not a timed test: targets are printed as MET / MISSED.

    python scripts/bench_providers.py [--only failover|balance|throughput|json|acceptance]
        [--plot DIR]

``--plot DIR`` also draws the solved captchas per second by provider of the failover run
(the kill and the restart marked: ``providers-failover.svg``), of the balance run (the
balance running out marked: ``providers-balance.svg``), and the acceptance run's shares
over its rounds (``providers-acceptance.svg``).
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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import plots  # noqa: E402
import repo_root  # noqa: F401, E402  (puts harness/ on sys.path)
from bench_pipeline import diff, report, spawn, stop, task_totals  # noqa: E402

PAGE = "https://example.com/bench-providers"
WORKER_ARGV = [
    sys.executable, "-m", "celery", "-A", "captcha_tasks", "worker",
    "-P", "threads", "-c", "32", "-l", "INFO",
    "--without-gossip", "--without-mingle", "--without-heartbeat",
]  # fmt: skip


@dataclass
class Arrivals:
    """Batch output lines as they arrive (a tail of the output file)."""

    path: Path
    times: list[float] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)
    _offset: int = 0

    def read(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as out:
            out.seek(self._offset)
            chunk = out.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        now = time.monotonic()
        for line in complete.decode().splitlines():
            if line.strip():
                self.lines.append(json.loads(line))
                self.times.append(now)
        return len(self.lines)


@contextmanager
def deployment(
    log_dir: Path,
    providers: list[tuple[str, list[str]]],
    extra_env: dict[str, str],
    kinds: dict[str, str] | None = None,
) -> Iterator[tuple[dict[str, str], dict[str, Any]]]:
    """Redis, one sandbox process per provider (the first is the primary) and two workers;
    yields the environment and the sandbox processes by name.  ``kinds``: a further
    provider's kind (default ``2captcha``), which its sandbox speaks too."""
    from captcha_tasks.testing.processes import RedisServer, SandboxProcess

    log_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        redis_server = stack.enter_context(RedisServer(log_dir=log_dir))
        redis_server.start()
        boxes: dict[str, Any] = {}
        kinds = kinds or {}
        for name, options in providers:
            if name in kinds:
                options = [*options, "--kind", kinds[name]]
            box = SandboxProcess(name, f"{name}-key", options=options, log_dir=log_dir)
            boxes[name] = stack.enter_context(box.start())
        primary, *others = providers
        env = {
            **os.environ,
            "REDIS_URL": redis_server.url,
            "CAPTCHAAI_BASE_URL": boxes[primary[0]].url,
            "CAPTCHAAI_API_KEY": f"{primary[0]}-key",
            "CAPTCHAAI_PROVIDER_NAME": primary[0],
            "CAPTCHAAI_KEY_PREFIX": "bench",
            "CAPTCHAAI_QUEUE_PREFIX": "bench",
            **extra_env,
        }
        if others:
            entries = []
            for n, (name, _) in enumerate(others, start=1):
                env[f"BENCH_KEY_{n}"] = f"{name}-key"
                entries.append(
                    {
                        "name": name,
                        "base_url": boxes[name].url,
                        "key_env": f"BENCH_KEY_{n}",
                        "threads": int(env.get("CAPTCHAAI_THREADS", "10")),
                        "role": "fallback",
                        "kind": kinds.get(name, "2captcha"),
                    }
                )
            env["CAPTCHAAI_PROVIDERS"] = json.dumps(entries)
        workers = [
            spawn([*WORKER_ARGV, "-n", f"bench{n}@%h"], env, log_dir / f"worker{n}.log")
            for n in range(2)
        ]
        try:
            yield env, boxes
        finally:
            for proc in workers:
                stop(proc)


def run_batch(env: dict[str, str], log_dir: Path, count: int, name: str) -> tuple[Any, Arrivals]:
    rows = log_dir / f"{name}-in.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"method": "turnstile", "sitekey": f"k{i}", "pageurl": PAGE}) + "\n"
            for i in range(count)
        )
    )
    out = log_dir / f"{name}-out.jsonl"
    argv = [sys.executable, "-m", "captcha_tasks.cli", "batch", str(rows), "-o", str(out)]
    with open(log_dir / f"{name}-batch.log", "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, Arrivals(out)


def wait_batch(proc: Any, arrivals: Arrivals, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        arrivals.read()
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    arrivals.read()


def longest_gap(times: list[float], since: float) -> float:
    """The longest stretch without a result from ``since`` on."""
    after = sorted(t for t in times if t >= since)
    edges = [since, *after]
    return max((b - a for a, b in zip(edges, edges[1:], strict=False)), default=0.0)


def solved_indexes(lines: list[dict[str, Any]]) -> set[int]:
    return {int(line["index"]) for line in lines if line.get("status") == "solved"}


def by_provider(arrivals: Arrivals, since: float) -> dict[str, list[float]]:
    """Seconds from ``since`` at which each captcha came, solved ones by provider."""
    out: dict[str, list[float]] = {}
    for line, at in zip(arrivals.lines, arrivals.times, strict=True):
        name = str(line.get("provider")) if line.get("status") == "solved" else "failed"
        out.setdefault(name, []).append(at - since)
    return out


def plot_failover(
    args: argparse.Namespace, arrivals: Arrivals, started: float, events: list[plots.Marker]
) -> None:
    path = plots.timeline(
        plots.target(args, "providers-failover"),
        by_provider(arrivals, started),
        title="The primary provider dies and comes back: solved per second by provider",
        params=(
            f"{args.count} captchas (captcha-tasks batch); main and backup: 15 threads, 1 s "
            f"± 0.1 s solves; two workers -P threads -c 32; the primary SIGKILLed at 150 "
            f"solved, a fresh one on its port {args.down:g} s later; {args.machine}"
        ),
        events=events,
        counted="solved",
        xlabel="time since the batch started (s)",
    )
    print(f"plot: {path}")


def plot_balance(
    args: argparse.Namespace, arrivals: Arrivals, started: float, events: list[plots.Marker]
) -> None:
    path = plots.timeline(
        plots.target(args, "providers-balance"),
        by_provider(arrivals, started),
        title="The primary's balance runs out: solved per second by provider",
        params=(
            f"{BALANCE_COUNT} captchas (captcha-tasks batch); main and backup: 15 threads, 1 s "
            f"± 0.1 s solves; two workers -P threads -c 32; the primary's account empty after "
            f"{BALANCE_CAPTCHAS} captchas; {args.machine}"
        ),
        events=events,
        counted="solved",
        xlabel="time since the batch started (s)",
    )
    print(f"plot: {path}")


# -- runs ---------------------------------------------------------------------------------


def failover(
    log_dir: Path, count: int, down_s: float, args: argparse.Namespace
) -> list[tuple[str, bool]]:
    options = ["--threads", "15", "--solve-time", "1", "--jitter", "0.1"]
    providers = [("main", options), ("backup", options)]
    env_extra = {"CAPTCHAAI_THREADS": "15"}
    with deployment(log_dir, providers, env_extra) as (env, boxes):
        main, backup = boxes["main"], boxes["backup"]
        started = time.monotonic()
        proc, arrivals = run_batch(env, log_dir, count, "failover")
        while arrivals.read() < 150 and proc.poll() is None:
            time.sleep(0.02)
        killed_at = time.monotonic()
        killed_wall = time.time()
        restarted: list[float] = []

        def restart() -> None:
            main.restart(down_s)
            restarted.append(time.monotonic())

        restarter = threading.Thread(target=restart, daemon=True)
        restarter.start()
        wait_batch(proc, arrivals, count, 600)
        restarter.join(60)
        back_wall = killed_wall + down_s
        paid = len(main.paid()) + len(backup.paid())
        later = [p["at"] for p in main.paid() if p["at"] > back_wall]
    lines = arrivals.lines
    tokens = [line["token"] for line in lines if line.get("status") == "solved"]
    gap = longest_gap(arrivals.times, killed_at)
    twice = paid - len(tokens)
    back = (min(later) - back_wall) if later else None
    by = {}
    for line in lines:
        by[line.get("provider")] = by.get(line.get("provider"), 0) + 1
    print(
        f"\nprimary dies: {count} captchas, primary SIGKILLed at 150 solved,"
        f" back {down_s:g} s later"
    )
    print(f"{'wall s':>7} {'solved':>6} {'by provider':>28} {'longest gap s':>13} {'paid':>5} "
          f"{'paid twice':>10} {'back to primary s':>17}")  # fmt: skip
    shown = ", ".join(f"{k} {v}" for k, v in sorted(by.items(), key=str))
    back_s = "never" if back is None else f"{back:.1f}"
    print(f"{time.monotonic() - started:>7.1f} {len(tokens):>6} {shown:>28} {gap:>13.2f} "
          f"{paid:>5} {twice:>10} {back_s:>17}")  # fmt: skip
    if args.plot:
        events = [plots.Marker(killed_at - started, "primary killed")]
        events += [plots.Marker(t - started, "primary back (restarted)") for t in restarted]
        if back is not None:
            first = killed_at + down_s + back - started
            events.append(plots.Marker(first, "captchas go to it again"))
        plot_failover(args, arrivals, started, events)
    return [
        ("every index solved", solved_indexes(lines) == set(range(count))),
        ("no token delivered twice", len(set(tokens)) == len(tokens)),
        ("results never stop for more than 8 s after the kill", gap <= 8.0),
        ("at most N + 15 captchas paid", paid <= count + 15),
        ("the restarted primary receives captchas again", back is not None),
    ]


#: The balance run: captchas in the batch, and after how many the primary's account is empty.
BALANCE_COUNT, BALANCE_CAPTCHAS = 150, 40


def balance(
    log_dir: Path, count: int, captchas: int, args: argparse.Namespace
) -> list[tuple[str, bool]]:
    options = ["--threads", "15", "--solve-time", "1", "--jitter", "0.1"]
    providers = [("main", options), ("backup", options)]
    with deployment(log_dir, providers, {"CAPTCHAAI_THREADS": "15"}) as (env, boxes):
        main = boxes["main"]
        main.configure(balance_captchas=captchas)
        before = main.stats()
        started, started_wall = time.monotonic(), time.time()
        proc, arrivals = run_batch(env, log_dir, count, "balance")
        wait_batch(proc, arrivals, count, 600)
        after = main.stats()
        paid_at = [p["at"] for p in main.paid()]
    refused = after["refused_submits"].get("ERROR_ZERO_BALANCE", 0)
    others = (after["res_php_requests"] - after.get("res_php_get_requests", 0)) - (
        before["res_php_requests"] - before.get("res_php_get_requests", 0)
    )
    solved = len(solved_indexes(arrivals.lines))
    print(f"\nbalance runs out: {count} captchas, the primary empty after {captchas}")
    print(f"{'solved':>6} {'at primary':>10} {'refused submits':>15} {'other requests':>14}")
    at_main = sum(1 for line in arrivals.lines if line.get("provider") == "main")
    print(f"{solved:>6} {at_main:>10} {refused:>15} {others:>14}")
    print("(other requests: getbalance probes and checks while it was empty, start-up included)")
    if args.plot:
        # the journal's wall clock, moved onto the arrivals' monotonic one
        dry = [at - started_wall for at in paid_at[captchas - 1 : captchas]]
        label = f"primary's balance empty ({captchas} paid)"
        plot_balance(args, arrivals, started, [plots.Marker(t, label) for t in dry])
    return [
        ("all solved", solved == count),
        ("the empty primary sees at most 10 refused submits", refused <= 10),
    ]


def throughput_run(log_dir: Path, count: int, kind: str) -> tuple[int, float, dict[str, int]]:
    options = ["--threads", "300", "--solve-time", "0.5", "--jitter", "0.05"]
    extra = {"CAPTCHAAI_THREADS": "300", "CAPTCHAAI_PROVIDER_KIND": kind}
    with deployment(log_dir, [("captchaai", options)], extra) as (env, _):
        os.environ.update({k: v for k, v in env.items() if k.startswith(("CAPTCHAAI_", "REDIS"))})
        from captcha_tasks import app, solve

        before = task_totals(app)
        started = time.monotonic()
        results = [
            solve.delay(method="turnstile", sitekey=f"k{i}", pageurl=PAGE) for i in range(count)
        ]
        solved = sum(1 for r in results if r.get(timeout=600).get("status") == "solved")
        wall = time.monotonic() - started
        messages = diff(task_totals(app), before)
        del results
    return solved, wall, messages


def throughput_child(log_dir: Path, count: int, kind: str) -> tuple[int, float, dict[str, int]]:
    """One throughput run in a process of its own (a process's Celery app keeps the broker
    it first connected to)."""
    out = log_dir / f"{kind}.json"
    argv = [sys.executable, __file__, "--throughput-kind", kind, "--count", str(count),
            "--out", str(out)]  # fmt: skip
    subprocess.run(argv, check=True, timeout=900)
    solved, wall, messages = json.loads(out.read_text())
    return int(solved), float(wall), dict(messages)


def throughput(log_dir: Path, count: int) -> list[tuple[str, bool]]:
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = {kind: throughput_child(log_dir, count, kind) for kind in ("captchaai", "2captcha")}
    print(f"\nthroughput: {count} captchas, a 300-thread plan, 0.5 s solves, two workers")
    print(f"{'kind':<10} {'solved':>6} {'wall s':>7} {'captchas/s':>10} {'msgs/captcha':>12}")
    for kind, (solved, wall, messages) in rows.items():
        per_captcha = sum(messages.values()) / max(1, solved)
        print(f"{kind:<10} {solved:>6} {wall:>7.1f} {solved / wall:>10.1f} {per_captcha:>12.2f}")
        print("  messages by task: " + ", ".join(f"{k} {v}" for k, v in sorted(messages.items())))
    print("(2captcha: its 60 in.php per 3 s hold the plan to 20 a second; the waiting submits")
    print(" wait in Redis, not in countdown messages)")
    solved, wall, messages = rows["captchaai"]
    per_captcha = sum(messages.values()) / max(1, solved)
    held_back = rows["2captcha"]
    held_per = sum(held_back[2].values()) / max(1, held_back[0])
    return [
        ("80 captchas per second or more", solved / wall >= 80),
        ("3 task messages per captcha or fewer", per_captcha <= 3.0),
        ("held back by a budget: 3 task messages per captcha or fewer", held_per <= 3.0),
    ]


#: The JSON-family run: the fallback kinds compared, and when the primary dies (solved).
JSON_FALLBACKS, JSON_KILL_AT = ("2captcha", "anticaptcha"), 150


def json_failover(log_dir: Path, count: int, kind: str) -> dict[str, Any]:
    """The primary dies for good at :data:`JSON_KILL_AT` solved; a fallback of ``kind``."""
    options = ["--threads", "15", "--solve-time", "1", "--jitter", "0.1"]
    providers = [("main", options), ("backup", options)]
    extra = {"CAPTCHAAI_THREADS": "15"}
    with deployment(log_dir, providers, extra, {"backup": kind}) as (env, boxes):
        main, backup = boxes["main"], boxes["backup"]
        started = time.monotonic()
        proc, arrivals = run_batch(env, log_dir, count, f"json-{kind}")
        while arrivals.read() < JSON_KILL_AT and proc.poll() is None:
            time.sleep(0.02)
        killed_at = time.monotonic()
        main.kill()
        wait_batch(proc, arrivals, count, 600)
        paid = len(main.paid()) + len(backup.paid())
        stats = backup.stats()
    lines = arrivals.lines
    tokens = [line["token"] for line in lines if line.get("status") == "solved"]
    at_backup = [
        at
        for line, at in zip(lines, arrivals.times, strict=True)
        if line.get("provider") == "backup" and line.get("status") == "solved"
    ]
    span = (max(at_backup) - min(at_backup)) if len(at_backup) > 1 else 0.0
    return {
        "kind": kind,
        "wall": time.monotonic() - started,
        "solved": len(tokens),
        "indexes": solved_indexes(lines) == set(range(count)),
        "unique": len(set(tokens)) == len(tokens),
        "backup": len(at_backup),
        "gap": longest_gap(arrivals.times, killed_at),
        "paid": paid,
        "twice": paid - len(tokens),
        "rate": len(at_backup) / span if span else 0.0,
        "polls": stats.get("res_php_get_requests", 0),
    }


def json_family(log_dir: Path, count: int) -> list[tuple[str, bool]]:
    rows = [json_failover(log_dir / kind, count, kind) for kind in JSON_FALLBACKS]
    print(
        f"\nJSON family: {count} captchas, the primary (captchaai) SIGKILLed at {JSON_KILL_AT}"
        " solved and left dead; the fallback 15 threads, 1 s solves"
    )
    print(f"{'fallback kind':<13} {'protocol':<8} {'wall s':>7} {'solved':>6} {'at fallback':>11} "
          f"{'longest gap s':>13} {'paid':>5} {'paid twice':>10} {'fallback/s':>10} "
          f"{'its polls':>9}")  # fmt: skip
    for row in rows:
        protocol = "in.php" if row["kind"] == "2captcha" else "json"
        print(f"{row['kind']:<13} {protocol:<8} {row['wall']:>7.1f} {row['solved']:>6} "
              f"{row['backup']:>11} {row['gap']:>13.2f} {row['paid']:>5} {row['twice']:>10} "
              f"{row['rate']:>10.1f} {row['polls']:>9}")  # fmt: skip
    print("(its polls: res.php get requests the fallback's sandbox counted, bulk ones as one;")
    print(" a JSON provider is asked one getTaskResult per task)")
    checks: list[tuple[str, bool]] = []
    for row in rows:
        kind = row["kind"]
        checks += [
            (
                f"{kind} fallback: every index solved, no token twice",
                row["indexes"] and row["unique"],
            ),
            (f"{kind} fallback: at most N + 15 captchas paid", row["paid"] <= count + 15),
        ]
    return checks


def acceptance_child(log_dir: Path, out: Path) -> None:
    """The acceptance run, in a process of its own (see :func:`throughput_child`): writes
    every captcha's use, the seconds at which each round ended and each sandbox's bad
    reports to ``out``."""
    from harness.acceptance import SANDBOX_OPTIONS

    providers = [("main", SANDBOX_OPTIONS), ("backup", SANDBOX_OPTIONS)]
    extra = {"CAPTCHAAI_THREADS": "20", "CAPTCHAAI_THREADS_CHECK_EVERY": "0"}
    with deployment(log_dir, providers, extra) as (env, boxes):
        os.environ.update(env)
        from harness.acceptance import Site, measure

        started = time.monotonic()
        ends: list[float] = []
        site = Site({name: box.url for name, box in boxes.items()})
        measured = measure(site, on_round=lambda _: ends.append(time.monotonic() - started))
        counted = {name: box.stats()["reports_bad"] for name, box in boxes.items()}
    uses = [vars(use) for use in measured.uses]
    out.write_text(json.dumps({"uses": uses, "ends": ends, "reports_bad": counted}))


def acceptance(log_dir: Path, args: argparse.Namespace) -> list[tuple[str, bool]]:
    from harness import acceptance as run

    log_dir.mkdir(parents=True, exist_ok=True)
    out = log_dir / "acceptance.json"
    argv = [sys.executable, __file__, "--acceptance-out", str(out)]
    subprocess.run(argv, check=True, timeout=1200)
    data = json.loads(out.read_text())
    measured = run.Measurement([run.Use(**use) for use in data["uses"]])
    first = run.Measurement(measured.uses[: 2 * run.LAST])  # the first 100 of each site
    wall = data["ends"][-1] if data["ends"] else 0.0
    rejects = ", ".join(f"{p} {r:.0%}" for p, r in run.BAD_SITE_REJECTS.items())
    print(
        f"\nacceptance: {len(measured.uses)} captchas in {len(data['ends'])} rounds of"
        f" {run.ROUND_SIZE} alternating two sites, {wall:.1f} s; the bad site rejects {rejects}"
        " of the tokens, the good one none"
    )
    print(f"{'of 100 captchas':<28} {'first 100':>9} {'last 100':>8} {'target':>7}")
    labels = {
        "bad_at_backup": ("bad site: at the backup", 80),
        "bad_accepted": ("bad site: accepted", 85),
        "good_at_primary": ("good site: at the primary", 90),
    }
    before, after = first.figures(), measured.figures()
    for key, (label, target) in labels.items():
        print(f"{label:<28} {before[key]:>8}% {after[key]:>7}% {'>= ' + str(target) + '%':>7}")
    sent = measured.bad_reports()
    print(
        "bad reports (sent by the app / counted by the provider that solved them): "
        + ", ".join(f"{p} {sent[p]} / {data['reports_bad'].get(p)}" for p in sent)
    )
    if args.plot:
        plot_acceptance(args, measured)
    reached = all(data["reports_bad"].get(p) == n for p, n in sent.items())
    return [*measured.checks(), ("every bad report reached the provider that solved it", reached)]


#: The acceptance plot's window: each point is the share of a site's last this many captchas.
ACCEPTANCE_WINDOW = 50


def acceptance_shares(uses: list[Any], page: str, share: Any) -> list[tuple[float, float]]:
    """``(captchas so far, share)`` after each round: ``share(use)`` over the last
    :data:`ACCEPTANCE_WINDOW` captchas of ``page``'s site."""
    points: list[tuple[float, float]] = []
    rounds = sorted({use.round for use in uses})
    for number in rounds:
        so_far = [use for use in uses if use.round <= number]
        window = [use for use in so_far if use.page == page][-ACCEPTANCE_WINDOW:]
        if window:
            points.append((len(so_far), sum(map(share, window)) / len(window)))
    return points


def plot_acceptance(args: argparse.Namespace, measured: Any) -> None:
    from harness import acceptance as run

    uses = measured.uses
    series = {
        "bad site: at the backup": acceptance_shares(
            uses, run.BAD_SITE, lambda u: u.provider == "backup"
        ),
        "bad site: accepted": acceptance_shares(uses, run.BAD_SITE, lambda u: u.accepted),
        "good site: at the primary": acceptance_shares(
            uses, run.GOOD_SITE, lambda u: u.provider == "main"
        ),
    }
    targets = {
        "bad site: at the backup": 0.80,
        "bad site: accepted": 0.85,
        "good site: at the primary": 0.90,
    }
    path = plots.shares(
        plots.target(args, "providers-acceptance"),
        series,
        title="A site that rejects the primary's tokens moves to the backup",
        params=(
            f"{len(uses)} captchas through solve.delay in rounds of {run.ROUND_SIZE}, alternating"
            " two sites; each token checked at the issuing provider's siteverify and reported;"
            " the bad site rejects 60% of main's tokens and 5% of backup's; two in.php"
            f" providers, 20 threads, 0.2 s solves; each point: a site's last"
            f" {ACCEPTANCE_WINDOW} captchas; {args.machine}"
        ),
        targets=targets,
        ylabel=f"share of the site's last {ACCEPTANCE_WINDOW} captchas",
    )
    print(f"plot: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--only", choices=("failover", "balance", "throughput", "json", "acceptance")
    )
    parser.add_argument("--count", type=int, default=600, help="captchas of the failover run")
    parser.add_argument("--down", type=float, default=15.0, help="seconds the primary is down")
    parser.add_argument("--throughput-kind", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--acceptance-out", type=Path, help=argparse.SUPPRESS)
    plots.add_options(parser)
    args = parser.parse_args()
    if args.acceptance_out:  # the acceptance run, in its own process (see acceptance_child)
        acceptance_child(args.acceptance_out.parent / "deployment", args.acceptance_out)
        return 0
    if args.throughput_kind:  # one throughput run, in its own process (see throughput_child)
        figures = throughput_run(
            args.out.parent / args.throughput_kind, args.count, args.throughput_kind
        )
        args.out.write_text(json.dumps(figures))
        return 0
    args.machine = plots.machine()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-providers-"))
    checks: list[tuple[str, bool]] = []
    if args.only in (None, "failover"):
        checks += failover(log_dir / "failover", args.count, args.down, args)
    if args.only in (None, "balance"):
        checks += balance(log_dir / "balance", BALANCE_COUNT, BALANCE_CAPTCHAS, args)
    if args.only in (None, "throughput"):
        checks += throughput(log_dir / "throughput", args.count if args.only else 1500)
    if args.only in (None, "json"):
        checks += json_family(log_dir / "json", args.count)
    if args.only in (None, "acceptance"):
        checks += acceptance(log_dir / "acceptance", args)
    print(f"(logs in {log_dir})", flush=True)
    return report(checks)


if __name__ == "__main__":
    # os._exit: Celery's result consumers would try to unsubscribe from the Redis server
    # this script has already stopped.
    os._exit(main())
