"""The providers: the primary account, further ones, how we talk to them and how captchas
are routed among them (by their health and by acceptance)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from ..core.acceptance import AcceptancePolicy
from ..core.providers import KINDS, NAME_RE, ProviderSpec, base_url_problem, parse_budgets
from .declare import budgets as budget_overrides
from .declare import check, check_url, lower, no_slash, setting

DEFAULT_BASE_URL = "https://ocr.captchaai.com"
_SOFT_ID = re.compile(r"[0-9]{1,20}")


@dataclass(frozen=True)
class ProviderSettings:
    """The primary provider's account and the further ones (``settings.providers``)."""

    api_key: str = setting(
        "CAPTCHAAI_API_KEY",
        "the account key; read by workers only, never sent in tasks.",
        "",
        secret=True,
    )
    base_url: str = setting(
        "CAPTCHAAI_BASE_URL",
        "the API's base URL (the sandbox's URL in development).",
        DEFAULT_BASE_URL,
        parse=no_slash,
    )
    soft_id: str | None = setting(
        "CAPTCHAAI_SOFT_ID",
        """your software's id at CaptchaAI (its developer program), sent as ``soft_id``
        with every ``in.php`` to the primary (unset: not sent).""",
        None,
    )
    threads: int = setting(
        "CAPTCHAAI_THREADS", "the plan's concurrent thread count.", 10, parse=int
    )
    threads_reserved: int = setting(
        "CAPTCHAAI_THREADS_RESERVED",
        "threads left for another app or cron on the same key.",
        0,
        parse=int,
    )
    threads_check_every: float = setting(
        "CAPTCHAAI_THREADS_CHECK_EVERY",
        """seconds between looks at the provider's count of working threads
        (``threadsinfo``); threads it counts beyond ours belong to another client of the
        key and are left to it (0: never look).""",
        30.0,
        parse=float,
    )
    submit_rate: int | None = setting(
        "CAPTCHAAI_SUBMIT_RATE",
        """``in.php`` requests the primary takes per 3 s, account wide (unset: its kind's
        budget, none for captchaai, 60 for 2captcha; 0: none).""",
        None,
        parse=int,
    )
    name: str = setting(
        "CAPTCHAAI_PROVIDER_NAME",
        "the primary's name in metrics, outcomes and logs.",
        "captchaai",
    )
    kind: str = setting(
        "CAPTCHAAI_PROVIDER_KIND",
        """the primary's kind, which decides its protocol and the request budgets it gets:
        "captchaai" (in.php, threads only), "2captcha" (in.php, 60 in.php per 3 s, 3 NO_SLOT
        errors per captcha, 20 res.php per captcha + 1,200 an hour), or a JSON kind,
        "anticaptcha", "capsolver" or "capmonster" (createTask / getTaskResult,
        CAPTCHAAI_BASE_URL its API root; its dialect's per-task budgets).""",
        "captchaai",
        parse=lower,
    )
    budgets: Mapping[str, Any] = setting(
        "CAPTCHAAI_BUDGETS",
        """JSON object overriding the primary's budgets (``submit_rate``,
        ``no_slot_ratio``, ``res_per_captcha``, ``res_base``; null: none).""",
        factory=dict,
        parse=budget_overrides,
    )
    extra: tuple[ProviderSpec, ...] = setting(
        "CAPTCHAAI_PROVIDERS",
        """further providers, a JSON list of ``{name, base_url, key_env, threads, methods,
        role, kind, ...budgets}``; each key is read from the variable ``key_env`` names;
        ``kind`` (default "2captcha") is one of CAPTCHAAI_PROVIDER_KIND's, and a JSON
        kind's ``base_url`` is its API root (``https://api.anti-captcha.com``).""",
        (),
        parse=None,  # read by the builder: it needs the keys' variables
    )
    overflow_after: float | None = setting(
        "CAPTCHAAI_OVERFLOW_AFTER",
        """seconds a captcha may be expected to wait for the primary's threads before an
        ``overflow`` provider takes it (unset: never).""",
        None,
        parse=float,
    )
    circuit_failures: int = setting(
        "CAPTCHAAI_CIRCUIT_FAILURES",
        """consecutive transport errors, 5xx replies or timeouts that take a provider out
        of rotation until a probe answers.""",
        3,
        parse=int,
    )
    connect_timeout: float = setting(
        "CAPTCHAAI_CONNECT_TIMEOUT", "seconds to connect to the API.", 5.0, parse=float
    )
    read_timeout: float = setting(
        "CAPTCHAAI_READ_TIMEOUT", "seconds to wait for each reply of the API.", 30.0, parse=float
    )
    transport_retries: int = setting(
        "CAPTCHAAI_TRANSPORT_RETRIES",
        "retries of one HTTP step after transient errors.",
        5,
        parse=int,
    )

    def __post_init__(self) -> None:
        check_url("CAPTCHAAI_BASE_URL", self.base_url, ("http", "https"))
        check(
            "CAPTCHAAI_SOFT_ID",
            self.soft_id is None or bool(_SOFT_ID.fullmatch(self.soft_id)),
            "must be the number the provider gave your software (1-20 digits)",
        )
        check("CAPTCHAAI_THREADS", self.threads >= 1, "must be at least 1")
        check(
            "CAPTCHAAI_THREADS_RESERVED",
            0 <= self.threads_reserved < self.threads,
            "must be >= 0 and less than CAPTCHAAI_THREADS",
        )
        check("CAPTCHAAI_THREADS_CHECK_EVERY", self.threads_check_every >= 0, "must be >= 0")
        check("CAPTCHAAI_CONNECT_TIMEOUT", self.connect_timeout > 0, "must be > 0")
        check("CAPTCHAAI_READ_TIMEOUT", self.read_timeout > 0, "must be > 0")
        check("CAPTCHAAI_TRANSPORT_RETRIES", self.transport_retries >= 0, "must be >= 0")
        self._check_routing()

    def _check_routing(self) -> None:
        check(
            "CAPTCHAAI_SUBMIT_RATE",
            self.submit_rate is None or self.submit_rate >= 0,
            "must be >= 0 (0: no budget)",
        )
        check(
            "CAPTCHAAI_PROVIDER_NAME",
            bool(NAME_RE.fullmatch(self.name)),
            "must be 1-32 letters, digits, '_' or '-'",
        )
        check(
            "CAPTCHAAI_PROVIDER_KIND",
            self.kind in KINDS,
            f"is {self.kind!r}, not one of {', '.join(KINDS)}",
        )
        problem = base_url_problem(self.base_url, self.kind)
        check("CAPTCHAAI_BASE_URL", problem is None, problem or "")
        check(
            "CAPTCHAAI_OVERFLOW_AFTER",
            self.overflow_after is None or self.overflow_after > 0,
            "must be > 0",
        )
        check("CAPTCHAAI_CIRCUIT_FAILURES", self.circuit_failures >= 1, "must be at least 1")
        names = [self.name, *(p.name for p in self.extra)]
        dup = sorted({n for n in names if names.count(n) > 1})
        check("CAPTCHAAI_PROVIDERS", not dup, f"names {', '.join(dup)} more than once")
        self.primary  # noqa: B018  (the budgets are checked once here)

    @property
    def capacity(self) -> int:
        """Threads this deployment may use: the plan's minus the reserved headroom."""
        return self.threads - self.threads_reserved

    @cached_property
    def primary(self) -> ProviderSpec:
        """The primary provider: ``CAPTCHAAI_BASE_URL`` with ``CAPTCHAAI_API_KEY``."""
        budgets = parse_budgets(dict(self.budgets) or None, self.kind, "CAPTCHAAI_BUDGETS")
        if self.submit_rate is not None:
            budgets = replace(budgets, submit_rate=self.submit_rate or None)
        return ProviderSpec(
            name=self.name,
            base_url=self.base_url,
            api_key=self.api_key,
            threads=self.threads,
            role="primary",
            kind=self.kind,  # type: ignore[arg-type]
            budgets=budgets,
            reserved=self.threads_reserved,
        )

    @property
    def all(self) -> tuple[ProviderSpec, ...]:
        """Every provider, the primary first, in the order captchas go to them."""
        return (self.primary, *self.extra)

    def named(self, name: str | None) -> ProviderSpec:
        """The provider named ``name`` (None: the primary); KeyError if there is none."""
        if name is None or name == self.name:
            return self.primary
        for spec in self.extra:
            if spec.name == name:
                return spec
        raise KeyError(name)


@dataclass(frozen=True)
class AcceptanceSettings:
    """Routing by acceptance: when a site's tokens go to another provider
    (``settings.acceptance``)."""

    min: float = setting(
        "CAPTCHAAI_ACCEPTANCE_MIN",
        """a site's share of tokens accepted (the mean score for reCAPTCHA v3) at its
        provider below which it goes to the provider with the best lower confidence bound
        for it (needs two providers and reports, see ``report``).""",
        0.75,
        parse=float,
    )
    min_reports: float = setting(
        "CAPTCHAAI_ACCEPTANCE_MIN_REPORTS",
        "reports (decayed) at a provider before a site's acceptance there is judged.",
        10.0,
        parse=float,
    )
    explore: float = setting(
        "CAPTCHAAI_ACCEPTANCE_EXPLORE",
        """the share of a rerouted site's captchas that still go to the other providers, so
        that one that got better is noticed.""",
        0.05,
        parse=float,
    )
    half_life: float = setting(
        "CAPTCHAAI_ACCEPTANCE_HALF_LIFE",
        "seconds in which a report's weight halves.",
        21600.0,
        parse=float,
    )
    sites: int = setting(
        "CAPTCHAAI_ACCEPTANCE_SITES",
        "the sites whose acceptance is kept (the most reported; the rest are trimmed).",
        10000,
        parse=int,
    )

    def __post_init__(self) -> None:
        check("CAPTCHAAI_ACCEPTANCE_MIN", 0 <= self.min <= 1, "must be in [0, 1]")
        check("CAPTCHAAI_ACCEPTANCE_MIN_REPORTS", self.min_reports > 0, "must be > 0")
        check("CAPTCHAAI_ACCEPTANCE_EXPLORE", 0 <= self.explore < 1, "must be in [0, 1)")
        check("CAPTCHAAI_ACCEPTANCE_HALF_LIFE", self.half_life > 0, "must be > 0")
        check("CAPTCHAAI_ACCEPTANCE_SITES", self.sites >= 1, "must be at least 1")

    @property
    def policy(self) -> AcceptancePolicy:
        """The acceptance router's settings as the core takes them."""
        return AcceptancePolicy(self.min, self.min_reports, self.explore, self.half_life)
