"""One typed settings object, read from the environment in one place.

Every process (worker, beat, flower, the CLI, a web app calling ``solve.delay``) builds
its settings with :func:`get_settings`.  A wrong value raises
:class:`~captcha_tasks.errors.ConfigurationError` naming the variable, at start-up.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cached_property, lru_cache
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from .core.acceptance import AcceptancePolicy
from .core.lanes import DEFAULT_TENANT, INTERACTIVE, LANES, Tenant, parse_tenants, tenant_of
from .core.poolspec import parse_pools
from .core.providers import (
    KINDS,
    NAME_RE,
    ProviderSpec,
    base_url_problem,
    parse_budgets,
    parse_providers,
)
from .core.proxyspec import mask, split
from .errors import ConfigurationError

T = TypeVar("T")
#: An IPv4 or IPv6 network, as CAPTCHAAI_PINGBACK_ALLOW and ..._TRUSTED_PROXIES list them.
Network = IPv4Network | IPv6Network

#: Bulk polls a captcha past its likely finish gets per poll interval, by default: every
#: 0.33 s with the default 5 s interval (an answer waits about half of that for its poll).
BULK_WINDOWS_PER_POLL = 15
DEFAULT_BASE_URL = "https://ocr.captchaai.com"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
#: Port of a sentinel whose address in REDIS_URL names none (Redis Sentinel's own default).
DEFAULT_SENTINEL_PORT = 26379
#: The Celery queues, one per kind of task, so a flood of one cannot starve the others;
#: solve messages have one per lane (interactive work keeps the plain ``solve`` queue).
QUEUE_KINDS = ("solve", "solve.bulk", "solve.background", "submit", "poll", "housekeeping")
_QUEUE_PREFIX = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_SOFT_ID = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True)
class Settings:
    """All of captcha-tasks' configuration.  Field docs name the environment variable."""

    #: CAPTCHAAI_API_KEY: the account key; read by workers only, never sent in tasks.
    api_key: str = field(default="", repr=False)
    #: CAPTCHAAI_BASE_URL: the API's base URL (the sandbox's URL in development).
    base_url: str = DEFAULT_BASE_URL
    #: REDIS_URL: broker, result backend and state store (``redis://``, ``rediss://``, or
    #: Celery's Sentinel form ``sentinel://[:password@]host:port[/db];sentinel://...``).
    redis_url: str = field(default=DEFAULT_REDIS_URL, repr=False)
    #: REDIS_SENTINEL_MASTER: the master's name the sentinels monitor (required with a
    #: ``sentinel://`` REDIS_URL, read only with one).
    redis_sentinel_master: str | None = None
    #: REDIS_SENTINEL_PASSWORD: the sentinels' own password (their ``requirepass``), not the
    #: master's (that one is in REDIS_URL).
    redis_sentinel_password: str = field(default="", repr=False)
    #: REDIS_SENTINEL_TLS: TLS to the sentinels and to the Redis servers they name, both or
    #: neither (certificates verified).
    redis_sentinel_tls: bool = False
    #: REDIS_SENTINEL_TLS_CA_FILE: PEM file of the CA that signed the sentinels' and the
    #: servers' certificates (unset: the system's trusted CAs).
    redis_sentinel_tls_ca_file: str | None = None
    #: CAPTCHAAI_SOFT_ID: your software's id at CaptchaAI (its developer program), sent as
    #: ``soft_id`` with every ``in.php`` to the primary (unset: not sent).
    soft_id: str | None = None
    #: CAPTCHAAI_THREADS: the plan's concurrent thread count.
    threads: int = 10
    #: CAPTCHAAI_POLL_INTERVAL: seconds between polls of one captcha.
    poll_interval: float = 5.0
    #: CAPTCHAAI_INITIAL_WAIT: cold-start wait before the first poll for every method
    #: (unset: per-method defaults).
    initial_wait: float | None = None
    #: CAPTCHAAI_SOLVE_TIMEOUT: overall deadline of one solve, resubmits included.
    solve_timeout: float = 300.0
    #: CAPTCHAAI_CONNECT_TIMEOUT: seconds to connect to the API.
    connect_timeout: float = 5.0
    #: CAPTCHAAI_READ_TIMEOUT: seconds to wait for each reply of the API.
    read_timeout: float = 30.0
    #: CAPTCHAAI_TRANSPORT_RETRIES: retries of one HTTP step after transient errors.
    transport_retries: int = 5
    #: CAPTCHAAI_MAX_RESUBMITS: new captchas after unsolvable / expired answers.
    max_resubmits: int = 2
    #: CAPTCHAAI_TOKEN_LIFETIMES: JSON object overriding token life per method (seconds).
    token_lifetimes: Mapping[str, float] = field(default_factory=dict)
    #: CAPTCHAAI_KEY_PREFIX: prefix of every Redis key this package writes.
    key_prefix: str = "captcha"
    #: CAPTCHAAI_QUEUE_PREFIX: prefix of the Celery queues (``<prefix>.solve``,
    #: ``.solve.bulk``, ``.solve.background``, ``.submit``, ``.poll``, ``.housekeeping``);
    #: two deployments sharing a Redis use different ones.
    queue_prefix: str = "captcha"
    #: CAPTCHAAI_ADAPTIVE_SAMPLES: solve-time samples needed before the adaptive first poll.
    adaptive_min_samples: int = 10
    #: CAPTCHAAI_ADAPTIVE_PERCENTILE: percentile of observed solve time to first poll at.
    adaptive_percentile: float = 90.0
    #: CAPTCHAAI_THREADS_RESERVED: threads left for another app or cron on the same key.
    threads_reserved: int = 0
    #: CAPTCHAAI_THREADS_CHECK_EVERY: seconds between looks at the provider's count of
    #: working threads (``threadsinfo``); threads it counts beyond ours belong to another
    #: client of the key and are left to it (0: never look).
    threads_check_every: float = 30.0
    #: CAPTCHAAI_SLOT_LEASE: seconds a thread slot stays held without a renewing poll.
    slot_lease: float = 120.0
    #: CAPTCHAAI_POOL_RESERVE: slots pool refills never take (kept for on-demand solves);
    #: unset: a fifth of the usable threads, at least one.
    pool_reserve: int | None = None
    #: CAPTCHAAI_PREWARM_EVERY: seconds between beat's pool pre-warm ticks.
    prewarm_every: float = 10.0
    #: CAPTCHAAI_POOLS: token pools, a JSON list of ``{name, method, sitekey, pageurl, size,
    #: ttl, min_remaining, ...extra solve parameters}``.
    pools: tuple[Any, ...] = ()
    #: CAPTCHAAI_TENANTS: the tenants sharing the account, a JSON object of name ->
    #: ``{weight, max_threads, daily_captchas, key_env, requests_per_s, callback_hosts}``
    #: (each optional): freed threads go to them in proportion to ``weight``,
    #: ``max_threads`` caps one, ``daily_captchas`` is its budget per UTC day; for the
    #: gateway, ``key_env`` names the variable holding its key, ``requests_per_s`` caps its
    #: requests to one gateway process (default 100) and ``callback_hosts`` lists the hosts
    #: (``name``, ``name:port``, an IP address; lower-cased, exact; no port: 80 / 443 only)
    #: its ``pingback`` / ``callbackUrl`` may name (default none: refused); ``default``
    #: exists undeclared.
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    #: CAPTCHAAI_PROXIES: proxies for the shared pool, comma or newline separated.
    proxies: tuple[str, ...] = field(default=(), repr=False)
    #: CAPTCHAAI_PROXY_COOLOFF: seconds a proxy the API reported bad stays quarantined.
    proxy_cooloff: float = 300.0
    #: CAPTCHAAI_VISIBILITY_TIMEOUT: seconds before a dead worker's unacknowledged
    #: messages are delivered again (every countdown stays below half of it); a solve
    #: message that never starts is sent again 10 s after it, counted from the setting of
    #: the process that sent it (give callers the workers' value).
    visibility_timeout: float = 60.0
    #: CAPTCHAAI_SUBMIT_RATE: ``in.php`` requests the primary takes per 3 s, account wide
    #: (unset: its kind's budget, none for captchaai, 60 for 2captcha; 0: none).
    submit_rate: int | None = None
    #: CAPTCHAAI_PROVIDER_NAME: the primary's name in metrics, outcomes and logs.
    provider_name: str = "captchaai"
    #: CAPTCHAAI_PROVIDER_KIND: the primary's kind, which decides its protocol and the
    #: request budgets it gets: "captchaai" (in.php, threads only), "2captcha" (in.php, 60
    #: in.php per 3 s, 3 NO_SLOT errors per captcha, 20 res.php per captcha + 1,200 an
    #: hour), or a JSON kind, "anticaptcha", "capsolver" or "capmonster" (createTask /
    #: getTaskResult, CAPTCHAAI_BASE_URL its API root; its dialect's per-task budgets).
    provider_kind: str = "captchaai"
    #: CAPTCHAAI_BUDGETS: JSON object overriding the primary's budgets (``submit_rate``,
    #: ``no_slot_ratio``, ``res_per_captcha``, ``res_base``; null: none).
    budgets: Mapping[str, Any] = field(default_factory=dict)
    #: CAPTCHAAI_PROVIDERS: further providers, a JSON list of ``{name, base_url, key_env,
    #: threads, methods, role, kind, ...budgets}``; each key is read from the variable
    #: ``key_env`` names; ``kind`` (default "2captcha") is one of CAPTCHAAI_PROVIDER_KIND's,
    #: and a JSON kind's ``base_url`` is its API root (``https://api.anti-captcha.com``).
    providers: tuple[ProviderSpec, ...] = ()
    #: CAPTCHAAI_OVERFLOW_AFTER: seconds a captcha may be expected to wait for the primary's
    #: threads before an ``overflow`` provider takes it (unset: never).
    overflow_after: float | None = None
    #: CAPTCHAAI_CIRCUIT_FAILURES: consecutive transport errors, 5xx replies or timeouts
    #: that take a provider out of rotation until a probe answers.
    circuit_failures: int = 3
    #: CAPTCHAAI_ACCEPTANCE_MIN: a site's share of tokens accepted (the mean score for
    #: reCAPTCHA v3) at its provider below which it goes to the provider with the best lower
    #: confidence bound for it (needs two providers and reports, see ``report``).
    acceptance_min: float = 0.75
    #: CAPTCHAAI_ACCEPTANCE_MIN_REPORTS: reports (decayed) at a provider before a site's
    #: acceptance there is judged.
    acceptance_min_reports: float = 10.0
    #: CAPTCHAAI_ACCEPTANCE_EXPLORE: the share of a rerouted site's captchas that still go to
    #: the other providers, so that one that got better is noticed.
    acceptance_explore: float = 0.05
    #: CAPTCHAAI_ACCEPTANCE_HALF_LIFE: seconds in which a report's weight halves.
    acceptance_half_life: float = 21600.0
    #: CAPTCHAAI_ACCEPTANCE_SITES: the sites whose acceptance is kept (the most reported;
    #: the rest are trimmed).
    acceptance_sites: int = 10000
    #: CAPTCHAAI_BULK_POLL: "auto" (ask for many captchas in one ``ids=`` request where the
    #: API supports it) or "off" (one id per request).
    bulk_poll: str = "auto"
    #: CAPTCHAAI_BULK_WINDOW: at most one bulk request per this many seconds
    #: (unset: a fifteenth of the poll interval).
    bulk_window: float | None = None
    #: CAPTCHAAI_PINGBACK_URL: base URL where the provider can reach our receiver
    #: (``captcha-tasks pingback-server``); set, every submit asks for a callback.
    pingback_url: str | None = None
    #: CAPTCHAAI_PINGBACK_SECRET: key of the MAC in every callback URL (required with
    #: CAPTCHAAI_PINGBACK_URL, at least 16 characters).
    pingback_secret: str = field(default="", repr=False)
    #: CAPTCHAAI_PINGBACK_FALLBACK_POLL: while callbacks arrive, a captcha whose callback
    #: has not come this many seconds after its method's 95th percentile solve time (learned
    #: from the answers) is polled: its callback is overdue (a lost one costs latency only).
    pingback_fallback_poll: float = 1.0
    #: CAPTCHAAI_PINGBACK_TRUSTED_PROXIES: networks (CIDRs) of the reverse proxies in front
    #: of the receiver; a request from one of them is judged by the client address its
    #: ``X-Forwarded-For`` names (the right-most one outside these networks).
    pingback_trusted_proxies: tuple[Network, ...] = ()
    #: CAPTCHAAI_PINGBACK_ALLOW: networks (CIDRs) the receiver takes requests from (empty:
    #: any); a connection from elsewhere is closed before anything is read.
    pingback_allow: tuple[Network, ...] = ()
    #: CAPTCHAAI_GATEWAY_TRUSTED_PROXIES: networks (CIDRs) of the reverse proxies in front
    #: of the gateway (``captcha-tasks gateway``); a request from one of them is judged by
    #: the client address its ``X-Forwarded-For`` names.
    gateway_trusted_proxies: tuple[Network, ...] = ()
    #: CAPTCHAAI_GATEWAY_ALLOW: networks (CIDRs) the gateway takes connections from (empty:
    #: any); a connection from elsewhere is closed before anything is read.
    gateway_allow: tuple[Network, ...] = ()
    #: KAFKA_BOOTSTRAP_SERVERS: the Kafka brokers of the bridge and the producer helper.
    kafka_bootstrap_servers: str = "localhost:9092"
    #: KAFKA_TASKS_TOPIC: tasks to solve (JSON with task_id, method, sitekey, pageurl, ...).
    kafka_tasks_topic: str = "captcha-tasks"
    #: KAFKA_RESULTS_TOPIC: one outcome per task, keyed by task_id.
    kafka_results_topic: str = "captcha-results"
    #: KAFKA_DEAD_LETTER_TOPIC: unreadable messages and failed tasks, for inspection and replay.
    kafka_dead_letter_topic: str = "captcha-dead-letter"
    #: KAFKA_FEEDBACK_TOPIC: reports on solved tokens (accepted or not, a v3 score), read by
    #: the bridge and counted as ``report()`` counts them.
    kafka_feedback_topic: str = "captcha-feedback"
    #: KAFKA_GROUP_ID: the bridge's consumer group.
    kafka_group_id: str = "captcha-tasks-bridge"
    #: KAFKA_MAX_IN_FLIGHT: unfinished tasks per bridge before it pauses its partitions
    #: (unset: twice CAPTCHAAI_THREADS).
    kafka_max_in_flight: int | None = None
    #: KAFKA_RESULT_TTL: seconds a published result stays in Redis to answer redeliveries.
    kafka_result_ttl: float = 86400.0
    #: KAFKA_CLIENT_CONFIG: JSON object of extra librdkafka settings (SASL, TLS, ...).
    kafka_client_config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: CAPTCHAAI_FLOWER_NO_AUTH: let ``celery flower`` start without authentication (only
    #: behind a proxy that authenticates; see :mod:`captcha_tasks.worker.flower_auth`).
    flower_no_auth: bool = False

    def __post_init__(self) -> None:
        _check_url("CAPTCHAAI_BASE_URL", self.base_url, ("http", "https"))
        self._check_redis()
        _check(
            "CAPTCHAAI_SOFT_ID",
            self.soft_id is None or bool(_SOFT_ID.fullmatch(self.soft_id)),
            "must be the number the provider gave your software (1-20 digits)",
        )
        _check("CAPTCHAAI_THREADS", self.threads >= 1, "must be at least 1")
        _check("CAPTCHAAI_POLL_INTERVAL", self.poll_interval > 0, "must be > 0")
        _check(
            "CAPTCHAAI_INITIAL_WAIT",
            self.initial_wait is None or self.initial_wait >= 0,
            "must be >= 0",
        )
        _check("CAPTCHAAI_SOLVE_TIMEOUT", self.solve_timeout > 0, "must be > 0")
        _check("CAPTCHAAI_CONNECT_TIMEOUT", self.connect_timeout > 0, "must be > 0")
        _check("CAPTCHAAI_READ_TIMEOUT", self.read_timeout > 0, "must be > 0")
        _check("CAPTCHAAI_TRANSPORT_RETRIES", self.transport_retries >= 0, "must be >= 0")
        _check("CAPTCHAAI_MAX_RESUBMITS", self.max_resubmits >= 0, "must be >= 0")
        _check("CAPTCHAAI_KEY_PREFIX", bool(self.key_prefix.strip()), "must not be empty")
        _check(
            "CAPTCHAAI_QUEUE_PREFIX",
            bool(_QUEUE_PREFIX.fullmatch(self.queue_prefix)),
            "must be letters, digits, '.', '_' or '-'",
        )
        _check("CAPTCHAAI_ADAPTIVE_SAMPLES", self.adaptive_min_samples >= 1, "must be >= 1")
        _check(
            "CAPTCHAAI_ADAPTIVE_PERCENTILE",
            0 < self.adaptive_percentile < 100,
            "must be between 0 and 100",
        )
        _check(
            "CAPTCHAAI_THREADS_RESERVED",
            0 <= self.threads_reserved < self.threads,
            "must be >= 0 and less than CAPTCHAAI_THREADS",
        )
        _check("CAPTCHAAI_SLOT_LEASE", self.slot_lease > 0, "must be > 0")
        _check("CAPTCHAAI_THREADS_CHECK_EVERY", self.threads_check_every >= 0, "must be >= 0")
        _check(
            "CAPTCHAAI_POOL_RESERVE",
            self.pool_reserve is None or 0 <= self.pool_reserve <= self.capacity,
            "must be between 0 and the usable threads",
        )
        _check("CAPTCHAAI_PREWARM_EVERY", self.prewarm_every > 0, "must be > 0")
        _check("CAPTCHAAI_PROXY_COOLOFF", self.proxy_cooloff > 0, "must be > 0")
        self._check_providers()
        _check("CAPTCHAAI_VISIBILITY_TIMEOUT", self.visibility_timeout >= 4, "must be >= 4")
        http = self.connect_timeout + self.read_timeout
        _check(
            "CAPTCHAAI_VISIBILITY_TIMEOUT",
            self.visibility_timeout > http,
            f"must be longer than CAPTCHAAI_CONNECT_TIMEOUT + CAPTCHAAI_READ_TIMEOUT ({http:g} s):"
            " a message still waiting for the API must not be delivered a second time",
        )
        _check("CAPTCHAAI_BULK_POLL", self.bulk_poll in ("auto", "off"), 'must be "auto" or "off"')
        _check(
            "CAPTCHAAI_BULK_WINDOW",
            self.bulk_window is None or self.bulk_window > 0,
            "must be > 0",
        )
        self._check_pingback()
        self._check_tenants()
        for method, life in self.token_lifetimes.items():
            _check("CAPTCHAAI_TOKEN_LIFETIMES", life > 0, f"life of {method!r} must be > 0")
        self._check_kafka()

    def _check_providers(self) -> None:
        _check(
            "CAPTCHAAI_SUBMIT_RATE",
            self.submit_rate is None or self.submit_rate >= 0,
            "must be >= 0 (0: no budget)",
        )
        _check(
            "CAPTCHAAI_PROVIDER_NAME",
            bool(NAME_RE.fullmatch(self.provider_name)),
            "must be 1-32 letters, digits, '_' or '-'",
        )
        _check(
            "CAPTCHAAI_PROVIDER_KIND",
            self.provider_kind in KINDS,
            f"is {self.provider_kind!r}, not one of {', '.join(KINDS)}",
        )
        problem = base_url_problem(self.base_url, self.provider_kind)
        _check("CAPTCHAAI_BASE_URL", problem is None, problem or "")
        _check(
            "CAPTCHAAI_OVERFLOW_AFTER",
            self.overflow_after is None or self.overflow_after > 0,
            "must be > 0",
        )
        _check("CAPTCHAAI_CIRCUIT_FAILURES", self.circuit_failures >= 1, "must be at least 1")
        self._check_acceptance()
        names = [self.provider_name, *(p.name for p in self.providers)]
        dup = sorted({n for n in names if names.count(n) > 1})
        _check("CAPTCHAAI_PROVIDERS", not dup, f"names {', '.join(dup)} more than once")
        self.primary  # noqa: B018  (the budgets are checked once here)

    def _check_acceptance(self) -> None:
        _check("CAPTCHAAI_ACCEPTANCE_MIN", 0 <= self.acceptance_min <= 1, "must be in [0, 1]")
        _check("CAPTCHAAI_ACCEPTANCE_MIN_REPORTS", self.acceptance_min_reports > 0, "must be > 0")
        _check(
            "CAPTCHAAI_ACCEPTANCE_EXPLORE", 0 <= self.acceptance_explore < 1, "must be in [0, 1)"
        )
        _check("CAPTCHAAI_ACCEPTANCE_HALF_LIFE", self.acceptance_half_life > 0, "must be > 0")
        _check("CAPTCHAAI_ACCEPTANCE_SITES", self.acceptance_sites >= 1, "must be at least 1")

    @property
    def acceptance(self) -> AcceptancePolicy:
        """The acceptance router's settings."""
        return AcceptancePolicy(
            self.acceptance_min,
            self.acceptance_min_reports,
            self.acceptance_explore,
            self.acceptance_half_life,
        )

    @cached_property
    def primary(self) -> ProviderSpec:
        """The primary provider: ``CAPTCHAAI_BASE_URL`` with ``CAPTCHAAI_API_KEY``."""
        budgets = parse_budgets(dict(self.budgets) or None, self.provider_kind, "CAPTCHAAI_BUDGETS")
        if self.submit_rate is not None:
            budgets = replace(budgets, submit_rate=self.submit_rate or None)
        return ProviderSpec(
            name=self.provider_name,
            base_url=self.base_url,
            api_key=self.api_key,
            threads=self.threads,
            role="primary",
            kind=self.provider_kind,  # type: ignore[arg-type]
            budgets=budgets,
            reserved=self.threads_reserved,
        )

    @property
    def all_providers(self) -> tuple[ProviderSpec, ...]:
        """Every provider, the primary first, in the order captchas go to them."""
        return (self.primary, *self.providers)

    def provider(self, name: str | None) -> ProviderSpec:
        """The provider named ``name`` (None: the primary); KeyError if there is none."""
        if name is None or name == self.provider_name:
            return self.primary
        for spec in self.providers:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def _check_tenants(self) -> None:
        for name, tenant in self.tenants.items():
            _check(
                "CAPTCHAAI_TENANTS",
                isinstance(tenant, Tenant) and tenant.name == name,
                f"must map each name to its Tenant (got {name!r})",
            )

    def _check_redis(self) -> None:
        if self.redis_url.startswith(SENTINEL_SCHEME + "://"):
            self.redis_sentinel  # noqa: B018  (parsed once here: a bad URL fails at start-up)
            return
        _check_url("REDIS_URL", self.redis_url, ("redis", "rediss", "unix"))
        for var, value in (
            ("REDIS_SENTINEL_MASTER", self.redis_sentinel_master),
            ("REDIS_SENTINEL_PASSWORD", self.redis_sentinel_password),
            ("REDIS_SENTINEL_TLS", self.redis_sentinel_tls),
            ("REDIS_SENTINEL_TLS_CA_FILE", self.redis_sentinel_tls_ca_file),
        ):
            _check(var, not value, "is read only with a sentinel:// REDIS_URL")

    @cached_property
    def redis_sentinel(self) -> RedisSentinel | None:
        """REDIS_URL and the REDIS_SENTINEL_* settings as one value, when REDIS_URL names
        sentinels (None otherwise)."""
        if not self.redis_url.startswith(SENTINEL_SCHEME + "://"):
            return None
        return parse_sentinel(
            self.redis_url,
            master=self.redis_sentinel_master,
            sentinel_password=self.redis_sentinel_password or None,
            tls=self.redis_sentinel_tls,
            tls_ca_file=self.redis_sentinel_tls_ca_file,
        )

    def _check_pingback(self) -> None:
        _check("CAPTCHAAI_PINGBACK_FALLBACK_POLL", self.pingback_fallback_poll > 0, "must be > 0")
        for var, networks in (
            ("CAPTCHAAI_PINGBACK_TRUSTED_PROXIES", self.pingback_trusted_proxies),
            ("CAPTCHAAI_PINGBACK_ALLOW", self.pingback_allow),
            ("CAPTCHAAI_GATEWAY_TRUSTED_PROXIES", self.gateway_trusted_proxies),
            ("CAPTCHAAI_GATEWAY_ALLOW", self.gateway_allow),
        ):
            _check(
                var,
                all(isinstance(n, IPv4Network | IPv6Network) for n in networks),
                "must be a list of networks (ipaddress.ip_network values)",
            )
        if self.pingback_url is None:
            return
        _check_url("CAPTCHAAI_PINGBACK_URL", self.pingback_url, ("http", "https"))
        _check(
            "CAPTCHAAI_PINGBACK_URL",
            not urlsplit(self.pingback_url).query,
            "must not carry a query string (the provider appends its own)",
        )
        _check(
            "CAPTCHAAI_PINGBACK_SECRET",
            len(self.pingback_secret) >= 16,
            "must be set (at least 16 characters) when CAPTCHAAI_PINGBACK_URL is",
        )

    @property
    def pingback(self) -> bool:
        """Whether submits ask the provider to call back."""
        return self.pingback_url is not None

    def _check_kafka(self) -> None:
        _check("KAFKA_BOOTSTRAP_SERVERS", bool(self.kafka_bootstrap_servers.strip()), "must be set")
        topics = {
            "KAFKA_TASKS_TOPIC": self.kafka_tasks_topic,
            "KAFKA_RESULTS_TOPIC": self.kafka_results_topic,
            "KAFKA_DEAD_LETTER_TOPIC": self.kafka_dead_letter_topic,
            "KAFKA_FEEDBACK_TOPIC": self.kafka_feedback_topic,
        }
        for var, topic in topics.items():
            _check(var, bool(topic.strip()), "must not be empty")
            others = [v for v, t in topics.items() if v != var and t == topic]
            _check(var, not others, f"must differ from {', '.join(others)}")
        _check("KAFKA_GROUP_ID", bool(self.kafka_group_id.strip()), "must not be empty")
        _check(
            "KAFKA_MAX_IN_FLIGHT",
            self.kafka_max_in_flight is None or self.kafka_max_in_flight >= 1,
            "must be at least 1",
        )
        _check("KAFKA_RESULT_TTL", self.kafka_result_ttl > 0, "must be > 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``environ`` (default: ``os.environ``)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, (var, parse) in _ENV.items():
            raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            if parse is _providers:
                continue  # needs the other variables (the keys): below
            values[name] = _parse(var, raw.strip(), parse)
        raw = env.get("CAPTCHAAI_PROVIDERS", "").strip()
        if raw:
            primary = values.get("provider_name", "captchaai")
            values["providers"] = parse_providers(raw, env, primary)
        return cls(**values)

    @property
    def queues(self) -> tuple[str, ...]:
        """The Celery queues of this deployment: solve, submit, poll, housekeeping."""
        return tuple(self.queue(kind) for kind in QUEUE_KINDS)

    def queue(self, kind: str) -> str:
        """The name of one of :data:`QUEUE_KINDS`."""
        return f"{self.queue_prefix}.{kind}"

    @property
    def capacity(self) -> int:
        """Threads this deployment may use: the plan's minus the reserved headroom."""
        return self.threads - self.threads_reserved

    def solve_queue(self, lane: str = INTERACTIVE) -> str:
        """The queue of solve messages in ``lane`` (interactive: ``<prefix>.solve``)."""
        return self.queue("solve" if lane == INTERACTIVE else f"solve.{lane}")

    @property
    def solve_queues(self) -> tuple[str, ...]:
        """The solve queues of every lane."""
        return tuple(self.solve_queue(lane) for lane in LANES)

    def tenant(self, name: str = DEFAULT_TENANT) -> Tenant:
        """The tenant ``name`` (undeclared ones: weight 1, no cap, no budget)."""
        return tenant_of(name, self.tenants)

    @property
    def tenant_names(self) -> tuple[str, ...]:
        """Every tenant a solve may name: the declared ones and ``default``."""
        return tuple(sorted({DEFAULT_TENANT, *self.tenants}))

    @property
    def kafka_in_flight_limit(self) -> int:
        """Unfinished tasks one Kafka bridge holds before it pauses its partitions."""
        if self.kafka_max_in_flight is not None:
            return self.kafka_max_in_flight
        return 2 * self.threads

    @property
    def bulk_window_s(self) -> float:
        if self.bulk_window is not None:
            return self.bulk_window
        return self.poll_interval / BULK_WINDOWS_PER_POLL

    @property
    def refill_reserve(self) -> int:
        if self.pool_reserve is not None:
            return self.pool_reserve
        return max(1, self.capacity // 5)

    def replace(self, **changes: Any) -> Settings:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(changes)
        return Settings(**data)


#: REDIS_URL's scheme for sentinels (Celery's and kombu's).
SENTINEL_SCHEME = "sentinel"


@dataclass(frozen=True)
class RedisSentinel:
    """A Redis deployment behind Sentinel: where the sentinels are, which master they
    watch, and how to talk to both (read from REDIS_URL and REDIS_SENTINEL_*)."""

    #: The sentinels' addresses, in REDIS_URL's order.
    sentinels: tuple[tuple[str, int], ...]
    #: The master's name (the sentinels' ``sentinel monitor <name> ...``).
    master: str
    db: int = 0
    #: The Redis servers' password (REDIS_URL's).
    password: str | None = field(default=None, repr=False)
    #: The sentinels' own password (REDIS_SENTINEL_PASSWORD).
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_ca_file: str | None = None


def parse_sentinel(
    url: str,
    *,
    master: str | None,
    sentinel_password: str | None = None,
    tls: bool = False,
    tls_ca_file: str | None = None,
) -> RedisSentinel:
    """``sentinel://[:password@]host:port[/db];sentinel://...`` and its companions as one
    value; :class:`ConfigurationError` names the variable that is wrong."""
    parts = [_sentinel_part(chunk) for chunk in url.split(";") if chunk.strip()]
    _check("REDIS_URL", bool(parts), "names no sentinel")
    passwords = {unquote(p.password) for p in parts if p.password is not None}
    _check(
        "REDIS_URL",
        len(passwords) <= 1,
        "gives different passwords to its sentinel:// parts (the Redis password is one)",
    )
    dbs = {_db(p) for p in parts if p.path.strip("/")}
    _check("REDIS_URL", len(dbs) <= 1, "gives different databases to its sentinel:// parts")
    if not master or not master.strip():
        raise ConfigurationError(
            "REDIS_SENTINEL_MASTER must name the master when REDIS_URL is a sentinel:// URL"
        )
    _check("REDIS_SENTINEL_MASTER", not re.search(r"\s", master), "must not contain spaces")
    _check(
        "REDIS_SENTINEL_TLS_CA_FILE",
        tls_ca_file is None or tls,
        "is read only with REDIS_SENTINEL_TLS=1",
    )
    _check(
        "REDIS_SENTINEL_TLS_CA_FILE",
        tls_ca_file is None or Path(tls_ca_file).is_file(),
        "must be a readable PEM file",
    )
    return RedisSentinel(
        sentinels=tuple((str(p.hostname), p.port or DEFAULT_SENTINEL_PORT) for p in parts),
        master=master,
        db=dbs.pop() if dbs else 0,
        password=passwords.pop() if passwords else None,
        sentinel_password=sentinel_password,
        tls=tls,
        tls_ca_file=tls_ca_file,
    )


def _sentinel_part(chunk: str) -> SplitResult:
    why = "must be sentinel://[:password@]host:port[/db] parts joined by ';'"
    parts = urlsplit(chunk.strip())
    try:
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number)
    except ValueError:
        raise ConfigurationError(f"REDIS_URL {why}") from None
    _check("REDIS_URL", parts.scheme == SENTINEL_SCHEME and bool(parts.hostname), why)
    _check(
        "REDIS_URL",
        not parts.query and not parts.fragment,
        "takes no options in a sentinel:// URL (use the REDIS_SENTINEL_* settings)",
    )
    # ACL users are not wired through every client yet: refuse one rather than have only
    # some clients (kombu's, Celery's) log in as it.
    _check(
        "REDIS_URL",
        not parts.username,
        "takes a password only in a sentinel:// URL (sentinel://:password@host), no user",
    )
    return parts


def _db(parts: SplitResult) -> int:
    raw = parts.path.strip("/")
    _check("REDIS_URL", raw.isdigit(), "must name its database as /<number> (or not at all)")
    return int(raw)


def mask_url(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``: safe for messages and logs.
    A ``sentinel://...;sentinel://...`` URL is masked part by part."""
    if ";" in url:
        return ";".join(mask_url(part) for part in url.split(";"))
    parts = urlsplit(url)
    if not parts.password:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _check(var: str, ok: bool, why: str) -> None:
    if not ok:
        raise ConfigurationError(f"{var} {why}")


def _check_url(var: str, value: str, schemes: tuple[str, ...]) -> None:
    parts = urlsplit(value)
    if parts.scheme not in schemes or (parts.scheme != "unix" and not parts.hostname):
        raise ConfigurationError(f"{var} must be a {' / '.join(s + '://' for s in schemes)} URL")


def _parse(var: str, raw: str, parse: Callable[[str], T]) -> T:
    try:
        return parse(raw)
    except ConfigurationError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"{var} has an invalid value: {exc}") from None


def _lifetimes(raw: str) -> dict[str, float]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of method -> seconds")
    return {str(k): float(v) for k, v in data.items()}


def _pools(raw: str) -> tuple[Any, ...]:
    return parse_pools(raw)


def _proxies(raw: str) -> tuple[str, ...]:
    items = tuple(p.strip() for p in raw.replace("\n", ",").split(",") if p.strip())
    for index, proxy in enumerate(items):
        try:
            split(proxy)
        except ValueError as exc:
            raise ValueError(f"proxy #{index} ({mask(proxy)}): {exc}") from None
    return items


def _networks(raw: str) -> tuple[Network, ...]:
    found = []
    for item in raw.replace(",", " ").split():
        try:
            # strict=False: 10.1.2.3/8 means the /8 it lies in, as firewalls read it
            found.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(
                f"{item!r} is not an address or a CIDR network (like 203.0.113.0/24 or"
                " 2001:db8::/32)"
            ) from None
    return tuple(found)


def _providers(raw: str) -> tuple[ProviderSpec, ...]:
    raise AssertionError("CAPTCHAAI_PROVIDERS is read by Settings.from_env")  # pragma: no cover


def _budgets(raw: str) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of budget -> value")
    return data


def _flag(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1/0, true/false, yes/no or on/off, got {raw!r}")


def _client_config(raw: str) -> dict[str, Any]:
    # The values may be secrets (SASL passwords): errors name keys, never values.
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object of librdkafka setting -> value")
    for key, value in data.items():
        if not isinstance(value, str | int | float | bool):
            raise ValueError(f"{key!r} must be a string, number or boolean")
    return {str(k): v for k, v in data.items()}


_ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "api_key": ("CAPTCHAAI_API_KEY", str),
    "base_url": ("CAPTCHAAI_BASE_URL", lambda s: s.rstrip("/")),
    "redis_url": ("REDIS_URL", str),
    "redis_sentinel_master": ("REDIS_SENTINEL_MASTER", str),
    "redis_sentinel_password": ("REDIS_SENTINEL_PASSWORD", str),
    "redis_sentinel_tls": ("REDIS_SENTINEL_TLS", _flag),
    "redis_sentinel_tls_ca_file": ("REDIS_SENTINEL_TLS_CA_FILE", str),
    "soft_id": ("CAPTCHAAI_SOFT_ID", str),
    "threads": ("CAPTCHAAI_THREADS", int),
    "poll_interval": ("CAPTCHAAI_POLL_INTERVAL", float),
    "initial_wait": ("CAPTCHAAI_INITIAL_WAIT", float),
    "solve_timeout": ("CAPTCHAAI_SOLVE_TIMEOUT", float),
    "connect_timeout": ("CAPTCHAAI_CONNECT_TIMEOUT", float),
    "read_timeout": ("CAPTCHAAI_READ_TIMEOUT", float),
    "transport_retries": ("CAPTCHAAI_TRANSPORT_RETRIES", int),
    "max_resubmits": ("CAPTCHAAI_MAX_RESUBMITS", int),
    "token_lifetimes": ("CAPTCHAAI_TOKEN_LIFETIMES", _lifetimes),
    "key_prefix": ("CAPTCHAAI_KEY_PREFIX", str),
    "queue_prefix": ("CAPTCHAAI_QUEUE_PREFIX", str),
    "adaptive_min_samples": ("CAPTCHAAI_ADAPTIVE_SAMPLES", int),
    "adaptive_percentile": ("CAPTCHAAI_ADAPTIVE_PERCENTILE", float),
    "threads_reserved": ("CAPTCHAAI_THREADS_RESERVED", int),
    "slot_lease": ("CAPTCHAAI_SLOT_LEASE", float),
    "threads_check_every": ("CAPTCHAAI_THREADS_CHECK_EVERY", float),
    "pool_reserve": ("CAPTCHAAI_POOL_RESERVE", int),
    "prewarm_every": ("CAPTCHAAI_PREWARM_EVERY", float),
    "pools": ("CAPTCHAAI_POOLS", _pools),
    "tenants": ("CAPTCHAAI_TENANTS", parse_tenants),
    "proxies": ("CAPTCHAAI_PROXIES", _proxies),
    "proxy_cooloff": ("CAPTCHAAI_PROXY_COOLOFF", float),
    "visibility_timeout": ("CAPTCHAAI_VISIBILITY_TIMEOUT", float),
    "submit_rate": ("CAPTCHAAI_SUBMIT_RATE", int),
    "provider_name": ("CAPTCHAAI_PROVIDER_NAME", str),
    "provider_kind": ("CAPTCHAAI_PROVIDER_KIND", lambda s: s.lower()),
    "budgets": ("CAPTCHAAI_BUDGETS", _budgets),
    "providers": ("CAPTCHAAI_PROVIDERS", _providers),
    "overflow_after": ("CAPTCHAAI_OVERFLOW_AFTER", float),
    "circuit_failures": ("CAPTCHAAI_CIRCUIT_FAILURES", int),
    "acceptance_min": ("CAPTCHAAI_ACCEPTANCE_MIN", float),
    "acceptance_min_reports": ("CAPTCHAAI_ACCEPTANCE_MIN_REPORTS", float),
    "acceptance_explore": ("CAPTCHAAI_ACCEPTANCE_EXPLORE", float),
    "acceptance_half_life": ("CAPTCHAAI_ACCEPTANCE_HALF_LIFE", float),
    "acceptance_sites": ("CAPTCHAAI_ACCEPTANCE_SITES", int),
    "bulk_poll": ("CAPTCHAAI_BULK_POLL", lambda s: s.lower()),
    "bulk_window": ("CAPTCHAAI_BULK_WINDOW", float),
    "flower_no_auth": ("CAPTCHAAI_FLOWER_NO_AUTH", _flag),
    "pingback_url": ("CAPTCHAAI_PINGBACK_URL", lambda s: s.rstrip("/")),
    "pingback_secret": ("CAPTCHAAI_PINGBACK_SECRET", str),
    "pingback_fallback_poll": ("CAPTCHAAI_PINGBACK_FALLBACK_POLL", float),
    "pingback_trusted_proxies": ("CAPTCHAAI_PINGBACK_TRUSTED_PROXIES", _networks),
    "pingback_allow": ("CAPTCHAAI_PINGBACK_ALLOW", _networks),
    "gateway_trusted_proxies": ("CAPTCHAAI_GATEWAY_TRUSTED_PROXIES", _networks),
    "gateway_allow": ("CAPTCHAAI_GATEWAY_ALLOW", _networks),
    "kafka_bootstrap_servers": ("KAFKA_BOOTSTRAP_SERVERS", str),
    "kafka_tasks_topic": ("KAFKA_TASKS_TOPIC", str),
    "kafka_results_topic": ("KAFKA_RESULTS_TOPIC", str),
    "kafka_dead_letter_topic": ("KAFKA_DEAD_LETTER_TOPIC", str),
    "kafka_feedback_topic": ("KAFKA_FEEDBACK_TOPIC", str),
    "kafka_group_id": ("KAFKA_GROUP_ID", str),
    "kafka_max_in_flight": ("KAFKA_MAX_IN_FLIGHT", int),
    "kafka_result_ttl": ("KAFKA_RESULT_TTL", float),
    "kafka_client_config": ("KAFKA_CLIENT_CONFIG", _client_config),
}

#: Variables Docker Compose passes to workers for the keys of CAPTCHAAI_PROVIDERS: name one
#: in a provider's ``key_env`` (any other name works outside Compose).
PROVIDER_KEY_SLOTS = ("CAPTCHAAI_PROVIDER_KEY_1", "CAPTCHAAI_PROVIDER_KEY_2")
#: Every environment variable the settings read (used by the compose-file check).
ENVIRONMENT_VARIABLES = frozenset(var for var, _ in _ENV.values())


@dataclass(frozen=True)
class SettingDoc:
    """One setting as the documentation shows it."""

    variable: str
    field: str
    default: Any
    meaning: str


def documented() -> list[SettingDoc]:
    """Every setting in the order of :class:`Settings`: its environment variable, field,
    default and meaning, read from the ``#: VARIABLE: meaning`` comment above its field.
    The reference in the documentation is built from this, so it cannot drift."""
    comments = _field_comments()
    docs = []
    for f in fields(Settings):
        variable, _ = _ENV[f.name]
        named, _, meaning = comments.get(f.name, "").partition(": ")
        if named != variable:
            raise ConfigurationError(f"Settings.{f.name} needs a '#: {variable}: ...' comment")
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        docs.append(SettingDoc(variable, f.name, default, meaning))
    return docs


def _field_comments() -> dict[str, str]:
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(Settings).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text.removeprefix("#:").strip())
            continue
        annotated = _FIELD_LINE.match(text)
        if annotated and pending:
            comments[annotated.group(1)] = " ".join(pending)
        pending = []
    return comments


_FIELD_LINE = re.compile(r"(\w+): [^=]+(=|$)")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings.from_env()


def reset_settings() -> None:
    """Forget the cached settings (tests and the quickstart change the environment)."""
    get_settings.cache_clear()
