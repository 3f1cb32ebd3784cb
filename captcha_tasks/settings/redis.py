"""Where Redis is (broker, result backend and state store), Sentinel's form of it included."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from ..errors import ConfigurationError
from .declare import check, check_url, flag, setting

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
#: Port of a sentinel whose address in REDIS_URL names none (Redis Sentinel's own default).
DEFAULT_SENTINEL_PORT = 26379
#: REDIS_URL's scheme for sentinels (Celery's and kombu's).
SENTINEL_SCHEME = "sentinel"


@dataclass(frozen=True)
class RedisSettings:
    """Where Redis is and which keys are ours (``settings.redis``)."""

    url: str = setting(
        "REDIS_URL",
        """broker, result backend and state store (``redis://``, ``rediss://``, or Celery's
        Sentinel form ``sentinel://[:password@]host:port[/db];sentinel://...``).""",
        DEFAULT_REDIS_URL,
        secret=True,
    )
    sentinel_master: str | None = setting(
        "REDIS_SENTINEL_MASTER",
        """the master's name the sentinels monitor (required with a ``sentinel://``
        REDIS_URL, read only with one).""",
        None,
    )
    sentinel_password: str = setting(
        "REDIS_SENTINEL_PASSWORD",
        """the sentinels' own password (their ``requirepass``), not the master's (that one
        is in REDIS_URL).""",
        "",
        secret=True,
    )
    sentinel_tls: bool = setting(
        "REDIS_SENTINEL_TLS",
        """TLS to the sentinels and to the Redis servers they name, both or neither
        (certificates verified).""",
        False,
        parse=flag,
    )
    sentinel_tls_ca_file: str | None = setting(
        "REDIS_SENTINEL_TLS_CA_FILE",
        """PEM file of the CA that signed the sentinels' and the servers' certificates
        (unset: the system's trusted CAs).""",
        None,
    )
    key_prefix: str = setting(
        "CAPTCHAAI_KEY_PREFIX", "prefix of every Redis key this package writes.", "captcha"
    )

    def __post_init__(self) -> None:
        check("CAPTCHAAI_KEY_PREFIX", bool(self.key_prefix.strip()), "must not be empty")
        if self.url.startswith(SENTINEL_SCHEME + "://"):
            self.sentinel  # noqa: B018  (parsed once here: a bad URL fails at start-up)
            return
        check_url("REDIS_URL", self.url, ("redis", "rediss", "unix"))
        for var, value in (
            ("REDIS_SENTINEL_MASTER", self.sentinel_master),
            ("REDIS_SENTINEL_PASSWORD", self.sentinel_password),
            ("REDIS_SENTINEL_TLS", self.sentinel_tls),
            ("REDIS_SENTINEL_TLS_CA_FILE", self.sentinel_tls_ca_file),
        ):
            check(var, not value, "is read only with a sentinel:// REDIS_URL")

    @cached_property
    def sentinel(self) -> RedisSentinel | None:
        """REDIS_URL and the REDIS_SENTINEL_* settings as one value, when REDIS_URL names
        sentinels (None otherwise)."""
        if not self.url.startswith(SENTINEL_SCHEME + "://"):
            return None
        return parse_sentinel(
            self.url,
            master=self.sentinel_master,
            sentinel_password=self.sentinel_password or None,
            tls=self.sentinel_tls,
            tls_ca_file=self.sentinel_tls_ca_file,
        )


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
    check("REDIS_URL", bool(parts), "names no sentinel")
    passwords = {unquote(p.password) for p in parts if p.password is not None}
    check(
        "REDIS_URL",
        len(passwords) <= 1,
        "gives different passwords to its sentinel:// parts (the Redis password is one)",
    )
    dbs = {_db(p) for p in parts if p.path.strip("/")}
    check("REDIS_URL", len(dbs) <= 1, "gives different databases to its sentinel:// parts")
    if not master or not master.strip():
        raise ConfigurationError(
            "REDIS_SENTINEL_MASTER must name the master when REDIS_URL is a sentinel:// URL"
        )
    check("REDIS_SENTINEL_MASTER", not re.search(r"\s", master), "must not contain spaces")
    check(
        "REDIS_SENTINEL_TLS_CA_FILE",
        tls_ca_file is None or tls,
        "is read only with REDIS_SENTINEL_TLS=1",
    )
    check(
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
    check("REDIS_URL", parts.scheme == SENTINEL_SCHEME and bool(parts.hostname), why)
    check(
        "REDIS_URL",
        not parts.query and not parts.fragment,
        "takes no options in a sentinel:// URL (use the REDIS_SENTINEL_* settings)",
    )
    # ACL users are not wired through every client yet: refuse one rather than have only
    # some clients (kombu's, Celery's) log in as it.
    check(
        "REDIS_URL",
        not parts.username,
        "takes a password only in a sentinel:// URL (sentinel://:password@host), no user",
    )
    return parts


def _db(parts: SplitResult) -> int:
    raw = parts.path.strip("/")
    check("REDIS_URL", raw.isdigit(), "must name its database as /<number> (or not at all)")
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
