"""Prometheus metrics, read from Redis on every scrape.

    captcha-tasks metrics --host 0.0.0.0 --port 9808        # GET /metrics

Every figure lives in Redis (the limiter's slots, the pools, the counters the workers
keep), so one exporter process serves the whole deployment and needs no worker to be
alive.  The collector is registered on a registry of its own, never on prometheus-client's
global one: Flower serves that one on its own (unauthenticated) ``/metrics``.

With Redis unreachable the endpoint answers ``503`` with the reason, so the scrape fails
visibly instead of reporting zeros.

Exposed (``captcha_tasks_`` prefix):

* ``threads_in_use``, ``threads_plan``, ``threads_capacity``,
  ``thread_utilisation_ratio``, ``parked_submits``, ``threads_external`` (threads the
  provider counts working beyond ours: another client of the key)
* per pool: ``pool_live_tokens``, ``pool_size``, ``pool_target_tokens``,
  ``pool_refills_in_flight``, ``pool_hit_ratio``, ``pool_waste_ratio``,
  ``pool_takes_per_second``, and the counters ``pool_tokens_added_total``,
  ``pool_tokens_taken_total``, ``pool_tokens_expired_total``, ``pool_misses_total``
* ``api_errors_total{code,provider}``, ``solved_total{method,source,provider}`` (source:
  ``pingback``, ``bulk_poll``, ``poll``, ``pool`` or ``submit``: answered inside the
  submit), ``provider_cost_total{provider,tenant}`` (what answers cost, where the provider
  says: the JSON family's ``cost``), ``resubmits_total{reason}`` (new
  captchas for solves whose captcha failed: ``unsolvable``, ``expired``, ``bad_proxy``,
  ``provider_down``)
* per provider: ``provider_up``, ``provider_circuit_state{state}`` (1 for the state it is
  in: ``closed`` or ``open``), ``provider_balance`` (as last read), ``provider_threads_in_use``,
  ``provider_threads_capacity``, ``provider_parked_submits``, ``provider_deferred_submits``,
  ``provider_captchas_in_flight``, ``budget_waits_total{budget}`` (submits deferred by a
  request budget, not by threads: ``submit_rate``, ``no_slot``, ``pause``)
* ``acceptance_reports_total{provider,method,verdict}`` (tokens the app reported the site
  accepted, ``good``, or rejected, ``bad``), ``acceptance_ratio{provider,method}`` (the
  share accepted) and ``reroutes_total{reason}`` (submits the sites' acceptance sent
  elsewhere than the order's first provider: ``acceptance``, ``untried``, ``explore``)
* ``solve_seconds{method,provider}``: a gauge histogram of the recent solve times per method
  (the samples the adaptive first poll keeps), for ``histogram_quantile``
* ``redis_master_changes_total``: Redis masters that took over (a failover, or a restart
  that lost the master's identity), counted once each by housekeeping;
  ``redis_reconnects_total{process}``: connections to the master opened again (behind
  Sentinel), added up per kind of process (worker, beat, exporter, receiver, kafka, app)
* ``pingback_accepted_total``, ``pingback_rejected_total{reason}``: provider callbacks;
  ``pingback_early_total``: callbacks kept because they came before their captcha was
  registered
* per provider, the callback channel: ``pingback_channel{provider,state}`` (1 for its
  state: ``up``, ``degraded`` or ``down``), ``pingback_callback_share{provider}`` (the
  recent share of answers that came by callback), ``pingback_callbacks_overdue_total``
  (answers a poll found after their captcha's callback was due) and
  ``pingback_answer_late_seconds`` (a histogram of how long each answer of a captcha that
  asked for a callback waited at the provider before we had it: 0 for a callback)
* by lane and tenant: ``lane_in_flight``, ``lane_parked`` (threads held, submits parked),
  the counters ``lane_solved_total``, ``lane_failed_total``, and ``wait_seconds``: a
  histogram of the time from a solve's request to its thread
* per tenant: ``tenant_weight``, ``tenant_max_threads``, ``tenant_submitted_today``
  (captchas since 00:00 UTC) against ``tenant_daily_budget`` and
  ``tenant_budget_used_ratio`` (tenants with a budget)
* the gateway (``captcha-tasks gateway``): ``gateway_requests_total`` and
  ``gateway_errors_total{code}`` by ``tenant``, ``protocol`` (``2captcha``, ``json``) and
  ``endpoint``, and ``gateway_request_seconds``: a histogram of the time an answer took
* ``queue_messages{queue,priority}``: messages waiting in each Celery queue of the
  deployment, and in each of its priority sub-lists (kombu keeps a message sent with a
  priority in ``<queue>\x06\x16<priority>``; without one, in the queue itself)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import click
import redis
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .core.channel import STATES
from .core.lanes import LANES
from .errors import PoolNotFound, StoreUnavailable
from .methods import METHODS
from .settings import Settings, get_settings
from .state import State
from .state.gateway import LATENCY_BUCKETS
from .state.limiter import WAIT_BUCKETS_S, LaneUse
from .worker.celery_compat.transport import priority_lists
from .worker.redact import configure_logging

log = logging.getLogger(__name__)

PREFIX = "captcha_tasks"
DEFAULT_PORT = 9808
#: Upper bounds (s) of the solve-time buckets: image captchas take seconds, tokens tens.
SOLVE_TIME_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0)
#: Reasons of ``resubmits_total`` and budgets of ``budget_waits_total``, shown from 0.
RESUBMIT_REASONS = ("unsolvable", "expired", "bad_proxy", "provider_down")
BUDGETS = ("submit_rate", "no_slot", "pause")
REROUTE_REASONS = ("acceptance", "untried", "explore")
#: Errors that mean "Redis is not answering", not "the exporter is broken".
UNAVAILABLE = (StoreUnavailable, redis.RedisError, OSError)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_POOL_GAUGES = (
    ("live", "pool_live_tokens", "Usable tokens in the pool now (expired ones excluded)."),
    ("size", "pool_size", "The pool's configured maximum size."),
    ("target", "pool_target_tokens", "Tokens the pool is being kept at (measured demand)."),
    ("inflight", "pool_refills_in_flight", "Refill solves in flight for the pool."),
    ("hit_rate", "pool_hit_ratio", "Takes served from the pool / all takes."),
    ("waste", "pool_waste_ratio", "Tokens that expired unused / tokens added."),
    ("take_rate", "pool_takes_per_second", "Recent takes (hits and misses) per second."),
)
_POOL_COUNTERS = (
    ("added", "pool_tokens_added", "Tokens added to the pool."),
    ("taken", "pool_tokens_taken", "Tokens taken from the pool (hits)."),
    ("expired", "pool_tokens_expired", "Tokens dropped from the pool unused, expired."),
    ("misses", "pool_misses", "Takes that found the pool empty."),
)


def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


#: The gauges of each provider: key → (metric name, help, labels).
_PROVIDER_GAUGES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "up": ("provider_up", "1 while the provider is in rotation.", ("provider",)),
    "state": (
        "provider_circuit_state",
        "1 for the state the provider's circuit is in (closed: in rotation).",
        ("provider", "state"),
    ),
    "balance": (
        "provider_balance",
        "The provider's balance, as last read (probes, periodic checks).",
        ("provider",),
    ),
    "in_use": ("provider_threads_in_use", "Threads held at the provider.", ("provider",)),
    "capacity": (
        "provider_threads_capacity",
        "Threads this deployment may use at the provider.",
        ("provider",),
    ),
    "parked": (
        "provider_parked_submits",
        "Submits waiting for one of the provider's threads.",
        ("provider",),
    ),
    "deferred": (
        "provider_deferred_submits",
        "Submits waiting for the provider's request budget or a back-off.",
        ("provider",),
    ),
    "in_flight": (
        "provider_captchas_in_flight",
        "Captchas at the provider (submitted, not answered yet).",
        ("provider",),
    ),
}


class StoreCollector(Collector):
    """Reads the deployment's state from Redis each time Prometheus scrapes."""

    def __init__(self, settings: Settings, state: State) -> None:
        self.settings = settings
        self.state = state

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> StoreCollector:
        """The collector of ``settings`` (default: the package app's, ``app.settings()``
        at this call: those ``app.use`` gave, else the environment's)."""
        if settings is None:
            from .worker.app import app

            settings = app.settings()
        return cls(settings, State.build(settings))

    def collect(self) -> Iterator[Metric]:
        """Every metric; raises (a Redis error) when Redis does not answer."""
        yield from self._threads()
        yield from self._pools()
        yield from self._api_errors()
        yield from self._solves()
        yield from self._acceptance()
        yield from self._costs()
        yield from self._callbacks()
        yield from self._channel()
        yield from self._providers()
        yield from self._master_changes()
        yield from self._lanes()
        yield from self._tenants()
        yield from self._gateway()
        yield from self._queues()

    def describe(self) -> Iterable[Metric]:
        # Nothing up front: registering must not need Redis (metrics are read per scrape).
        return []

    def _threads(self) -> Iterator[Metric]:
        settings = self.settings
        limiter = self.state.limiter
        in_use = limiter.in_use()
        yield _gauge("threads_in_use", "Provider threads held by captchas in flight.", in_use)
        yield _gauge(
            "threads_plan",
            "Concurrent threads of the plan (CAPTCHAAI_THREADS).",
            settings.providers.threads,
        )
        yield _gauge(
            "threads_capacity",
            "Threads this deployment may use (plan minus CAPTCHAAI_THREADS_RESERVED).",
            settings.providers.capacity,
        )
        yield _gauge(
            "thread_utilisation_ratio",
            "Threads in use / threads this deployment may use.",
            in_use / settings.providers.capacity,
        )
        yield _gauge(
            "threads_external",
            "Provider threads another client of the API key holds (left to it).",
            limiter.external(),
        )
        yield _gauge(
            "parked_submits",
            "Submits waiting in Redis for a free thread.",
            limiter.parked_count(),
        )

    def _pools(self) -> Iterator[Metric]:
        statuses = _pool_statuses(self.state)
        for field, suffix, doc in _POOL_GAUGES:
            family = GaugeMetricFamily(_name(suffix), doc, labels=["pool"])
            for status in statuses:
                if status[field] is not None:  # a ratio is undefined before any take / add
                    family.add_metric([status["name"]], float(status[field]))
            yield family
        for field, suffix, doc in _POOL_COUNTERS:
            counter = CounterMetricFamily(_name(suffix), doc, labels=["pool"])
            for status in statuses:
                counter.add_metric([status["name"]], float(status[field]))
            yield counter

    def _api_errors(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            _name("api_errors"),
            "Error answers and failures by code and provider.",
            labels=["code", "provider"],
        )
        for name, at in self.state.providers.items():
            for code, count in sorted(at.stats.api_errors().items()):
                family.add_metric([code, name], float(count))
        yield family
        resubmits = CounterMetricFamily(
            _name("resubmits"),
            "New captchas submitted for solves whose captcha failed, by reason.",
            labels=["reason"],
        )
        counts = {reason: 0 for reason in RESUBMIT_REASONS}
        counts.update(self.state.stats.resubmits())
        for reason, count in sorted(counts.items()):
            resubmits.add_metric([reason], float(count))
        yield resubmits

    def _solves(self) -> Iterator[Metric]:
        solved = CounterMetricFamily(
            _name("solved"),
            "Captchas solved, by method, source (pingback / bulk_poll / poll / pool / submit)"
            " and provider.",
            labels=["method", "source", "provider"],
        )
        times = GaugeHistogramMetricFamily(
            _name("solve_seconds"),
            "Recent solve times (submit to answer seen) per method and provider; a sliding window.",
            labels=["method", "provider"],
        )
        for name, at in self.state.providers.items():
            for method in sorted(METHODS):
                for source, count in sorted(at.stats.solved(method).items()):
                    solved.add_metric([method, source, name], float(count))
                samples = at.solve_times.samples(method)
                if samples:
                    times.add_metric([method, name], _buckets(samples), sum(samples))
        yield solved
        yield times

    def _acceptance(self) -> Iterator[Metric]:
        reports = CounterMetricFamily(
            _name("acceptance_reports"),
            "Tokens reported by the app as accepted (verdict good) or rejected (bad) by the"
            " site, by the provider that solved them and method.",
            labels=["provider", "method", "verdict"],
        )
        ratio = GaugeMetricFamily(
            _name("acceptance_ratio"),
            "Share of the reported tokens the sites accepted, by provider and method.",
            labels=["provider", "method"],
        )
        counted = self.state.acceptance.reports()
        for (provider, method, accepted), count in sorted(counted.items()):
            reports.add_metric([provider, method, "good" if accepted else "bad"], float(count))
        for provider, method in sorted({(p, m) for p, m, _ in counted}):
            good = counted.get((provider, method, True), 0)
            bad = counted.get((provider, method, False), 0)
            ratio.add_metric([provider, method], good / (good + bad))
        reroutes = CounterMetricFamily(
            _name("reroutes"),
            "Submits sent elsewhere than the configured order's first provider by the sites'"
            " acceptance, by reason (acceptance, untried, explore).",
            labels=["reason"],
        )
        by_reason = dict.fromkeys(REROUTE_REASONS, 0) | self.state.acceptance.reroutes()
        for reason, count in sorted(by_reason.items()):
            reroutes.add_metric([reason], float(count))
        yield from (reports, ratio, reroutes)

    def _costs(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            _name("provider_cost"),
            "What answers cost, as the provider said (the JSON family's cost), by tenant.",
            labels=["provider", "tenant"],
        )
        for name, at in self.state.providers.items():
            for tenant, cost in sorted(at.stats.costs().items()):
                family.add_metric([name, tenant], cost)
        yield family

    def _callbacks(self) -> Iterator[Metric]:
        counts = self.state.stats.callback_counts()
        yield CounterMetricFamily(
            _name("pingback_accepted"),
            "Provider callbacks that completed their captcha.",
            value=float(counts.pop("accepted", 0)),
        )
        yield CounterMetricFamily(
            _name("pingback_early"),
            "Provider callbacks that came before their captcha was registered (kept).",
            value=float(counts.pop("early", 0)),
        )
        rejected = CounterMetricFamily(
            _name("pingback_rejected"), "Provider callbacks refused, by reason.", labels=["reason"]
        )
        for reason, count in sorted(counts.items()):
            rejected.add_metric([reason], float(count))
        yield rejected

    def _channel(self) -> Iterator[Metric]:
        states = GaugeMetricFamily(
            _name("pingback_channel"),
            "A provider's callback channel: 1 for the state it is in (up, degraded, down).",
            labels=["provider", "state"],
        )
        share = GaugeMetricFamily(
            _name("pingback_callback_share"),
            "Recent share of answers (of captchas that asked for one) that came by callback.",
            labels=["provider"],
        )
        overdue = CounterMetricFamily(
            _name("pingback_callbacks_overdue"),
            "Answers a poll found after their captcha's callback was due.",
            labels=["provider"],
        )
        late = HistogramMetricFamily(
            _name("pingback_answer_late_seconds"),
            "How long answers of captchas that asked for a callback waited at the provider"
            " before we had them (0: a callback).",
            labels=["provider"],
        )
        for name, at in self.state.providers.items():
            now = at.channel.read()
            for state in STATES:
                states.add_metric([name, state], 1.0 if state == now.state else 0.0)
            share.add_metric([name], now.share)
            lateness = at.channel.lateness()
            overdue.add_metric([name], float(lateness.overdue))
            buckets = [(_le(bound), float(count)) for bound, count in lateness.buckets]
            late.add_metric([name], buckets, lateness.sum_s)
        yield from (states, share, overdue, late)

    def _providers(self) -> Iterator[Metric]:
        circuits = self.state.circuits.read()
        families = {
            key: GaugeMetricFamily(_name(name), doc, labels=list(labels))
            for key, (name, doc, labels) in _PROVIDER_GAUGES.items()
        }
        waits = CounterMetricFamily(
            _name("budget_waits"),
            "Submits deferred by a request budget of the provider (not by its threads).",
            labels=["provider", "budget"],
        )
        for name, at in self.state.providers.items():
            circuit = circuits[name]
            families["up"].add_metric([name], float(circuit.up))
            for state in ("closed", "open"):
                families["state"].add_metric([name, state], float(circuit.state == state))
            if circuit.balance is not None:
                families["balance"].add_metric([name], circuit.balance)
            limiter = at.limiter
            families["in_use"].add_metric([name], float(limiter.in_use()))
            families["capacity"].add_metric([name], float(limiter.config.capacity))
            families["parked"].add_metric([name], float(limiter.parked_count()))
            families["deferred"].add_metric([name], float(limiter.deferred_count()))
            families["in_flight"].add_metric([name], float(at.board.in_flight_count()))
            counts = {budget: 0 for budget in BUDGETS}
            counts.update(limiter.budget_waits())
            for budget, count in sorted(counts.items()):
                waits.add_metric([name, budget], float(count))
        yield from families.values()
        yield waits

    def _master_changes(self) -> Iterator[Metric]:
        master_changes = self.state.master_changes
        master_changes.report("exporter")
        counts = master_changes.counts()
        yield CounterMetricFamily(
            _name("redis_master_changes"),
            "Redis masters that took over (failover, or restart) as housekeeping saw them.",
            value=float(counts.pop("master_changes", 0)),
        )
        reconnects = CounterMetricFamily(
            _name("redis_reconnects"),
            "Connections to the Redis master opened again, by kind of process.",
            labels=["process"],
        )
        for field, count in sorted(counts.items()):
            if field.startswith("reconnects:"):
                reconnects.add_metric([field.split(":", 1)[1]], float(count))
        yield reconnects

    def _lanes(self) -> Iterator[Metric]:
        state = self.state
        use = state.lanes()
        labels = ["lane", "tenant"]
        held = GaugeMetricFamily(
            _name("lane_in_flight"), "Threads held, by lane and tenant.", labels=labels
        )
        parked = GaugeMetricFamily(
            _name("lane_parked"), "Submits parked for a thread, by lane and tenant.", labels=labels
        )
        # Every lane of every tenant known, zero or not: a panel's series do not come and go.
        for tenant in self._tenant_names(use):
            for lane in LANES:
                counts = use.get((lane, tenant), LaneUse())
                held.add_metric([lane, tenant], float(counts.held))
                parked.add_metric([lane, tenant], float(counts.parked))
        yield held
        yield parked
        outcomes = state.stats.lane_outcomes()
        for ending in ("solved", "failed"):
            doc = f"Solves that ended {ending}, by lane and tenant."
            counter = CounterMetricFamily(_name(f"lane_{ending}"), doc, labels=labels)
            for (end, lane, tenant), count in sorted(outcomes.items()):
                if end == ending:
                    counter.add_metric([lane, tenant], float(count))
            yield counter
        waits = HistogramMetricFamily(
            _name("wait_seconds"),
            "Time from a solve's request to its thread, by lane and tenant.",
            labels=labels,
        )
        for (lane, tenant), times in state.wait_times().items():
            waits.add_metric([lane, tenant], _cumulative(times.buckets), times.sum_s)
        yield waits

    def _tenant_names(self, use: dict[tuple[str, str], LaneUse]) -> list[str]:
        """The tenants declared here and those Redis has counts of (another process may
        declare more)."""
        return sorted({*self.settings.tenants.names, *(tenant for _, tenant in use)})

    def _tenants(self) -> Iterator[Metric]:
        settings = self.settings
        names = self._tenant_names(self.state.lanes())
        today = self.state.budgets.submitted_today(names)
        label = ["tenant"]
        weight = GaugeMetricFamily(
            _name("tenant_weight"), "The tenant's weight (CAPTCHAAI_TENANTS).", labels=label
        )
        cap = GaugeMetricFamily(
            _name("tenant_max_threads"), "Threads the tenant may hold at most.", labels=label
        )
        submitted = GaugeMetricFamily(
            _name("tenant_submitted_today"),
            "Captchas the tenant submitted since 00:00 UTC (when budgets reset).",
            labels=label,
        )
        budget = GaugeMetricFamily(
            _name("tenant_daily_budget"), "The tenant's daily_captchas.", labels=label
        )
        used = GaugeMetricFamily(
            _name("tenant_budget_used_ratio"),
            "Captchas submitted today / daily_captchas (1: spent, its solves fail).",
            labels=label,
        )
        for name in names:
            tenant = settings.tenants.get(name)
            weight.add_metric([name], tenant.weight)
            submitted.add_metric([name], float(today[name]))
            if tenant.max_threads is not None:
                cap.add_metric([name], float(tenant.max_threads))
            if tenant.daily_captchas is not None:
                budget.add_metric([name], float(tenant.daily_captchas))
                ratio = today[name] / tenant.daily_captchas if tenant.daily_captchas else 1.0
                used.add_metric([name], min(1.0, ratio))
        yield from (weight, cap, submitted, budget, used)

    def _gateway(self) -> Iterator[Metric]:
        labels = ["tenant", "protocol", "endpoint"]
        requests = CounterMetricFamily(
            _name("gateway_requests"),
            "Requests to the gateway, by tenant (- before a key was known), protocol and endpoint.",
            labels=labels,
        )
        failed = CounterMetricFamily(
            _name("gateway_errors"),
            "Requests the gateway answered with an error, by tenant, protocol, endpoint and code.",
            labels=[*labels, "code"],
        )
        seconds = HistogramMetricFamily(
            _name("gateway_request_seconds"),
            "Time the gateway took to answer a request, by tenant, protocol and endpoint.",
            labels=labels,
        )
        for where, counts in self.state.gateway_stats.read().items():
            requests.add_metric(list(where), float(counts.requests))
            for code, n in sorted(counts.errors.items()):
                failed.add_metric([*where, code], float(n))
            buckets = _cumulative(counts.buckets, LATENCY_BUCKETS)
            seconds.add_metric(list(where), buckets, counts.seconds)
        yield requests
        yield failed
        yield seconds

    def _queues(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            _name("queue_messages"),
            "Messages waiting in a Celery queue (per priority sub-list; priority 0: sent"
            " without one).",
            labels=["queue", "priority"],
        )
        lists = [
            (queue, step, key)
            for queue in self.settings.celery.queues
            for step, key in priority_lists(queue)
        ]
        pipe = self.state.db.pipeline()
        for _, _, key in lists:
            pipe.llen(key)
        for (queue, step, _), size in zip(lists, pipe.execute(), strict=True):
            family.add_metric([queue, str(step)], float(size))
        yield family


def _cumulative(
    buckets: tuple[int, ...], bounds_s: tuple[float, ...] = WAIT_BUCKETS_S
) -> list[tuple[str, float]]:
    """Per-bucket counts of ``bounds_s`` (and one longer) as cumulative ``(le, count)``
    pairs, ``+Inf`` last."""
    out, total = [], 0
    bounds = [*(repr(b) for b in bounds_s), "+Inf"]
    for bound, count in zip(bounds, buckets, strict=True):
        total += count
        out.append((bound, float(total)))
    return out


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def _gauge(suffix: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(_name(suffix), doc, value=float(value))


def _pool_statuses(state: State) -> list[dict[str, Any]]:
    pools = state.pools
    statuses = []
    for spec in pools.all():
        try:
            statuses.append(pools.status(spec.name))
        except PoolNotFound:
            continue  # unregistered between the listing and its status
    return statuses


def _buckets(samples: list[float]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, ``+Inf`` last."""
    bounds = [*SOLVE_TIME_BUCKETS, float("inf")]
    return [(_le(bound), float(sum(s <= bound for s in samples))) for bound in bounds]


# -- HTTP ------------------------------------------------------------------------------


def make_wsgi_app(collector: Collector | None = None) -> WSGIApp:
    """A WSGI app answering ``GET /metrics`` (and ``/``) from ``collector`` (default: a
    :class:`StoreCollector`); ``503`` with the reason while Redis is unreachable."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector or StoreCollector.from_settings())

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            return _reply(start_response, "404 Not Found", "not found: metrics are on /metrics\n")
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        try:
            body = encoder(registry)
        except UNAVAILABLE as exc:
            log.warning("metrics unavailable: %s", _reason(exc))
            return _reply(
                start_response,
                "503 Service Unavailable",
                f"captcha-tasks metrics unavailable: {_reason(exc)}\n",
                [("Retry-After", "5")],
            )
        except Exception:  # a bug must cost one scrape, not the exporter
            log.exception("collecting metrics failed")
            return _reply(start_response, "500 Internal Server Error", "collecting failed\n")
        start_response(
            "200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        )
        return [body]

    return app


def _reason(exc: BaseException) -> str:
    # redis-py's messages name host and port, never the password.
    return f"Redis unreachable ({type(exc).__name__}: {exc})"


def _reply(
    start_response: StartResponse,
    status: str,
    text: str,
    headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    body = text.encode()
    start_response(
        status,
        [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            *(headers or []),
        ],
    )
    return [body]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    # A slow Redis answer must not hold up the next scrape or a health check.
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    # Requests go to the debug log, not stderr (the parameter name is the base class's).
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - " + format, self.address_string(), *args)


def make_metrics_server(
    host: str, port: int, app: WSGIApp | None = None, collector: Collector | None = None
) -> WSGIServer:
    """A bound, not yet serving, threaded HTTP server for ``app`` (port 0: a free one)."""
    return make_server(
        host,
        port,
        app or make_wsgi_app(collector),
        server_class=_ThreadingServer,
        handler_class=_QuietHandler,
    )


def serve(
    port: int = DEFAULT_PORT, host: str = "127.0.0.1", collector: Collector | None = None
) -> None:
    """Serve ``/metrics`` on ``host:port`` until the process is stopped."""
    with make_metrics_server(host, port, collector=collector) as server:
        server.serve_forever()


def serve_in_thread(
    host: str = "127.0.0.1", port: int = 0, collector: Collector | None = None
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` from a daemon thread (e.g. inside a worker or a web app); stop it
    with ``server.shutdown()``."""
    server = make_metrics_server(host, port, collector=collector)
    thread = threading.Thread(
        target=server.serve_forever, name="captcha-tasks-metrics", daemon=True
    )
    thread.start()
    return server, thread


@click.command("metrics")
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Interface (0.0.0.0 in a container)."
)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
def metrics_command(host: str, port: int) -> None:
    """Serve Prometheus metrics read from Redis (GET /metrics)."""
    configure_logging(logging.INFO, get_settings)
    # A bad setting stops the exporter now, not at the first scrape.
    collector = StoreCollector.from_settings(get_settings())
    click.echo(f"captcha-tasks metrics on http://{host}:{port}/metrics")
    serve(port, host, collector)
