"""Exceptions, split by what the caller should do next.

    CaptchaTasksError                  root of everything raised here
    ├── ConfigurationError             bad setting; fix the environment (raised at start-up)
    ├── ValidationError                bad solve request; fix the call (raised before queueing)
    │   ├── PoolNotFound               the named token pool is not declared
    │   ├── BadTicket                  a callback path this deployment did not issue
    │   │   └── BadMac                 ... or whose MAC is wrong (forged, another secret)
    │   └── BadMessage                 a Kafka message the bridge cannot answer or record
    ├── RetryableError                 back off and try the same request again
    │   ├── NoSlotError                no free provider thread (ERROR_NO_SLOT_AVAILABLE)
    │   ├── ProviderDown               the provider is out of rotation: the captcha goes
    │   │                              to another one
    │   ├── TransportError             timeout, connection error, HTTP 5xx, HTML or empty body
    │   ├── RateLimited                HTTP 429, ERROR_TOO_MUCH_REQUESTS: wait ``retry_after``
    │   │                              s (account wide, no retry spent)
    │   ├── ServerError                ERROR_SERVER_ERROR, MAX_USER_TURN
    │   ├── StoreUnavailable           Redis is down: nothing is submitted until it is back
    │   ├── NoProxyAvailable           every pooled proxy is taken or cooling off
    │   ├── SessionError               a shared session is not usable right now
    │   │   ├── SessionBusy            another worker holds the domain's session lock
    │   │   └── ReauthTimeout          nobody produced fresh cookies before the deadline
    │   ├── KafkaDeliveryError         the Kafka brokers did not acknowledge a message
    │   └── KafkaUnavailable           the Kafka brokers did not answer in time
    ├── ResubmitError                  the captcha failed; submit a new one (bounded)
    │   ├── UnsolvableError            ERROR_CAPTCHA_UNSOLVABLE, ERROR_BAD_DUPLICATES
    │   └── TokenExpired               the answer's life ran out before delivery
    ├── FatalError                     fail fast, never retried
    │   ├── AuthError                  ERROR_WRONG_USER_KEY, ERROR_KEY_DOES_NOT_EXIST, IP_BANNED
    │   ├── ZeroBalance                ERROR_ZERO_BALANCE at every provider that takes it
    │   ├── BadRequestError            ERROR_GOOGLEKEY, ERROR_PAGEURL, ERROR_BAD_PARAMETERS, ...
    │   ├── ProxyError                 ERROR_PROXY_CONNECTION_FAILED, ERROR_BAD_PROXY
    │   ├── UnknownAPIError            any other ERROR_* code (kept on ``code``)
    │   └── InternalError              ERROR_INTERNAL: a failure inside captcha-tasks ended
    │                                  the solve (the message names the exception's type)
    └── GaveUpError                    a budget ran out; the last cause is kept
        ├── SolveTimeout               the solve deadline passed
        ├── RetriesExhausted           transport / resubmit budget used up
        ├── Revoked                    ERROR_REVOKED: revoked, or expired before its submit
        └── BudgetExceeded             ERROR_BUDGET_EXCEEDED: the tenant's daily_captchas
                                       are spent (no in.php was sent)

"Not ready yet" is a value (``captcha_tasks.providers.inphp.NOT_READY``), never an exception.

Every exception carries ``code`` (the API's error code, or one of ours such as
``ERROR_SOLVE_TIMEOUT``) and ``captcha_id`` when one is known.  The constructor takes
``(message, code, captcha_id)`` positionally so that Celery's JSON result backend can
rebuild the exact type on the caller's side of ``AsyncResult.get()``.
"""

from __future__ import annotations


class CaptchaTasksError(Exception):
    """Root of every exception raised by captcha-tasks."""

    default_code = "ERROR_CAPTCHA_TASKS"

    def __init__(
        self, message: str = "", code: str | None = None, captcha_id: str | None = None
    ) -> None:
        self.message = message
        self.code = code or self.default_code
        self.captcha_id = captcha_id
        super().__init__(message, self.code, captcha_id)

    def __str__(self) -> str:
        suffix = f" (captcha {self.captcha_id})" if self.captcha_id else ""
        if self.message and self.message != self.code:
            return f"{self.code}: {self.message}{suffix}"
        return f"{self.code}{suffix}"

    def __reduce__(self) -> tuple[type[CaptchaTasksError], tuple[str, str, str | None]]:
        return (type(self), (self.message, self.code, self.captcha_id))


class ConfigurationError(CaptchaTasksError, ValueError):
    """A setting is wrong: fix the environment variable the message names (a process stops
    at its start, exit code 78)."""

    default_code = "ERROR_CONFIGURATION"


class ValidationError(CaptchaTasksError, ValueError):
    """The solve request is wrong (unknown method or argument, a missing or bad value): fix the
    call; nothing was queued."""

    default_code = "ERROR_VALIDATION"


class PoolNotFound(ValidationError):
    """The named pool is not declared (not in the registry)."""

    default_code = "ERROR_POOL_NOT_FOUND"


class BadTicket(ValidationError):
    """A callback path that is not a ticket this deployment issued."""

    default_code = "ERROR_BAD_PINGBACK"


class BadMac(BadTicket):
    """A ticket whose MAC is wrong: forged, or signed with another secret."""


class BadMessage(ValidationError):
    """A Kafka message the bridge cannot answer or record: not JSON, not an object, no
    task_id; a feedback message naming no result it can report on."""

    default_code = "ERROR_BAD_MESSAGE"


class RetryableError(CaptchaTasksError):
    """A passing condition: the workers back off and try the same request again for you; a caller
    sees it only when it happened before anything was queued."""

    default_code = "ERROR_RETRYABLE"


class NoSlotError(RetryableError):
    """The provider has no free thread for the account: the submit waits and is tried again;
    check the plan and `captcha-tasks account` if it lasts."""

    default_code = "ERROR_NO_SLOT_AVAILABLE"


class ProviderDown(RetryableError):
    """The provider is out of rotation (its circuit is open: it stopped answering, or refused
    the key): the captcha it had is submitted to another provider for you."""

    default_code = "ERROR_PROVIDER_DOWN"


class TransportError(RetryableError):
    """A timeout, a connection error, HTTP 5xx, or an HTML or empty reply: retried with back-off."""

    default_code = "ERROR_TRANSPORT"


#: Seconds to wait when the API asks to slow down without saying how long (an HTTP 429
#: without a usable ``Retry-After``, ``ERROR_TOO_MUCH_REQUESTS``: CaptchaAI says 3-10 s).
DEFAULT_RETRY_AFTER = 5.0


class RateLimited(RetryableError):
    """The API asks every client of the key to slow down (HTTP 429, which may say how long in
    ``Retry-After``; `ERROR_TOO_MUCH_REQUESTS`): the whole account holds its requests for
    ``retry_after`` seconds, without spending a retry."""

    default_code = "ERROR_RATE_LIMITED"

    def __init__(
        self,
        message: str = "",
        code: str | None = None,
        captcha_id: str | None = None,
        retry_after: float = DEFAULT_RETRY_AFTER,
    ) -> None:
        super().__init__(message, code, captcha_id)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[type[RateLimited], tuple[str, str, str | None, float]]:  # type: ignore[override]
        return (type(self), (self.message, self.code, self.captcha_id, self.retry_after))


class ServerError(RetryableError):
    """The API said it failed (`ERROR_SERVER_ERROR`, `MAX_USER_TURN`): retried with back-off."""

    default_code = "ERROR_SERVER_ERROR"


class StoreUnavailable(RetryableError):
    """Redis is down or `REDIS_URL` is wrong (the message shows it, password masked): nothing is
    submitted until Redis answers; restore Redis or fix `REDIS_URL`."""

    default_code = "ERROR_REDIS_UNAVAILABLE"


class NoProxyAvailable(RetryableError):
    """Every proxy of the shared pool is taken or cooling off: retried; add proxies to
    `CAPTCHAAI_PROXIES` if it lasts."""

    default_code = "ERROR_NO_PROXY_AVAILABLE"


class SessionError(RetryableError):
    """A shared session is not usable right now; try again shortly."""

    default_code = "ERROR_SESSION"


class SessionBusy(SessionError):
    """Another worker holds the domain's session lock."""

    default_code = "ERROR_SESSION_LOCKED"


class ReauthTimeout(SessionError):
    """Nobody produced fresh cookies for the domain before the deadline."""

    default_code = "ERROR_REAUTH_TIMEOUT"


class KafkaDeliveryError(RetryableError):
    """The brokers did not acknowledge a message (after librdkafka's own retries)."""

    default_code = "ERROR_KAFKA_DELIVERY"


class KafkaUnavailable(RetryableError):
    """The brokers did not answer a metadata or admin request in time."""

    default_code = "ERROR_KAFKA_UNAVAILABLE"


class ResubmitError(CaptchaTasksError):
    """This captcha failed: a new one is submitted for you, within `CAPTCHAAI_MAX_RESUBMITS`."""

    default_code = "ERROR_RESUBMIT"


class UnsolvableError(ResubmitError):
    """The provider could not solve the captcha: a new one is submitted for you (bounded)."""

    default_code = "ERROR_CAPTCHA_UNSOLVABLE"


class TokenExpired(ResubmitError):
    """The answer's life ran out before it could be delivered: solved again within the deadline."""

    default_code = "ERROR_TOKEN_EXPIRED"


class FatalError(CaptchaTasksError):
    """Never retried: the request or the account is wrong; fix what the message says."""

    default_code = "ERROR_FATAL"


class AuthError(FatalError):
    """The API rejects the key or this host (`ERROR_WRONG_USER_KEY`, `ERROR_KEY_DOES_NOT_EXIST`,
    `IP_BANNED`, `ERROR_IP_NOT_ALLOWED`): check `CAPTCHAAI_API_KEY`, `CAPTCHAAI_BASE_URL` and the
    account's IP list."""

    default_code = "ERROR_WRONG_USER_KEY"


class ZeroBalance(FatalError):
    """The account's balance is empty (`ERROR_ZERO_BALANCE`) at every provider that takes the
    method: top one up (`captcha-tasks providers` shows each balance).  The provider is out of
    rotation until a probe finds money on it again."""

    default_code = "ERROR_ZERO_BALANCE"


class BadRequestError(FatalError):
    """The API refused the parameters (bad sitekey, pageurl, image or parameters): fix the call."""

    default_code = "ERROR_BAD_PARAMETERS"


class ProxyError(FatalError):
    """The proxy you passed could not be used by the provider: fix or replace it (a pooled proxy is
    quarantined and the solve resubmitted instead)."""

    default_code = "ERROR_BAD_PROXY"


class UnknownAPIError(FatalError):
    """An `ERROR_*` code this package does not know (kept on `code`): not retried; look the code up
    in the provider's documentation."""

    default_code = "ERROR_UNKNOWN"


class InternalError(FatalError):
    """Something inside captcha-tasks failed while the solve was worked (a bug, or a reply
    nothing expected): the solve ended, its thread was freed.  The message names the
    exception's type and where; the worker's log has the traceback.  Report it."""

    default_code = "ERROR_INTERNAL"


class GaveUpError(CaptchaTasksError):
    """A budget ran out; the last cause is in the message."""

    default_code = "ERROR_GAVE_UP"


class SolveTimeout(GaveUpError):
    """The solve's deadline (`CAPTCHAAI_SOLVE_TIMEOUT`) passed: try again later, or raise the
    deadline if solves are slow."""

    default_code = "ERROR_SOLVE_TIMEOUT"


class RetriesExhausted(GaveUpError):
    """The transport or resubmit budget was used up (`CAPTCHAAI_TRANSPORT_RETRIES`,
    `CAPTCHAAI_MAX_RESUBMITS`): the API kept failing; look at the cause in the message."""

    default_code = "ERROR_RETRIES_EXHAUSTED"


class Revoked(GaveUpError):
    """The solve was revoked (``AsyncResult.revoke()``), or its ``expires`` passed before it
    was submitted: no captcha was sent for it, or its answer was discarded.  From
    ``AsyncResult.get()`` it is Celery's ``TaskRevokedError``, as for any revoked task."""

    default_code = "ERROR_REVOKED"


class BudgetExceeded(GaveUpError):
    """The solve's tenant spent its ``daily_captchas`` for today (``CAPTCHAAI_TENANTS``): no
    captcha was sent for it.  Budgets reset at 00:00 UTC; raise the budget or wait."""

    default_code = "ERROR_BUDGET_EXCEEDED"


_BY_CODE: dict[str, type[CaptchaTasksError]] = {
    "ERROR_NO_SLOT_AVAILABLE": NoSlotError,
    "ERROR_ZERO_BALANCE": ZeroBalance,
    "ERROR_SERVER_ERROR": ServerError,
    "MAX_USER_TURN": ServerError,
    "ERROR_CAPTCHA_UNSOLVABLE": UnsolvableError,
    "ERROR_WRONG_USER_KEY": AuthError,
    "ERROR_KEY_DOES_NOT_EXIST": AuthError,
    "ERROR_TOO_MUCH_REQUESTS": RateLimited,
    "ERROR_BAD_DUPLICATES": UnsolvableError,
    "ERROR_CAPTCHAIMAGE_BLOCKED": BadRequestError,
    "ERROR_BAD_TOKEN_OR_PAGEURL": BadRequestError,
    "ERROR_WRONG_ID_FORMAT": BadRequestError,
    "ERROR_DOMAIN_NOT_ALLOWED": BadRequestError,
    "IP_BANNED": AuthError,
    "ERROR_IP_NOT_ALLOWED": AuthError,
    "ERROR_GOOGLEKEY": BadRequestError,
    "ERROR_PAGEURL": BadRequestError,
    "ERROR_BAD_PARAMETERS": BadRequestError,
    "ERROR_WRONG_CAPTCHA_ID": BadRequestError,
    "ERROR_ZERO_CAPTCHA_FILESIZE": BadRequestError,
    "ERROR_TOO_BIG_CAPTCHA_FILESIZE": BadRequestError,
    "ERROR_WRONG_FILE_EXTENSION": BadRequestError,
    "ERROR_IMAGE_TYPE_NOT_SUPPORTED": BadRequestError,
    "ERROR_PROXY_CONNECTION_FAILED": ProxyError,
    "ERROR_BAD_PROXY": ProxyError,
}

# Our own codes map back to their classes too, so a failed outcome read from Redis or
# Kafka rebuilds the same type that was raised in the worker.
for _cls in (
    ValidationError,
    TransportError,
    TokenExpired,
    StoreUnavailable,
    NoProxyAvailable,
    SolveTimeout,
    RetriesExhausted,
    UnknownAPIError,
    InternalError,
    Revoked,
    ProviderDown,
    BudgetExceeded,
):
    _BY_CODE.setdefault(_cls.default_code, _cls)

PROXY_CODES = frozenset(code for code, cls in _BY_CODE.items() if cls is ProxyError)

_KEY_HINT = "the API rejects the key: check CAPTCHAAI_API_KEY (and CAPTCHAAI_BASE_URL)"
#: What to do, for the codes whose name does not say it (shown as the error's message and
#: on the error-code reference page).
HINTS = {
    "ERROR_WRONG_USER_KEY": _KEY_HINT,
    "ERROR_KEY_DOES_NOT_EXIST": f"{_KEY_HINT}; on CaptchaAI it also means the account has no "
    "threads: start a trial or subscribe to a plan",
    "ERROR_TOO_MUCH_REQUESTS": "the API asks the key's clients to slow down: every request of "
    f"the account waits {DEFAULT_RETRY_AFTER:g} s, and the captcha is tried again (no retry is "
    "spent)",
    "ERROR_BAD_DUPLICATES": "the provider's workers could not agree on an answer often enough: "
    "a new captcha is submitted (bounded by CAPTCHAAI_MAX_RESUBMITS)",
    "ERROR_CAPTCHAIMAGE_BLOCKED": "the provider refuses this image (it is marked "
    "unrecognisable): send another captcha image",
    "ERROR_BAD_TOKEN_OR_PAGEURL": "the sitekey or token does not belong to pageurl: read "
    "fresh parameters from the page",
    "ERROR_WRONG_ID_FORMAT": "the provider does not recognise the captcha id's format (it "
    "takes digits only): check that CAPTCHAAI_BASE_URL is the provider that issued the id",
    "ERROR_DOMAIN_NOT_ALLOWED": "the provider does not solve captchas of pageurl's domain: "
    "not retried",
    "ERROR_IP_NOT_ALLOWED": "this host's IP address is not allowed for the key: check the "
    "account's IP list",
    "IP_BANNED": "the API banned this host's IP address for a while (too many bad requests)",
}


def codes() -> dict[str, type[CaptchaTasksError]]:
    """Every error code this package raises or maps: the API's codes and our own."""
    found = dict(_BY_CODE)
    for cls in _tree(CaptchaTasksError):
        found.setdefault(cls.default_code, cls)
    return found


def _tree(cls: type[CaptchaTasksError]) -> list[type[CaptchaTasksError]]:
    # Only this module's classes: what other modules subclass is theirs to document.
    below = (c for sub in cls.__subclasses__() if sub.__module__ == __name__ for c in _tree(sub))
    return [cls, *below]


def from_api_code(
    code: str, captcha_id: str | None = None, message: str | None = None
) -> CaptchaTasksError:
    """The exception for an error code; unknown ``ERROR_*`` codes are fatal."""
    cls = _BY_CODE.get(code, UnknownAPIError)
    return cls(message or HINTS.get(code, code), code, captcha_id)
