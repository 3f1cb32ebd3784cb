"""The one shape of a solve's outcome, shared by ``solve``, batch output and Kafka.

Solved::

    {"status": "solved", "token": "03A...", "captcha_id": "7000001", "method": "turnstile",
     "source": "api", "elapsed_s": 12.4, "solved_at": "2026-...Z", "expires_at": "2026-...Z",
     "provider": "captchaai", "site": "example.com#0x4AAA..."}

Failed::

    {"status": "failed", "error": "ERROR_CAPTCHA_UNSOLVABLE", "message": "...",
     "captcha_id": "7000001", "method": "turnstile", "elapsed_s": 40.2,
     "provider": "captchaai"}

``provider`` names the provider that solved the captcha (``captcha_id`` is its id: two
providers may issue the same one); a failure names the provider it last went to, and has
none when it never reached one.  ``site`` is the site the token is for (the page's host
and the sitekey): ``report`` counts the site's acceptance of the provider's tokens by it.

``token`` is a string, an object (GeeTest, Lemin) or a list of cells (grid, BLS).  Times are
ISO 8601 in UTC.  ``user_agent`` is there when the provider returned one (the Cloudflare
challenge, CaptchaFox, reCAPTCHA Enterprise): the token only works sent with that agent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ..errors import CaptchaTasksError

Token = str | dict[str, Any] | list[Any]


def iso(ts: float) -> str:
    """ISO 8601 UTC with milliseconds for a Unix timestamp."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class Solved:
    """A solved captcha.  ``solved_at`` and ``expires_at`` are Unix timestamps here and
    ISO 8601 strings in :meth:`to_dict` (the outcome dict every caller sees)."""

    token: Token
    captcha_id: str
    method: str
    source: Literal["api", "pool"]
    elapsed_s: float
    solved_at: float
    expires_at: float
    status: Literal["solved"] = "solved"
    #: The user agent the provider solved with; the token must be used with it.
    user_agent: str | None = None
    #: The provider that solved it (a pooled token: the one that solved it for the pool).
    provider: str | None = None
    #: The site the token is for (``core.acceptance.site_of``): what a report counts for.
    site: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for optional in ("user_agent", "provider", "site"):
            if data[optional] is None:
                del data[optional]
        data["solved_at"], data["expires_at"] = iso(self.solved_at), iso(self.expires_at)
        # status first, the token last: a truncated repr shows the facts, not the secret
        return {
            "status": data.pop("status"),
            **{k: v for k, v in data.items() if k != "token"},
            "token": data["token"],
        }


@dataclass(frozen=True)
class Failed:
    error: str
    message: str
    method: str | None = None
    captcha_id: str | None = None
    elapsed_s: float | None = None
    status: Literal["failed"] = "failed"
    #: The provider it last went to (None: it never reached one).
    provider: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if data["provider"] is None:
            del data["provider"]
        return data

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        method: str | None = None,
        elapsed_s: float | None = None,
        provider: str | None = None,
    ) -> Failed:
        if isinstance(exc, CaptchaTasksError):
            message = exc.message or exc.code
            return cls(exc.code, message, method, exc.captcha_id, elapsed_s, provider=provider)
        message = f"{type(exc).__name__}: {exc}"
        return cls("ERROR_INTERNAL", message, method, None, elapsed_s, provider=provider)


Outcome = Solved | Failed


def from_pool(record: Mapping[str, Any], elapsed_s: float, now: float) -> Solved:
    """A pooled token as its taker's outcome: ``record`` is what the pool holds (the refill's
    outcome, with ``remaining_s`` from the take), handed out at ``now`` (Unix time) after
    ``elapsed_s``; ``source`` is "pool" and its life is what is left of it."""
    return Solved(
        token=record["token"],
        captcha_id=str(record["captcha_id"]),
        method=record["method"],
        source="pool",
        elapsed_s=round(elapsed_s, 3),
        solved_at=parse_iso(record["solved_at"]),
        expires_at=now + float(record["remaining_s"]),
        user_agent=record.get("user_agent"),
        provider=record.get("provider"),
        site=record.get("site"),
    )


def outcome_from_dict(data: dict[str, Any]) -> Outcome:
    """Rebuild an outcome from its dict form (a task result, a JSONL line, a message)."""
    if data.get("status", "solved") == "failed":
        return Failed(
            data["error"],
            data.get("message") or data["error"],
            data.get("method"),
            data.get("captcha_id"),
            data.get("elapsed_s"),
            provider=data.get("provider"),
        )
    return Solved(
        data["token"],
        str(data["captcha_id"]),
        data["method"],
        data["source"],
        float(data["elapsed_s"]),
        parse_iso(data["solved_at"]),
        parse_iso(data["expires_at"]),
        user_agent=data.get("user_agent"),
        provider=data.get("provider"),
        site=data.get("site"),
    )
