"""Keep secrets out of logs, Flower and task events.

Every provider's API key, every tenant's gateway key, the pingback secret, proxy
passwords and cookie values are never written out; tokens are cut to a short prefix.
:class:`RedactingFilter` is installed on every handler of a Celery
process (worker, beat, flower) and of every other process of ours
(:func:`configure_logging`: the gateway, the receiver, the Kafka bridge, the exporter), and
can be added to an application's own logging.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..settings import Settings

#: Solve parameters that must never appear in a log line, a task event or Flower.
SECRET_PARAMS = frozenset({"proxy", "cookies"})
TOKEN_PREFIX = 8

_PROXY_CREDS = re.compile(r"(?P<user>[\w.%+-]+):(?P<pw>[^@\s'\"/]+)@(?P<host>[\w.-]+:\d+)")
_TOKEN_FIELD = re.compile(
    r"(?P<head>['\"]token['\"]\s*:\s*['\"])(?P<tok>[^'\"]{" + str(TOKEN_PREFIX) + ",})"
)
_COOKIES_FIELD = re.compile(r"(?P<head>['\"]cookies['\"]\s*:\s*['\"])(?P<val>[^'\"]*)")
_KEY_FIELD = re.compile(r"(?P<head>\bkey=)(?P<val>[^&\s'\"]+)")
#: A shorter value is not taken for a secret (replacing it would mangle every line).
SECRET_MIN_LEN = 4
#: Where a filter finds the settings whose secrets it removes (an app's ``settings``).
SettingsSource = Callable[[], Settings]


def secrets_of(settings: Settings, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every secret value ``settings`` names: the primary's and each provider's API key,
    each tenant's gateway key (from its ``key_env`` in ``environ``, as the gateway reads
    it) and the pingback secret; longest first, so a key inside another is not half-cut."""
    env = os.environ if environ is None else environ
    values = {settings.providers.api_key, settings.pingback.secret}
    values.update(provider.api_key for provider in settings.providers.extra)
    values.update(
        env.get(tenant.key_env, "").strip()
        for tenant in settings.tenants.declared.values()
        if tenant.key_env
    )
    kept = (value for value in values if len(value) >= SECRET_MIN_LEN)
    return tuple(sorted(kept, key=len, reverse=True))


class _Secrets:
    """The secrets of the settings ``source`` gives, worked out again when they change
    (``app.use``)."""

    def __init__(self, source: SettingsSource | None) -> None:
        self.source = source
        self._known: tuple[Settings, tuple[str, ...]] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> tuple[str, ...]:
        if self.source is None:
            return ()
        settings = self.source()
        known = self._known
        if known is None or known[0] is not settings:
            with self._lock:
                self._known = known = (settings, secrets_of(settings))
        return known[1]


def mask_proxy(proxy: str) -> str:
    """``user:pass@host:port`` -> ``user:***@host:port``."""
    return _PROXY_CREDS.sub(r"\g<user>:***@\g<host>", proxy)


def mask_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of solve keyword arguments that is safe to show."""
    shown: dict[str, Any] = {}
    for name, value in params.items():
        if name == "proxy" and isinstance(value, str):
            shown[name] = mask_proxy(value) if "@" in value else value
        elif name == "cookies":
            shown[name] = "***"
        elif name == "body" and isinstance(value, str | bytes):
            shown[name] = f"<image, {len(value)} base64 chars>"
        elif name == "images" and isinstance(value, list | tuple):
            shown[name] = f"<{len(value)} images>"
        else:
            shown[name] = value
    return shown


def redact_text(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Remove ``secrets`` (:func:`secrets_of`), every ``key=`` value, proxy passwords and
    cookie values; shorten tokens."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    # Each pattern needs a marker character or word; most log lines have none of them.
    if "@" in text:
        text = _PROXY_CREDS.sub(r"\g<user>:***@\g<host>", text)
    if "cookies" in text:
        text = _COOKIES_FIELD.sub(r"\g<head>***", text)
    if "key=" in text:
        text = _KEY_FIELD.sub(r"\g<head>***", text)
    if "token" in text:
        text = _TOKEN_FIELD.sub(_short_token, text)
    return text


def _short_token(match: re.Match[str]) -> str:
    return match.group("head") + match.group("tok")[:TOKEN_PREFIX] + "…"


class RedactingFilter(logging.Filter):
    """A logging filter that redacts every record's final message: the secrets of the
    settings ``settings`` returns (an app's ``settings``, read at each record; none: only
    what every line loses, ``key=`` values, proxy passwords, cookies, whole tokens)."""

    def __init__(self, settings: SettingsSource | None = None) -> None:
        super().__init__()
        self._secrets = _Secrets(settings)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        secrets = self._secrets()
        clean = redact_text(message, secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            trace = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact_text(trace, secrets)
        return True


def configure_logging(
    level: str | int,
    settings: SettingsSource,
    fmt: str = "%(asctime)s %(levelname)s %(message)s",
) -> None:
    """The logging of a command's own process (the gateway, the pingback receiver, the Kafka
    bridge, the exporter): ``level`` to stderr, every line redacted as a worker's are, of
    the secrets of ``settings()``.  The one place a process of ours configures logging."""
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, format=fmt)
    install(None, settings)


def install(logger: logging.Logger | None = None, settings: SettingsSource | None = None) -> None:
    """Add the filter, removing the secrets of ``settings()`` (an app's ``settings``), to
    every handler of ``logger`` (default: the root logger)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter(settings))
