"""The routing policy: where a submit goes, and where the work of a provider out of
rotation goes.

* A submit goes to the first provider (in the configured order) that takes its method and
  is in rotation (:func:`route`), unless its site's acceptance of that provider's tokens
  sends it elsewhere (a :class:`Pick`, see :mod:`captcha_tasks.core.acceptance`).  With
  ``CAPTCHAAI_OVERFLOW_AFTER`` set, the overflow providers take it when the wait for the
  home provider's threads would be longer (:func:`tries`).
* The circuits a process reads are up to a moment old.  A provider that went out of
  rotation since turns the submit away at its admission (``down``), and before saying that
  no provider takes a submit the circuits are read afresh: both are :class:`Reread`.
* The captchas at a provider that stopped answering or refuses its key are submitted again
  elsewhere while another provider is in rotation (:func:`work_lost_at`,
  :func:`on_provider_down`); the parked and deferred submits of any provider out of
  rotation go to the others (:func:`evacuations`).

The worker asks, admits and records (:mod:`captcha_tasks.worker.admitting`); Redis keeps
the circuits (:mod:`captcha_tasks.state.circuits`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import errors
from .acceptance import Acceptance, AcceptancePolicy, Reason, choose
from .decisions import Fail, Policy, Resubmit, SubmitAt, timed_out
from .dialects import describe, variant_of
from .health import Circuit
from .job import Job
from .providers import ProviderSpec

#: The admission answers that send a submit on to its next try (see :func:`tries`).
FULL = frozenset({"full"})
FULL_OR_DOWN = frozenset({"full", "down"})


@dataclass(frozen=True)
class Destination:
    """Where a submit goes: admitted at ``home`` (and parked there while its threads are
    busy); the ``overflow`` providers are asked first when the wait at home would pass
    ``CAPTCHAAI_OVERFLOW_AFTER``."""

    home: str
    overflow: tuple[str, ...] = ()
    #: Why it goes to ``home`` (see :data:`~captcha_tasks.core.acceptance.REASONS`).
    why: Reason = "order"


@dataclass(frozen=True)
class Pick:
    """What the submit's site said of each provider's tokens (decayed to now), a draw
    uniform in [0, 1) for the exploring share, and the router's settings."""

    acceptance: Mapping[str, Acceptance]
    draw: float
    policy: AcceptancePolicy


@dataclass(frozen=True)
class Reread:
    """The circuits as read may be out of date: read them afresh, and route again."""


@dataclass(frozen=True)
class Try:
    """One admission to ask for: at ``provider``, where at most ``park_limit`` submits may
    be parked before this one is turned away (None: no limit).  The submit goes on to its
    next try when the admission answers one of ``passes``."""

    provider: str
    park_limit: int | None = None
    passes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Evacuate:
    """A provider out of rotation: its parked and deferred submits go to the others, and
    so do the captchas it holds when ``captchas`` (see :func:`work_lost_at`)."""

    provider: str
    captchas: bool


def route(
    job: Job,
    providers: Sequence[ProviderSpec],
    circuits: Mapping[str, Circuit],
    now: float,
    fresh: bool = True,
    pick: Pick | None = None,
) -> Destination | Reread | SubmitAt | Fail:
    """The provider a submit goes to: the first (in the configured order) that takes its
    method and is in rotation, an ``overflow`` one only when no other is; with a ``pick``,
    the one its site's acceptance chooses among those.  With none in
    rotation: read the ``circuits`` afresh first unless they are ``fresh``; then wait for
    the first probe when one may come back (it stopped answering), or fail at once when
    every one is empty or refuses its key (``ERROR_ZERO_BALANCE``)."""
    method, variant = job.request.method, variant_of(job.request)
    proxied = "proxy" in job.secrets or bool(job.request.params.get("proxy"))
    taking = [p for p in providers if p.supports(method, proxied, variant)]
    if not taking:
        return Fail(errors.ValidationError(_none_takes(providers, method, variant, proxied)))
    up = [p for p in taking if _up(circuits, p.name)]
    why: Reason
    homes = [p for p in up if p.role != "overflow"] or up
    if homes:
        home, why = homes[0].name, "order"
        if pick is not None:
            chosen = choose(
                homes, method, pick.acceptance, pick.draw, pick.policy, proxied, variant
            )
            home, why = chosen.provider, chosen.reason
        spill = tuple(p.name for p in up if p.role == "overflow" and p.name != home)
        return Destination(home, spill, why)
    if not fresh:
        return Reread()
    return _none_in_rotation(job, [circuits[p.name] for p in taking], now)


def _none_takes(providers: Sequence[ProviderSpec], method: str, variant: str, proxied: bool) -> str:
    """Why no provider takes a submit: each one's ``methods`` leave it out, or its kind
    has no task type for it."""
    why = [f"{p.name} ({_lacks(p, method)})" for p in providers]
    return f"no provider takes {describe(method, variant, proxied)}: " + ", ".join(why)


def _lacks(provider: ProviderSpec, method: str) -> str:
    if provider.methods is not None and method not in provider.methods:
        return "not in its methods"
    return f"{provider.kind} has no task type for it"


def _none_in_rotation(job: Job, down: list[Circuit], now: float) -> SubmitAt | Fail:
    method = job.request.method
    soft = [c for c in down if c.why == "soft"]
    if soft:
        at = max(now, min(c.probe_at or now for c in soft)) + 0.5
        if at >= job.deadline:
            return Fail(timed_out(job, "no provider came back before the solve deadline"))
        error = errors.ProviderDown(f"no provider that takes {method} is in rotation")
        return SubmitAt(at, job, error)
    codes = ", ".join(f"{c.provider}: {c.code}" for c in down)
    first = down[0].code or "ERROR_ZERO_BALANCE"
    hint = f": {errors.HINTS[first]}" if first in errors.HINTS else ""
    message = f"every provider is out of rotation ({codes}){hint}"
    return Fail(errors.from_api_code(first, message=message))


def _up(circuits: Mapping[str, Circuit], name: str) -> bool:
    circuit = circuits.get(name)
    return circuit is None or circuit.up


def overflow(destination: Destination, job: Job, policy: Policy) -> tuple[str, ...]:
    """The overflow providers a submit may spill to: with ``CAPTCHAAI_OVERFLOW_AFTER`` set,
    and never a pool's refill (it waits at home: it is nobody's wait)."""
    if not policy.overflow_after or job.pool is not None:
        return ()
    return destination.overflow


def park_limit(capacity: int, typical_s: float, overflow_after: float) -> int:
    """Submits that may be parked at a provider before the next would wait longer than
    ``overflow_after`` seconds (its threads finish ``capacity`` captchas per ``typical_s``)."""
    return math.floor(capacity * overflow_after / max(typical_s, 0.1))


def tries(home: str, spill: Sequence[str], home_limit: int = 0) -> tuple[Try, ...]:
    """The admissions to ask for, in order, until one answers something but its ``passes``.
    Without overflow providers (``spill``): at home.  With them: at home while the wait
    there is short (at most ``home_limit`` parked ahead, see :func:`park_limit`), then at
    each overflow provider that has a thread free now (none parked there), and last at home
    whatever the wait."""
    if not spill:
        return (Try(home),)
    first = Try(home, home_limit, FULL)
    return (first, *(Try(name, 0, FULL_OR_DOWN) for name in spill), Try(home))


def leaving(job: Job, provider: str) -> str | None:
    """The provider a job admitted at ``provider`` leaves (what it held there, a slot or a
    parked or deferred entry, is let go), or None."""
    if job.provider is None or job.provider == provider:
        return None
    return job.provider


def after_admission(status: str, routed: int, providers: int) -> Reread | Fail | None:
    """A submit routed ``routed`` times was admitted with ``status``: it stands (None), or
    its provider went out of rotation since the circuits were read (``down``): route it
    again (:class:`Reread`), unless every one of the ``providers`` and one more turned it
    away so (each went out of rotation while it was routed)."""
    if status != "down":
        return None
    if routed > providers:
        return Fail(errors.ProviderDown("every provider went out of rotation"))
    return Reread()


def work_lost_at(provider: str, circuits: Mapping[str, Circuit]) -> bool:
    """Whether the captchas at ``provider`` go elsewhere: it is out of rotation because it
    stopped answering or refuses the key (an empty balance still solves the captchas it
    took), and another provider is in rotation (with none, they are polled as before:
    paying again gains nothing)."""
    circuit = circuits.get(provider)
    if circuit is None or circuit.up or circuit.why == "balance":
        return False
    return any(c.up for name, c in circuits.items() if name != provider)


def evacuations(circuits: Mapping[str, Circuit]) -> list[Evacuate]:
    """The providers whose work goes to the others: every one out of rotation while
    another is in rotation (with none in rotation, nothing moves)."""
    if not any(c.up for c in circuits.values()):
        return []
    return [
        Evacuate(name, captchas=circuit.why != "balance")
        for name, circuit in circuits.items()
        if not circuit.up
    ]


def on_provider_down(job: Job, now: float) -> Resubmit | Fail:
    """The job's captcha is at a provider that went out of rotation: submit a new one
    elsewhere (not counted against the resubmit budget)."""
    if now >= job.deadline:
        return Fail(timed_out(job, "the solve deadline passed"))
    error = errors.ProviderDown(
        f"provider {job.provider} is out of rotation", captcha_id=job.captcha_id
    )
    return Resubmit(job.moved(), error)
