"""``captcha-tasks tenants``: each tenant's share, threads, parked work and budget."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import click

from ..core.lanes import LANES
from ..settings import Settings
from ..state import State
from ..worker.app import app


@dataclass
class TenantStatus:
    """One tenant as ``captcha-tasks tenants`` shows it."""

    name: str
    declared: bool
    weight: float
    max_threads: int | None
    daily_captchas: int | None
    #: Slots held and submits parked, by lane.
    in_flight: dict[str, int] = field(default_factory=dict)
    parked: dict[str, int] = field(default_factory=dict)
    solved: int = 0
    failed: int = 0
    #: Captchas submitted since 00:00 UTC.
    submitted_today: int = 0

    @property
    def budget_left(self) -> int | None:
        if self.daily_captchas is None:
            return None
        return max(0, self.daily_captchas - self.submitted_today)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "budget_left": self.budget_left}


def statuses(settings: Settings, state: State) -> list[TenantStatus]:
    """Every tenant declared (``default`` among them) or seen in Redis, sorted by name."""
    lanes = state.lanes()
    outcomes = state.stats.lane_outcomes()
    names = {*settings.tenants.names, *(t for _, t in lanes), *(t for _, _, t in outcomes)}
    today = state.budgets.submitted_today(sorted(names))
    found = []
    for name in sorted(names):
        tenant = settings.tenants.get(name)
        row = TenantStatus(
            name,
            name in settings.tenants.names,
            tenant.weight,
            tenant.max_threads,
            tenant.daily_captchas,
            submitted_today=today[name],
        )
        for lane in LANES:
            use = lanes.get((lane, name))
            row.in_flight[lane] = use.held if use else 0
            row.parked[lane] = use.parked if use else 0
        row.solved = sum(n for (end, _, t), n in outcomes.items() if t == name and end == "solved")
        row.failed = sum(n for (end, _, t), n in outcomes.items() if t == name and end == "failed")
        found.append(row)
    return found


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def tenants(as_json: bool) -> None:
    """Per tenant: weight, cap, threads in flight and submits parked by lane, budget left."""

    runtime = app.runtime()
    rows = statuses(runtime.settings, runtime.state)
    if as_json:
        click.echo(json.dumps([row.to_dict() for row in rows], indent=2))
        return
    lanes = "/".join(lane[:3] for lane in LANES)
    click.echo(
        f"{'tenant':<16} {'weight':>6} {'cap':>5} {'in flight ' + lanes:>21} "
        f"{'parked ' + lanes:>18} {'solved':>7} {'failed':>7} {'today':>7} {'budget':>7} "
        f"{'left':>7}"
    )
    for row in rows:
        name = row.name if row.declared else f"{row.name}*"
        click.echo(
            f"{name:<16} {row.weight:>6g} {_or_dash(row.max_threads):>5} "
            f"{_per_lane(row.in_flight):>21} {_per_lane(row.parked):>18} {row.solved:>7} "
            f"{row.failed:>7} {row.submitted_today:>7} {_or_dash(row.daily_captchas):>7} "
            f"{_or_dash(row.budget_left):>7}"
        )
    if any(not row.declared for row in rows):
        click.echo("* not declared in this shell's CAPTCHAAI_TENANTS (weight 1, no cap, no budget)")
    click.echo("today: captchas submitted since 00:00 UTC, when budgets reset")


def _per_lane(counts: dict[str, int]) -> str:
    return "/".join(str(counts[lane]) for lane in LANES)


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
