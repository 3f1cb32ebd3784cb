"""The HTTP servers of a deployment: the pingback receiver and the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from .declare import Network, check, check_networks, check_url, networks, no_slash, setting


@dataclass(frozen=True)
class PingbackSettings:
    """The receiver of the providers' callbacks (``settings.pingback``)."""

    url: str | None = setting(
        "CAPTCHAAI_PINGBACK_URL",
        """base URL where the provider can reach our receiver (``captcha-tasks
        pingback-server``); set, every submit asks for a callback.""",
        None,
        parse=no_slash,
    )
    secret: str = setting(
        "CAPTCHAAI_PINGBACK_SECRET",
        """key of the MAC in every callback URL (required with CAPTCHAAI_PINGBACK_URL, at
        least 16 characters).""",
        "",
        secret=True,
    )
    fallback_poll: float = setting(
        "CAPTCHAAI_PINGBACK_FALLBACK_POLL",
        """while callbacks arrive, a captcha whose callback has not come this many seconds
        after its method's 95th percentile solve time (learned from the answers) is polled:
        its callback is overdue (a lost one costs latency only).""",
        1.0,
        parse=float,
    )
    trusted_proxies: tuple[Network, ...] = setting(
        "CAPTCHAAI_PINGBACK_TRUSTED_PROXIES",
        """networks (CIDRs) of the reverse proxies in front of the receiver; a request from
        one of them is judged by the client address its ``X-Forwarded-For`` names (the
        right-most one outside these networks).""",
        (),
        parse=networks,
    )
    allow: tuple[Network, ...] = setting(
        "CAPTCHAAI_PINGBACK_ALLOW",
        """networks (CIDRs) the receiver takes requests from (empty: any); a connection from
        elsewhere is closed before anything is read.""",
        (),
        parse=networks,
    )

    def __post_init__(self) -> None:
        check("CAPTCHAAI_PINGBACK_FALLBACK_POLL", self.fallback_poll > 0, "must be > 0")
        check_networks("CAPTCHAAI_PINGBACK_TRUSTED_PROXIES", self.trusted_proxies)
        check_networks("CAPTCHAAI_PINGBACK_ALLOW", self.allow)
        if self.url is None:
            return
        check_url("CAPTCHAAI_PINGBACK_URL", self.url, ("http", "https"))
        check(
            "CAPTCHAAI_PINGBACK_URL",
            not urlsplit(self.url).query,
            "must not carry a query string (the provider appends its own)",
        )
        check(
            "CAPTCHAAI_PINGBACK_SECRET",
            len(self.secret) >= 16,
            "must be set (at least 16 characters) when CAPTCHAAI_PINGBACK_URL is",
        )

    @property
    def enabled(self) -> bool:
        """Whether submits ask the provider to call back."""
        return self.url is not None


@dataclass(frozen=True)
class GatewaySettings:
    """Who may reach the gateway (``captcha-tasks gateway``; ``settings.gateway``)."""

    trusted_proxies: tuple[Network, ...] = setting(
        "CAPTCHAAI_GATEWAY_TRUSTED_PROXIES",
        """networks (CIDRs) of the reverse proxies in front of the gateway (``captcha-tasks
        gateway``); a request from one of them is judged by the client address its
        ``X-Forwarded-For`` names.""",
        (),
        parse=networks,
    )
    allow: tuple[Network, ...] = setting(
        "CAPTCHAAI_GATEWAY_ALLOW",
        """networks (CIDRs) the gateway takes connections from (empty: any); a connection
        from elsewhere is closed before anything is read.""",
        (),
        parse=networks,
    )

    def __post_init__(self) -> None:
        check_networks("CAPTCHAAI_GATEWAY_TRUSTED_PROXIES", self.trusted_proxies)
        check_networks("CAPTCHAAI_GATEWAY_ALLOW", self.allow)
