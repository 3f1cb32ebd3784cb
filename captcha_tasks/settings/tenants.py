"""The tenants sharing the account (the lanes are fixed: :data:`~..core.lanes.LANES`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..core.lanes import DEFAULT_TENANT, Tenant, parse_tenants, tenant_of
from .declare import check, setting


@dataclass(frozen=True)
class TenantSettings:
    """The declared tenants (``settings.tenants``)."""

    declared: Mapping[str, Tenant] = setting(
        "CAPTCHAAI_TENANTS",
        """the tenants sharing the account, a JSON object of name -> ``{weight,
        max_threads, daily_captchas, key_env, requests_per_s, callback_hosts}`` (each
        optional): freed threads go to them in proportion to ``weight``, ``max_threads``
        caps one, ``daily_captchas`` is its budget per UTC day; for the gateway, ``key_env``
        names the variable holding its key, ``requests_per_s`` caps its requests to one
        gateway process (default 100) and ``callback_hosts`` lists the hosts (``name``,
        ``name:port``, an IP address; lower-cased, exact; no port: 80 / 443 only) its
        ``pingback`` / ``callbackUrl`` may name (default none: refused); ``default`` exists
        undeclared.""",
        factory=dict,
        parse=parse_tenants,
    )

    def __post_init__(self) -> None:
        for name, tenant in self.declared.items():
            check(
                "CAPTCHAAI_TENANTS",
                isinstance(tenant, Tenant) and tenant.name == name,
                f"must map each name to its Tenant (got {name!r})",
            )

    def get(self, name: str = DEFAULT_TENANT) -> Tenant:
        """The tenant ``name`` (undeclared ones: weight 1, no cap, no budget)."""
        return tenant_of(name, self.declared)

    @property
    def names(self) -> tuple[str, ...]:
        """Every tenant a solve may name: the declared ones and ``default``."""
        return tuple(sorted({DEFAULT_TENANT, *self.declared}))
