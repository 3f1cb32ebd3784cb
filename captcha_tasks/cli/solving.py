"""``captcha-tasks solve``, ``account`` and ``batch``: captchas through the workers."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from ..batch import stream
from ..core.lanes import LANES, check_tenant
from ..errors import ValidationError
from ..serving.options import option_group
from ..settings import Settings
from ..worker.app import app
from ..worker.tasks import solve
from .batch_io import ResultWriter, check_input, solved_indexes, tasks


@click.command("solve")
@click.option(
    "--method",
    required=True,
    help="A method of the app guide's table (docs/guides/app.md), e.g. turnstile.",
)
@click.option("--sitekey", default=None)
@click.option("--pageurl", default=None)
@click.option("--param", "params", multiple=True, metavar="K=V", help="Extra API parameter.")
@click.option("--timeout", default=300.0, show_default=True, type=float)
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
@click.option("--tenant", default=None, help="A tenant CAPTCHAAI_TENANTS declares.")
@click.option("--lane", type=click.Choice(LANES), default=None, help="Default: interactive.")
def solve_command(
    method: str,
    sitekey: str | None,
    pageurl: str | None,
    params: tuple[str, ...],
    timeout: float,
    as_json: bool,
    tenant: str | None,
    lane: str | None,
) -> None:
    """Solve one captcha through the workers and print its token."""

    extra: dict[str, str] = dict(_split_param(p) for p in params)
    extra.update({k: v for k, v in (("tenant", tenant), ("lane", lane)) if v is not None})
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


@click.command()
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


#: ``batch``'s options: where results go, how many at once, and the rows' defaults.
_BATCH_OPTIONS = [
    click.option(
        "-o",
        "--output",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="JSONL (or .csv) file to append results to; default stdout.",
    ),
    click.option(
        "--resume",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="A previous OUTPUT: run only the indexes it has no 'solved' line for, append to it.",
    ),
    click.option("--window", type=int, default=None, help="Tasks queued at once."),
    click.option("--timeout-per-task", type=float, default=None, help="Seconds per task."),
    click.option(
        "--tenant",
        default=None,
        help="The tenant of rows that name none (one CAPTCHAAI_TENANTS declares;"
        " default: default).",
    ),
    click.option(
        "--lane",
        type=click.Choice(LANES),
        default=None,
        help="The lane of rows that name none (default: bulk).",
    ),
]


@click.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=False, path_type=Path))
@option_group(_BATCH_OPTIONS)
def batch(
    input_path: Path,
    output: Path | None,
    resume: Path | None,
    window: int | None,
    timeout_per_task: float | None,
    tenant: str | None,
    lane: str | None,
) -> None:
    """Solve every row of INPUT (CSV or JSONL), writing each result as it arrives."""

    if not input_path.exists():
        raise click.BadParameter(f"{input_path} does not exist", param_hint="INPUT")
    settings = app.runtime().settings
    route = _route(settings, lane, tenant)
    count = _checked_rows(input_path, settings, route)
    output = output or resume
    skip = solved_indexes(resume) if resume else set()
    if resume is not None and not set(range(count)) - skip:
        click.echo(f"all {count} tasks of {input_path} are already solved in {resume}", err=True)
        sys.exit(0)
    app.runtime().state.db.ping()  # Redis down: one line and exit 1, and no output file
    try:
        writer = ResultWriter(output, sys.stdout)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror}") from None
    todo = count - len(skip & set(range(count)))
    try:
        summary = _run_batch(tasks(input_path, skip, route), todo, writer, window, timeout_per_task)
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


def _route(settings: Settings, lane: str | None, tenant: str | None) -> dict[str, str]:
    """The lane and tenant of rows that name none (``--lane``, ``--tenant``), checked."""
    route = {"lane": lane} if lane else {}
    if tenant is not None:
        try:
            route["tenant"] = check_tenant(tenant, settings.tenants.declared)
        except ValidationError as exc:
            raise click.BadParameter(exc.message, param_hint="--tenant") from None
    return route


def _checked_rows(input_path: Path, settings: Settings, route: dict[str, str]) -> int:
    """How many rows ``input_path`` has; with a bad one, every bad line and exit 2 before
    anything is submitted."""
    count, bad = check_input(input_path, settings, route)
    if bad:
        for line in bad:
            click.echo(f"{input_path}: {line}", err=True)
        click.echo(f"{len(bad)} bad line(s); nothing was submitted", err=True)
        sys.exit(2)
    return count


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
