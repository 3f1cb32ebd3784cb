"""``captcha-tasks providers``: every provider's circuit, threads, balance and last error;
with ``--sites``, the busiest sites' acceptance of each provider's tokens and where each is
routed now."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ..core.health import Circuit
from ..errors import CaptchaTasksError
from ..state import ProviderState
from ..state.acceptance import SiteView
from ..worker.app import app


@click.command()
@click.option("--check", is_flag=True, help="Ask every provider for its balance now.")
@click.option(
    "--reset",
    "reset",
    multiple=True,
    metavar="NAME",
    help="Put provider NAME back in rotation now (after fixing what took it out).",
)
@click.option(
    "--sites",
    "sites",
    type=int,
    default=None,
    is_flag=False,
    flag_value=20,
    metavar="[N]",
    help="Show the N (20) most reported sites: each provider's acceptance there, the"
    " reports it rests on, and where the site is routed now and why.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per provider.")
def providers(check: bool, reset: tuple[str, ...], as_json: bool, sites: int | None) -> None:
    """Show each provider's circuit, threads in use, balance and last error."""
    runtime = app.runtime()
    state = runtime.state
    if sites is not None:
        _sites(state.acceptance.sites(max(1, sites)), list(state.providers), as_json)
        return
    unknown = [name for name in reset if name not in state.providers]
    if unknown:
        known = ", ".join(state.providers)
        raise click.BadParameter(
            f"no provider {unknown[0]!r} (known: {known})", param_hint="--reset"
        )
    if reset:
        state.circuits.reset(*reset)
    if check:
        for name in state.providers:
            _check(runtime, name)
    circuits = state.circuits.read()
    rows = [_row(at, circuits[name]) for name, at in state.providers.items()]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    for row in rows:
        click.echo(_line(row))


def _check(runtime: Any, name: str) -> None:
    try:
        balance = runtime.api(name).balance()
    except CaptchaTasksError as exc:
        click.echo(f"{name}: balance check failed: {exc.code}", err=True)
        return
    runtime.state.circuits.saw_balance(name, balance)


def _row(at: ProviderState, circuit: Circuit) -> dict[str, Any]:
    limiter = at.limiter
    return {
        **at.spec.describe(),
        "circuit": circuit.state,
        "why": circuit.why,
        "code": circuit.code,
        "since": circuit.opened_at if circuit.open else circuit.closed_at,
        "next_probe": circuit.probe_at if circuit.open else None,
        "threads_in_use": limiter.in_use(),
        "capacity": limiter.config.capacity,
        "parked": limiter.parked_count(),
        "deferred": limiter.deferred_count(),
        "in_flight": at.board.in_flight_count(),
        "balance": circuit.balance,
        "balance_at": circuit.balance_at,
        "last_error": circuit.last_error,
        "last_error_at": circuit.last_error_at,
    }


def _ago(at: float | None) -> str:
    if at is None:
        return "never"
    return f"{max(0.0, time.time() - at):.0f} s ago"


def _line(row: dict[str, Any]) -> str:
    circuit = row["circuit"]
    if circuit == "open":
        circuit = f"OPEN ({row['code']}, {_ago(row['since'])})"
    balance = (
        "unknown" if row["balance"] is None else f"{row['balance']:g} ({_ago(row['balance_at'])})"
    )
    error = (
        "none"
        if row["last_error"] is None
        else f"{row['last_error']} ({_ago(row['last_error_at'])})"
    )
    return (
        f"{row['name']} [{row['role']}, {row['kind']}] circuit {circuit}; threads"
        f" {row['threads_in_use']}/{row['capacity']} in use, {row['parked']} parked,"
        f" {row['deferred']} deferred, {row['in_flight']} at the provider; balance {balance};"
        f" last error {error}"
    )


def _sites(found: list[tuple[str, str, SiteView]], order: list[str], as_json: bool) -> None:
    for method, site, view in found:
        row = _site_row(method, site, view, order)
        click.echo(json.dumps(row) if as_json else _site_line(row))


def _site_row(method: str, site: str, view: SiteView, order: list[str]) -> dict[str, Any]:
    # in the configured order; a provider no longer configured last
    rank = {name: i for i, name in enumerate(order)}
    said = sorted(view.acceptance.items(), key=lambda kv: rank.get(kv[0], len(order)))
    return {
        "site": site,
        "method": method,
        "providers": {
            name: {
                "acceptance": counted.measure,
                "lower_bound": round(counted.lower_bound(), 3),
                "reports": round(counted.reports, 1),
                "measure": "score" if counted.scores > 0 else "accepted",
            }
            for name, counted in said
        },
        "route": view.route,
        "why": view.why or "order",
    }


def _site_line(row: dict[str, Any]) -> str:
    said = ", ".join(
        f"{name} {_share(at['acceptance'], at['measure'])} of {at['reports']:g} reports"
        for name, at in row["providers"].items()
    )
    route = row["route"] or "the configured order"
    return f"{row['site']} [{row['method']}]: {said}; routed to {route} ({row['why']})"


def _share(measure: float | None, kind: str) -> str:
    if measure is None:
        return "unknown"
    return f"score {measure:.2f}" if kind == "score" else f"{measure:.0%} accepted"
