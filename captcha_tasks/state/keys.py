"""Every Redis key name captcha-tasks writes, under one configurable prefix.

No other module builds a key string: they all ask a :class:`Keys` instance.  Celery's own
broker and result keys (``celery``, ``celery-task-meta-*``, ``_kombu.*``) are Celery's.

A provider's own state (its thread slots, parked and deferred submits, request budgets,
board of captchas, solve times and counters) lives under keys *scoped* by the provider
(:meth:`Keys.scoped`): ``<prefix>:provider:<name>:...``.  The primary's scope is None: its
keys keep the names of a deployment with one provider.  Every other key (a solve's
record, the submits owed a message, pools, sessions, batches) is the deployment's, the
same under any scope.
"""

from __future__ import annotations

from dataclasses import dataclass

#: String: ms the Lua scripts' clock (``lib/now.lua``) runs ahead of the Redis server's, a
#: literal in that file and outside any prefix.  Test-only: never set in production.
TEST_CLOCK_OFFSET_KEY = "captcha-tasks:test:clock-offset-ms"


@dataclass(frozen=True)
class Keys:
    prefix: str = "captcha"
    #: The provider whose keys the scoped names are (None: the primary).
    scope: str | None = None

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _p(self, *parts: str) -> str:
        """A key of the provider this instance is scoped to."""
        if self.scope is None:
            return self._k(*parts)
        return self._k("provider", self.scope, *parts)

    def scoped(self, provider: str | None) -> Keys:
        """These key names for ``provider``'s own state (None: the primary's)."""
        return Keys(self.prefix, provider)

    # -- providers -------------------------------------------------------------------
    def circuit(self, provider: str) -> str:
        """Hash: a provider's circuit (state, reason, failures, next probe, balance, last
        error)."""
        return self._k("providers", provider, "circuit")

    def acceptance(self, method: str, site: str) -> str:
        """Hash: what the reports said about each provider's tokens for ``method`` at
        ``site`` (``<provider>:good``, ``:bad``, ``:score_sum``, ``:scores``, ``:at`` ms,
        decayed) and where the site is routed now (``route``, ``why``)."""
        return self._k("acceptance", method, site)

    def acceptance_site(self, name: str) -> tuple[str, str]:
        """The method and site of an :meth:`acceptance` hash's ``name``."""
        method, _, site = name.removeprefix(self._k("acceptance", "")).partition(":")
        return method, site

    def acceptance_sites(self) -> str:
        """Sorted set: the :meth:`acceptance` hashes kept, score = reports (the fewest are
        trimmed)."""
        return self._k("acceptance-sites")

    def acceptance_reports(self) -> str:
        """Hash: reports ever counted, ``<provider>|<method>|good`` (or ``|bad``) -> count."""
        return self._k("stats", "acceptance-reports")

    def acceptance_reroutes(self) -> str:
        """Hash: submits sent elsewhere than the configured order's first, by reason."""
        return self._k("stats", "acceptance-reroutes")

    def deferred(self) -> str:
        """Sorted set (scoped): submits holding a slot that wait for a request budget or a
        back-off, score = when they go (ms)."""
        return self._p("limiter", "deferred")

    def prepaid(self) -> str:
        """Set (scoped): deferred submits handed out with their ``in.php`` request counted."""
        return self._p("limiter", "prepaid")

    def budget_waits(self) -> str:
        """Hash (scoped): submits deferred for a budget, by budget; ``warned`` = when the
        last warning was logged."""
        return self._p("stats", "budget-waits")

    def resubmits(self) -> str:
        """Hash: new captchas submitted for solves whose captcha failed, by reason."""
        return self._k("stats", "resubmits")

    # -- core pipeline ---------------------------------------------------------------
    def submission(self, solve_id: str) -> str:
        """Hash: a solve's record: the captcha of its latest attempt (idempotent submit) and
        ``done`` once its outcome is stored (duplicate messages stop there); ``admit`` and
        ``tally`` while a chain of scripts runs (the mark one step leaves for the next)."""
        return self._k("solve", solve_id, "submission")

    def submit_claim(self, solve_id: str) -> str:
        """String with a TTL: one copy of a solve's submit is calling ``in.php`` right now."""
        return self._k("solve", solve_id, "claim")

    def revoked(self, solve_id: str) -> str:
        """String with a TTL: the caller revoked the solve (``AsyncResult.revoke()``)."""
        return self._k("solve", solve_id, "revoked")

    def followup(self, solve_id: str) -> str:
        """String with a TTL: what runs when the solve ends (Celery's callbacks, chain and
        chord part, JSON), until the completion takes it."""
        return self._k("solve", solve_id, "followup")

    def followups_owed(self) -> str:
        """Hash: solve id -> the follow-up of a solve that ended, until it has been run."""
        return self._k("followups", "owed")

    def followups_due(self) -> str:
        """Sorted set: solve id -> when its owed follow-up counts as lost (ms)."""
        return self._k("followups", "due")

    def request_secrets(self, solve_id: str) -> str:
        """Hash with a TTL: a solve's proxy and cookies, kept out of task messages."""
        return self._k("solve", solve_id, "secrets")

    def solve_times(self, method: str) -> str:
        """List: recent observed solve times of a method (adaptive first poll)."""
        return self._p("stats", "solve-times", method)

    def bulk_support(self) -> str:
        """String: whether the API answers ``res.php?ids=`` ("1" / "0"), with a TTL."""
        return self._p("api", "bulk")

    def api_errors(self) -> str:
        """Hash: count of API error answers by code."""
        return self._p("stats", "api-errors")

    def pingback_callbacks(self) -> str:
        """Hash: provider callbacks by verdict ("accepted" or a rejection reason)."""
        return self._k("stats", "pingback")

    def pingback_channel(self) -> str:
        """Hash (scoped): how the provider's callbacks are doing: ``state`` (up / degraded
        / down), ``share`` (recent share of answers that came by callback), ``misses`` /
        ``hits`` (answers by poll / by callback in a row), ``since`` (answers since the
        last switch)."""
        return self._p("pingback", "channel")

    def pingback_polled(self) -> str:
        """Sorted set (scoped): captcha id -> when a poll found its answer (ms) while a
        callback was asked for: a callback that comes after it is late, not lost."""
        return self._p("pingback", "polled")

    def pingback_lateness(self) -> str:
        """Hash (scoped): how late answers of captchas that asked for a callback were:
        counts by bucket (``b:<index>``), ``sum``, ``count``, and ``overdue`` (answers a
        poll found after the captcha's callback was due)."""
        return self._p("stats", "pingback-late")

    def pingback_early(self) -> str:
        """Hash (scoped): ticket (``<solve id>.<attempt>``) -> a callback that came before
        its captcha was registered (JSON: captcha id, code)."""
        return self._p("pingback", "early")

    def pingback_early_due(self) -> str:
        """Sorted set (scoped): ticket -> when its early callback is forgotten (ms, Redis
        clock)."""
        return self._p("pingback", "early-due")

    def lane_outcomes(self) -> str:
        """Hash: "solved|<lane>|<tenant>" / "failed|<lane>|<tenant>" -> solves that ended so."""
        return self._k("stats", "lanes")

    def tenant_budgets(self) -> str:
        """Hash: "<UTC day number>|<tenant>" -> captchas the tenant submitted that day."""
        return self._k("tenants", "submitted")

    def costs(self) -> str:
        """Hash (scoped): tenant -> what the provider said its answers cost (the JSON
        family's ``cost``), summed."""
        return self._p("stats", "cost")

    def solved_counter(self, method: str) -> str:
        """Hash: solves of a method, by source."""
        return self._p("stats", "solved", method)

    # -- captchas at the provider and their polls -------------------------------------
    def board(self) -> str:
        """Hash: captcha id -> the job of a captcha at the provider (JSON)."""
        return self._p("poll", "inflight")

    def poll_due(self) -> str:
        """Sorted set: captcha id -> when it is next polled (ms, Redis clock)."""
        return self._p("poll", "due")

    def poll_state(self) -> str:
        """Hash: captcha id -> "<last polled, ms>|<transport errors>"."""
        return self._p("poll", "state")

    def poll_round(self) -> str:
        """String with a TTL: when the next poll round message is due (ms, Redis clock)."""
        return self._p("poll", "round")

    # -- thread limiter --------------------------------------------------------------
    def slots(self) -> str:
        """Sorted set: held provider threads, member = lease id, score = lease expiry (ms)."""
        return self._p("limiter", "slots")

    def parked(self) -> str:
        """Sorted set: parked submits waiting for a slot, score = arrival sequence."""
        return self._p("limiter", "parked")

    def waiting(self) -> str:
        """Hash: lease id -> "<deadline ms>|<job JSON>" of a submit that is parked or owed
        a message."""
        return self._k("limiter", "waiting")

    def dispatch(self) -> str:
        """Sorted set: submits owed a task message, score = when it counts as lost (ms)."""
        return self._k("limiter", "dispatch")

    def requested(self) -> str:
        """Sorted set: solves published but not started yet, score = when their message
        counts as lost (ms)."""
        return self._k("limiter", "requested")

    def requested_messages(self) -> str:
        """Hash: solve id -> its solve message's keyword arguments (JSON, no secrets)."""
        return self._k("limiter", "requested-messages")

    def parked_seq(self) -> str:
        return self._k("limiter", "parked-seq")

    def lanes(self) -> str:
        """Sorted set (by member, scores 0): the parked submits of each lane and tenant,
        member = "<lane>|<tenant>|<arrival, 16 digits>|<lease id>" (first in, first out)."""
        return self._p("limiter", "lanes")

    def owners(self) -> str:
        """Hash: lease id -> "<lane>|<tenant>|<asked at, ms>" of a submit parked or holding
        a slot."""
        return self._p("limiter", "owners")

    def lane_counts(self) -> str:
        """Hash: "held|<lane>|<tenant>" and "parked|<lane>|<tenant>" -> slots held and
        submits parked."""
        return self._p("limiter", "counts")

    def fair_tags(self) -> str:
        """Hash: "<lane>|<tenant>" -> the tenant's virtual finish tag in the lane, and
        "<lane>" -> the lane's virtual time (weighted fair queueing of freed slots)."""
        return self._p("limiter", "fair")

    def wait_times(self) -> str:
        """Hash: "<lane>|<tenant>|<bucket>" -> slots handed out after a wait in that bucket,
        "...|sum" (ms) and "...|n": the histogram of the time from request to thread."""
        return self._p("limiter", "waits")

    def external_threads(self) -> str:
        """String with a TTL: provider threads another client of the key holds (the slots
        ``external:1..N`` stand for them)."""
        return self._p("limiter", "external")

    def threads_check_lock(self) -> str:
        """String with a PX: one check of the provider's thread count per interval."""
        return self._p("limiter", "threads-check")

    def rate(self, endpoint: str) -> str:
        """Sorted set: recent requests to ``in.php`` / ``res.php`` (sliding window)."""
        return self._p("limiter", "rate", endpoint)

    def redis_master(self) -> str:
        """String: the run id of the Redis master that housekeeping last saw (a new one
        means a failover or a restart: time to reconcile)."""
        return self._k("redis", "master")

    def redis_events(self) -> str:
        """Hash: ``master_changes`` and ``reconnects:<process kind>`` counters."""
        return self._k("redis", "events")

    def housekeeping_lock(self) -> str:
        """String with a short TTL: one worker per tick runs the housekeeping sweep."""
        return self._k("limiter", "sweep-lock")

    # -- token pools -----------------------------------------------------------------
    def pool_registry(self) -> str:
        """Hash: pool name -> JSON definition."""
        return self._k("pools")

    def pool_tokens(self, name: str) -> str:
        """Sorted set: member = JSON token record, score = expiry (ms, Redis clock)."""
        return self._k("pool", name, "tokens")

    def pool_inflight(self, name: str) -> str:
        """Sorted set: refill solves in flight, score = when they stop counting (ms)."""
        return self._k("pool", name, "inflight")

    def pool_stats(self, name: str) -> str:
        """Hash: added / taken / expired / misses counters."""
        return self._k("pool", name, "stats")

    def pool_takes(self, name: str) -> str:
        """Sorted set: recent take times, for the take rate."""
        return self._k("pool", name, "takes")

    # -- sessions and proxies --------------------------------------------------------
    def cookies(self, domain: str) -> str:
        return self._k("session", domain, "cookies")

    def session_lock(self, domain: str) -> str:
        return self._k("session", domain, "lock")

    def session_version(self, domain: str) -> str:
        return self._k("session", domain, "version")

    def proxies(self) -> str:
        """Set: every proxy in the pool."""
        return self._k("proxies", "all")

    def proxy_assignment(self, owner: str) -> str:
        """String with its own TTL: the proxy assigned to one worker or session."""
        return self._k("proxies", "assigned", owner)

    def proxy_owner(self, proxy_id: str) -> str:
        """String with the same TTL: which owner holds a proxy."""
        return self._k("proxies", "owner", proxy_id)

    def proxy_quarantine(self) -> str:
        """Sorted set: quarantined proxies, score = when they come back (ms)."""
        return self._k("proxies", "quarantine")

    # -- batches ------------------------------------------------------------------
    def batch_results(self, batch_id: str) -> str:
        """Stream: outcomes of one batch as workers finish them."""
        return self._k("batch", batch_id, "results")

    def batch_cancelled(self, batch_id: str) -> str:
        """String with a TTL: the batch was abandoned; its queued submits must not run."""
        return self._k("batch", batch_id, "cancelled")

    def all_patterns(self) -> str:
        return self._k("*")

    # -- housekeeping ----------------------------------------------------------------
    def pool_prewarm_lock(self, name: str) -> str:
        """String with a short PX: one top-up of a pool at a time."""
        return self._k("pool", name, "prewarm-lock")

    # -- kafka bridge ----------------------------------------------------------------
    def kafka_claim(self, group: str, task_id: str) -> str:
        """Hash with a TTL: one Kafka task's claim within a consumer group (state, Celery
        task id, claimed_at ms) and, once done, the result and dead letter published for it."""
        return self._k("kafka", group, "task", task_id)

    def kafka_feedback(self, group: str, provider: str, captcha_id: str) -> str:
        """String with a TTL: a feedback message on this captcha was recorded (a redelivered
        copy is not reported twice)."""
        return self._k("kafka", group, "feedback", provider, captcha_id)

    def kafka_stats(self, group: str) -> str:
        """Hash: a bridge group's counters (dispatched, waited, takeovers, republished, ...)."""
        return self._k("kafka", group, "stats")

    # -- gateway ------------------------------------------------------------------
    def gateway_ids(self) -> str:
        """String: the last captcha id the gateway issued (a counter: ids are unique per
        deployment)."""
        return self._k("gateway", "ids")

    def gateway_captcha(self, captcha_id: str) -> str:
        """String with a TTL: what a gateway captcha id stands for (JSON: the tenant, and
        the solve's task id or the pooled outcome)."""
        return self._k("gateway", "captcha", captcha_id)

    def gateway_stats(self) -> str:
        """Hash: the gateway's requests, errors and answer times, by tenant, protocol and
        endpoint (see :mod:`captcha_tasks.state.gateway`)."""
        return self._k("stats", "gateway")

    def redbeat_prefix(self) -> str:
        """Prefix of celery-redbeat's schedule and lock keys (optional HA beat)."""
        return self._k("redbeat") + ":"
