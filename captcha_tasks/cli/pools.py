"""``captcha-tasks pool status``, ``pool declare`` and ``pool take``: token pools."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..core.poolspec import parse_pools
from ..errors import PoolNotFound
from ..worker.app import app
from ..worker.tasks import take_token


@click.group()
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
        f"{'pool':<20} {'size':>5} {'target':>6} {'live':>5} {'refills':>7} "
        f"{'takes/s':>7} {'hit rate':>8} {'waste':>6}"
    )
    for row in rows:
        click.echo(
            f"{row['name']:<20} {row['size']:>5} {row['target']:>6} {row['live']:>5} "
            f"{row['inflight']:>7} {row['take_rate']:>7.2f} {_pct(row['hit_rate']):>8} "
            f"{_pct(row['waste']):>6}"
        )
    if any(row["taken"] + row["misses"] for row in rows):
        click.echo(DEMAND_AWARE)


#: Why a pool's target may be below its size: said under the table once any pool was used.
DEMAND_AWARE = (
    "target: a pool is filled to its size until its first take; from then on it keeps the "
    "tokens its measured demand needs (takes/s x (solve time + margin)), at least 1 and at "
    "most its size, so unused tokens do not expire. Demand rising raises it again."
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

    if path is None:
        specs = app.runtime().settings.pools.declared
        where = "CAPTCHAAI_POOLS"
    else:
        specs = parse_pools(path.read_text(encoding="utf-8"), source=str(path))
        where = str(path)
    if not specs:
        raise click.UsageError(f"{where} declares no pools (pass --file, or set CAPTCHAAI_POOLS)")
    pools = app.runtime().state.pools
    for spec in specs:
        pools.register(spec)
        click.echo(f"pool {spec.name}: {spec.method}, size {spec.size}, ttl {spec.ttl:g}s")
    click.echo(f"{len(specs)} pool(s) from {where} registered; beat keeps them filled")


@pool.command("take")
@click.argument("name")
@click.option(
    "--min-remaining",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds of life the token must have left (default: the pool's min_remaining).",
)
def pool_take(name: str, min_remaining: float | None) -> None:
    """Take one token from pool NAME and print it as JSON; exit 1 when the pool is empty."""

    try:
        taken = take_token(name, min_remaining)
    except PoolNotFound as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    if taken is None:
        click.echo(
            f"pool {name} is empty: no token with enough life left (beat refills it)", err=True
        )
        sys.exit(1)
    click.echo(json.dumps(taken))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
