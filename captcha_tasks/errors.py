"""Exceptions, split by what the caller should do next.

    CaptchaTasksError                  root of everything raised here
    ├── ConfigurationError             bad setting; fix the environment (raised at start-up)
    ├── ValidationError                bad solve request; fix the call (raised before queueing)
    │   ├── PoolNotFound               the named token pool is not declared
    │   ├── BadTicket                  a callback path this deployment did not issue
    │   │   └── BadMac                 ... or whose MAC is wrong (forged, another secret)
    │   └── BadMessage                 a Kafka task message the bridge cannot answer
    ├── RetryableError                 back off and try the same request again
    │   ├── NoSlotError                no free provider thread (ERROR_NO_SLOT_AVAILABLE,
    │   │                              ERROR_ZERO_BALANCE)
    │   ├── TransportError             timeout, connection error, HTTP 5xx, HTML or empty body
    │   ├── RateLimited                HTTP 429: wait ``retry_after`` s (account wide)
    │   ├── ServerError                ERROR_SERVER_ERROR, MAX_USER_TURN
    │   ├── StoreUnavailable           Redis is down: nothing is submitted until it is back
    │   ├── NoProxyAvailable           every pooled proxy is taken or cooling off
    │   ├── SessionError               a shared session is not usable right now
    │   │   ├── SessionBusy            another worker holds the domain's session lock
    │   │   └── ReauthTimeout          nobody produced fresh cookies before the deadline
    │   ├── KafkaDeliveryError         the Kafka brokers did not acknowledge a message
    │   └── KafkaUnavailable           the Kafka brokers did not answer in time
    ├── ResubmitError                  the captcha failed; submit a new one (bounded)
    │   ├── UnsolvableError            ERROR_CAPTCHA_UNSOLVABLE
    │   └── TokenExpired               the answer's life ran out before delivery
    ├── FatalError                     fail fast, never retried
    │   ├── AuthError                  ERROR_WRONG_USER_KEY, ERROR_KEY_DOES_NOT_EXIST, IP_BANNED
    │   ├── BadRequestError            ERROR_GOOGLEKEY, ERROR_PAGEURL, ERROR_BAD_PARAMETERS, ...
    │   ├── ProxyError                 ERROR_PROXY_CONNECTION_FAILED, ERROR_BAD_PROXY
    │   └── UnknownAPIError            any other ERROR_* code (kept on ``code``)
    └── GaveUpError                    a budget ran out; the last cause is kept
        ├── SolveTimeout               the solve deadline passed
        └── RetriesExhausted           transport / resubmit budget used up

"Not ready yet" is a value (``captcha_tasks.client.NOT_READY``), never an exception.

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
    default_code = "ERROR_CONFIGURATION"


class ValidationError(CaptchaTasksError, ValueError):
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
    """A task message the Kafka bridge cannot answer: not JSON, not an object, or no
    task_id."""

    default_code = "ERROR_BAD_MESSAGE"


class RetryableError(CaptchaTasksError):
    default_code = "ERROR_RETRYABLE"


class NoSlotError(RetryableError):
    default_code = "ERROR_NO_SLOT_AVAILABLE"


class TransportError(RetryableError):
    default_code = "ERROR_TRANSPORT"


class RateLimited(RetryableError):
    """HTTP 429: the API asks every client of the key to wait ``retry_after`` seconds."""

    default_code = "ERROR_RATE_LIMITED"

    def __init__(
        self,
        message: str = "",
        code: str | None = None,
        captcha_id: str | None = None,
        retry_after: float = 0.0,
    ) -> None:
        super().__init__(message, code, captcha_id)
        self.retry_after = retry_after


class ServerError(RetryableError):
    default_code = "ERROR_SERVER_ERROR"


class StoreUnavailable(RetryableError):
    default_code = "ERROR_REDIS_UNAVAILABLE"


class NoProxyAvailable(RetryableError):
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
    default_code = "ERROR_RESUBMIT"


class UnsolvableError(ResubmitError):
    default_code = "ERROR_CAPTCHA_UNSOLVABLE"


class TokenExpired(ResubmitError):
    default_code = "ERROR_TOKEN_EXPIRED"


class FatalError(CaptchaTasksError):
    default_code = "ERROR_FATAL"


class AuthError(FatalError):
    default_code = "ERROR_WRONG_USER_KEY"


class BadRequestError(FatalError):
    default_code = "ERROR_BAD_PARAMETERS"


class ProxyError(FatalError):
    default_code = "ERROR_BAD_PROXY"


class UnknownAPIError(FatalError):
    default_code = "ERROR_UNKNOWN"


class GaveUpError(CaptchaTasksError):
    default_code = "ERROR_GAVE_UP"


class SolveTimeout(GaveUpError):
    default_code = "ERROR_SOLVE_TIMEOUT"


class RetriesExhausted(GaveUpError):
    default_code = "ERROR_RETRIES_EXHAUSTED"


_BY_CODE: dict[str, type[CaptchaTasksError]] = {
    "ERROR_NO_SLOT_AVAILABLE": NoSlotError,
    "ERROR_ZERO_BALANCE": NoSlotError,
    "ERROR_SERVER_ERROR": ServerError,
    "MAX_USER_TURN": ServerError,
    "ERROR_CAPTCHA_UNSOLVABLE": UnsolvableError,
    "ERROR_WRONG_USER_KEY": AuthError,
    "ERROR_KEY_DOES_NOT_EXIST": AuthError,
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
):
    _BY_CODE.setdefault(_cls.default_code, _cls)

PROXY_CODES = frozenset(code for code, cls in _BY_CODE.items() if cls is ProxyError)

_KEY_HINT = "the API rejects the key: check CAPTCHAAI_API_KEY (and CAPTCHAAI_BASE_URL)"
#: What to check, for the codes whose fix is in the configuration rather than the call.
HINTS = {
    "ERROR_WRONG_USER_KEY": _KEY_HINT,
    "ERROR_KEY_DOES_NOT_EXIST": _KEY_HINT,
    "ERROR_IP_NOT_ALLOWED": "this host's IP address is not allowed for the key: check the "
    "account's IP list",
    "IP_BANNED": "the API banned this host's IP address for a while (too many bad requests)",
}


def from_api_code(
    code: str, captcha_id: str | None = None, message: str | None = None
) -> CaptchaTasksError:
    """The exception for an error code; unknown ``ERROR_*`` codes are fatal."""
    cls = _BY_CODE.get(code, UnknownAPIError)
    return cls(message or HINTS.get(code, code), code, captcha_id)
