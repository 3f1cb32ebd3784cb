"""The ``captcha-tasks`` command: thin wrappers over the library."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from ..dev.quickstart import (
    ENV_FILE,
    demo_batch,
    fresh_dir,
    quickstart_dir,
    running_stack,
    stop_signals_interrupt,
)
from ..dev.sandbox_cli import sandbox as sandbox_command
from ..errors import CaptchaTasksError
from ..kafka.cli import register as register_kafka_commands
from ..metrics import metrics_command
from ..poolspec import parse_pools
from ..receiver.cli import register_commands as register_pingback_commands
from ..stream import stream
from ..worker.app import app
from ..worker.tasks import solve
from .batch_io import ResultWriter, check_input, solved_indexes, tasks


def main() -> None:
    """Entry point: one clear line and an exit code for our errors, not a traceback."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except CaptchaTasksError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group()
def cli() -> None:
    """CaptchaAI solving as Celery tasks shared by many workers."""


@cli.command()
@click.option("--count", default=12, show_default=True, help="Demo captchas to solve.")
@click.option("--keep-running", is_flag=True, help="Keep the stack up after the demo.")
@click.option("--workers", default=1, show_default=True, help="Worker processes to start.")
def quickstart(count: int, keep_running: bool, workers: int) -> None:
    """Start Redis (if needed), the sandbox (if no API key), a worker and beat; solve a demo.

    Logs go to ~/.cache/captcha-tasks/quickstart ($XDG_CACHE_HOME), replaced by each run.
    With --keep-running the stack's settings are written there to quickstart.env, for
    `source` in another shell.  Ctrl-C, SIGTERM or SIGHUP stops every process it started.
    """

    log_dir = fresh_dir(quickstart_dir())
    click.echo(f"logs in {log_dir} (kept until the next quickstart)")
    with stop_signals_interrupt(), running_stack(log_dir, click.echo, workers=workers) as stack:
        verify = stack.sandbox.url if stack.sandbox else None
        started = time.monotonic()
        failures = demo_batch(count, click.echo, verify)
        click.echo(
            f"{count - failures}/{count} solved in {time.monotonic() - started:.1f}s"
            + (f", {failures} failed" if failures else "")
        )
        if keep_running:
            env_file = stack.write_env_file(log_dir / ENV_FILE)
            exports = "".join(f"\n  {line}" for line in stack.exports())
            click.echo(
                f"stack running. In another shell, point captcha-tasks and your app at it:\n"
                f"  source {env_file}\nor paste:{exports}\n"
                "Ctrl-C, SIGTERM or closing this terminal stops it."
            )
            _wait_forever()
    if failures:
        sys.exit(1)


def _wait_forever() -> None:
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        click.echo("stopping")


@cli.command("solve")
@click.option("--method", required=True, help="A method of the README's table, e.g. turnstile.")
@click.option("--sitekey", default=None)
@click.option("--pageurl", default=None)
@click.option("--param", "params", multiple=True, metavar="K=V", help="Extra API parameter.")
@click.option("--timeout", default=300.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
def solve_command(
    method: str,
    sitekey: str | None,
    pageurl: str | None,
    params: tuple[str, ...],
    timeout: float,
    as_json: bool,
) -> None:
    """Solve one captcha through the workers and print its token."""

    extra = dict(_split_param(p) for p in params)
    result = solve.delay(method=method, sitekey=sitekey, pageurl=pageurl, **extra).get(
        timeout=timeout
    )
    token = result["token"]
    click.echo(
        json.dumps(result)
        if as_json
        else (json.dumps(token) if isinstance(token, dict | list) else token)
    )
    if not as_json and result.get("user_agent"):
        click.echo(f"user_agent: {result['user_agent']}", err=True)


def _split_param(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise click.BadParameter(f"expected K=V, got {text!r}", param_hint="--param")
    key, value = text.split("=", 1)
    return key.strip(), value


@cli.command()
def account() -> None:
    """Print the account's balance and, where the API answers it, its thread usage."""

    runtime = app.runtime()
    client = runtime.api()
    click.echo(f"balance: {client.balance():.4f}")
    info = client.threads_info()
    if info:
        click.echo(f"threads (API): {info.get('working_threads', '?')}/{info['threads']} in use")
    limiter = runtime.state.limiter
    click.echo(
        f"threads (this deployment): {limiter.in_use()}/{limiter.config.capacity} in use, "
        f"{limiter.parked_count()} submits parked"
    )


@cli.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSONL (or .csv) file to append results to; default stdout.",
)
@click.option(
    "--resume",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A previous OUTPUT: run only the indexes it has no 'solved' line for, append to it.",
)
@click.option("--window", type=int, default=None, help="Tasks queued at once.")
@click.option("--timeout-per-task", type=float, default=None, help="Seconds per task.")
def batch(
    input_path: Path,
    output: Path | None,
    resume: Path | None,
    window: int | None,
    timeout_per_task: float | None,
) -> None:
    """Solve every row of INPUT (CSV or JSONL), writing each result as it arrives."""

    if not input_path.exists():
        raise click.BadParameter(f"{input_path} does not exist", param_hint="INPUT")
    count, bad = check_input(input_path)
    if bad:
        for line in bad:
            click.echo(f"{input_path}: {line}", err=True)
        click.echo(f"{len(bad)} bad line(s); nothing was submitted", err=True)
        sys.exit(2)
    output = output or resume
    skip = solved_indexes(resume) if resume else set()
    app.runtime().state.db.ping()  # Redis down: one line and exit 1, and no output file
    try:
        writer = ResultWriter(output, sys.stdout)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from None
    todo = count - len(skip & set(range(count)))
    try:
        summary = _run_batch(tasks(input_path, skip), todo, writer, window, timeout_per_task)
    except KeyboardInterrupt:
        writer.close()
        where = output or "your output file"
        click.echo(
            f"\ninterrupted: queued work was cancelled; every result so far is in {where}.\n"
            f"resume with: captcha-tasks batch {input_path} --resume {where}",
            err=True,
        )
        sys.exit(130)
    writer.close()
    click.echo(summary.line(), err=True)
    sys.exit(0 if summary.failed == 0 else 1)


class _Summary:
    def __init__(self) -> None:
        self.solved = self.failed = 0
        self.started = time.monotonic()

    def line(self) -> str:
        took = time.monotonic() - self.started
        return f"{self.solved} solved, {self.failed} failed in {took:.1f}s"


def _run_batch(
    items: Any, total: int, writer: Any, window: int | None, timeout: float | None
) -> _Summary:

    indexes: dict[int, int] = {}

    def numbered() -> Any:
        for position, (index, task) in enumerate(items):
            indexes[position] = index
            yield task

    summary = _Summary()
    bar = tqdm(total=total, unit="captcha", file=sys.stderr, disable=not sys.stderr.isatty())
    with bar:
        for outcome in stream(numbered(), window=window, timeout_per_task=timeout):
            outcome["index"] = indexes.pop(outcome["index"])
            writer.write(outcome)
            if outcome["status"] == "solved":
                summary.solved += 1
            else:
                summary.failed += 1
            bar.update(1)
    return summary


@cli.group()
def pool() -> None:
    """Token pools."""


@pool.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def pool_status(as_json: bool) -> None:
    """Per pool: target, live tokens, refills in flight, hit rate and waste."""

    pools = app.runtime().state.pools
    rows = [pools.status(spec.name) for spec in pools.all()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(NO_POOLS)
        return
    click.echo(
        f"{'pool':<20} {'target':>6} {'live':>5} {'refills':>7} {'hit rate':>8} {'waste':>6}"
    )
    for row in rows:
        click.echo(
            f"{row['name']:<20} {row['target']:>6} {row['live']:>5} {row['inflight']:>7} "
            f"{_pct(row['hit_rate']):>8} {_pct(row['waste']):>6}"
        )


NO_POOLS = (
    "no pools declared in Redis. Declare them with CAPTCHAAI_POOLS (every worker, beat and "
    "captcha-tasks command registers the pools its own environment declares, this shell "
    "included), with `captcha-tasks pool declare --file pools.json`, or with "
    "captcha_tasks.create_pool()."
)


@pool.command("declare")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A JSON list of pools, as in CAPTCHAAI_POOLS (default: CAPTCHAAI_POOLS itself).",
)
def pool_declare(path: Path | None) -> None:
    """Register pools in Redis for beat and every worker, from CAPTCHAAI_POOLS or a file."""

    runtime = app.runtime()
    if path is None:
        specs = runtime.settings.pools
        where = "CAPTCHAAI_POOLS"
    else:
        specs = parse_pools(path.read_text(encoding="utf-8"), source=str(path))
        where = str(path)
    if not specs:
        raise click.UsageError(f"{where} declares no pools (pass --file, or set CAPTCHAAI_POOLS)")
    pools = runtime.state.pools
    for spec in specs:
        pools.register(spec)
        click.echo(f"pool {spec.name}: {spec.method}, size {spec.size}, ttl {spec.ttl:g}s")
    click.echo(f"{len(specs)} pool(s) from {where} registered; beat keeps them filled")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


cli.add_command(sandbox_command)
cli.add_command(metrics_command)
register_kafka_commands(cli)  # kafka-bridge, kafka lag, kafka create-topics
register_pingback_commands(cli)  # pingback-server, pingback register
