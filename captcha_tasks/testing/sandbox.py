"""A local CaptchaAI-compatible HTTP API server (the 2captcha ``in.php`` / ``res.php`` protocol).

It is a real HTTP server, not a mock: tests, demos and benchmarks point a client at its
``url`` and get the provider's behaviour that matters to a client:

* CaptchaAI's wire format: every method its official SDK sends, answers in ``request`` or
  (reCAPTCHA Enterprise, the Cloudflare challenge) ``result`` with a ``user_agent``, grid and
  BLS answers as JSON arrays, ``threadsinfo`` counts as top-level fields;
* a fixed number of provider threads; a captcha holds one from submit until its answer is
  ready, and a submit while all are busy is refused with ``thread_error``;
* answers that take ``solve_time ± jitter`` seconds, on an injectable clock;
* unsolvable captchas, proxy failures (a ``proxy`` containing ``bad-proxy``) and injected
  transient errors (HTTP 500, HTML pages, empty bodies, ``ERROR_SERVER_ERROR``);
* bulk polling with ``res.php?action=get&ids=...`` (switchable);
* callbacks to a captcha's ``pingback`` URL when its answer is ready: CaptchaAI's GET,
  2captcha's POST to registered addresses (``res.php?action=add_pingback``) or the JSON
  family's POST of the task's JSON to its ``callbackUrl``, with a delay
  and a drop rate (see :mod:`.callbacks`);
* a ``/siteverify`` endpoint that checks tokens the way a protected site would: single
  use, with a lifetime that starts when the captcha is solved;
* an account balance that runs out after ``balance_captchas`` captchas (``ERROR_ZERO_BALANCE``,
  ``getbalance`` 0) until it is refilled;
* an outage window: the listener really closed (connections refused) and reopened on the
  same port, HTTP 503 answers, or requests that hang and are never processed;
* admin endpoints: ``GET /sandbox/stats``, ``POST /sandbox/reset``, ``POST /sandbox/config``
  (every fault can be switched there while a batch runs), ``GET /sandbox/ready?ids=...``
  (when each answer was ready, for latency benchmarks) and ``GET /health``.

One :class:`SandboxServer` is one provider account: its own port, keys, threads, balance,
captcha ids and counters.  Run several with ``captcha-tasks sandbox --provider ...`` or
:func:`serve`, or embed them::

    with SandboxServer(SandboxConfig(threads=2, solve_time=0.2)) as sandbox:
        client = CaptchaAIClient(sandbox.url, "sandbox-key")
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import heapq
import json
import math
import random
import signal
import socket
import string
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import parse_qs

from cheroot import wsgi

from ..core.dialects import DIALECTS, Dialect
from .callbacks import Caller
from .jsonface import JSON_ENDPOINTS, callback_body, json_call

__all__ = [
    "DEFAULT_TOKEN_TTL",
    "FIRST_CAPTCHA_ID",
    "METHODS",
    "OUTAGE_MODES",
    "SandboxConfig",
    "SandboxServer",
    "journal_path",
    "serve",
    "wsgi_app",
]

#: The ``method`` values ``in.php`` takes (a grid captcha is sent as ``base64``).
METHODS = (
    "userrecaptcha",
    "turnstile",
    "geetest",
    "base64",
    "bls",
    "cloudflare_challenge",
    "captchafox",
    "friendly_captcha",
    "lemin",
)
DEFAULT_TOKEN_TTL: Mapping[str, float] = {
    "userrecaptcha": 120.0,
    "turnstile": 300.0,
    "geetest": 120.0,
    "base64": 600.0,
    "bls": 600.0,
    "cloudflare_challenge": 1800.0,
    "captchafox": 120.0,
    "friendly_captcha": 300.0,
    "lemin": 120.0,
}
DEFAULT_PORT = 8765
FIRST_CAPTCHA_ID = 70_000_000
MAX_BULK_IDS = 100
#: What an outage window does: close the listener (connections refused), answer protocol
#: requests with HTTP 503, or hang them (never processed; HTTP 504 once the window is over).
OUTAGE_MODES = ("refuse", "503", "hang")
#: The protocols the sandbox speaks (``SandboxConfig.kind``).
SANDBOX_KINDS = ("captchaai", "2captcha", *DIALECTS)

_TOKEN_PREFIX = {
    "userrecaptcha": "03A",
    "turnstile": "0.",
    "cloudflare_challenge": "cf.",
    "captchafox": "fox.",
    "friendly_captcha": "fc.",
    "lemin": "lm.",
}
#: The agent the "solver" used, when the request named none.
SOLVER_USER_AGENT = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/124.0.0.0 Safari/537.36"
)
_GRID_SIZES = {"3x3": 9, "4x4": 16}
_BLS_IMAGES = 9
_TOKEN_RANDOM_BYTES = 165  # a multiple of 3, so the url-safe base64 text has no padding
_PIPE_ANSWER_RATE = 0.2
_IMAGE_LEN = (4, 8)
_IMAGE_MAX_LEN = 20
# Keep a captcha readable well past its token's life, but never let a zero ttl make an
# answer vanish the moment it is ready.
_MIN_RETENTION = 60.0
# Bodies bigger than the limit are refused unread, so a client cannot make us buffer
# arbitrary amounts of memory.
_MIN_BODY_LIMIT = 1024 * 1024
_IDLE_CONNECTION_TIMEOUT = 60
#: Requests served at once (each keep-alive connection holds one while it is open).
SERVER_THREADS = 32
#: Seconds after a 429 during which other requests were already on their way to us: only
#: later ones count as ignoring its Retry-After.
_IN_FLIGHT_GRACE = 1.0
#: How often (real seconds) the server looks at its clock while an outage window is ahead or
#: under way: often enough for a test's fake clock, which notifies nobody when it moves.
_OUTAGE_TICK = 0.05
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")

_TEXT = "text/plain"
_JSON = "application/json"
_HTML = "text/html"
_HTML_500 = (
    b"<html><head><title>500 Internal Server Error</title></head><body>"
    b"<center><h1>500 Internal Server Error</h1></center><hr><center>nginx</center>"
    b"</body></html>"
)
_HTML_200 = (
    b"<!DOCTYPE html><html><head><title>Just a moment...</title></head><body>"
    b"<h1>Checking your browser before accessing the site.</h1></body></html>"
)
_HTML_503 = (
    b"<html><head><title>503 Service Temporarily Unavailable</title></head><body>"
    b"<center><h1>503 Service Temporarily Unavailable</h1></center><hr><center>nginx</center>"
    b"</body></html>"
)
_HTML_504 = (
    b"<html><head><title>504 Gateway Time-out</title></head><body>"
    b"<center><h1>504 Gateway Time-out</h1></center><hr><center>nginx</center></body></html>"
)

_COUNTERS = (
    "in_php_requests",
    "res_php_requests",
    "res_php_get_requests",
    "res_php_ids",
    "submits",
    "thread_rejections",
    "solved_reads",
    "verifies_ok",
    "verifies_failed",
    "reports_bad",
    "reports_good",
    "injected_errors",
    "hangs",
    "status_429",
    "requests_within_retry_after",
    "unsolvable_created",
    "queued_silently",
    "pingbacks_scheduled",
    "pingbacks_dropped",
    "pingbacks_unregistered",
    "outage_503",
    "outage_hangs",
    "listener_closes",
)


# -- configuration -----------------------------------------------------------------------


def _default_token_ttl() -> dict[str, float]:
    return dict(DEFAULT_TOKEN_TTL)


@dataclass
class SandboxConfig:
    """How the sandbox behaves; every field is validated on construction."""

    threads: int = 15
    solve_time: float = 1.5
    jitter: float = 0.3
    unsolvable_rate: float = 0.0
    error_rate: float = 0.0
    bulk: bool = True
    api_keys: tuple[str, ...] = ("sandbox-key",)
    thread_error: str = "ERROR_NO_SLOT_AVAILABLE"
    token_ttl: dict[str, float] = field(default_factory=_default_token_ttl)
    balance: float = 10.0
    max_image_bytes: int = 1024 * 1024
    seed: int | None = None
    #: With a ``seed``: a task (method, sitekey, pageurl) takes the same solve time in every
    #: run, whatever order it is submitted in, so that runs compare captcha for captcha.
    solve_times_by_task: bool = False
    #: How captchas submitted with ``pingback`` are called back: "GET" (CaptchaAI) or
    #: "POST" (2captcha: form fields, registered addresses only).
    pingback_method: str = "GET"
    #: Seconds between a captcha's answer being ready and its callback.
    pingback_delay: float = 0.0
    #: Share of callbacks never made (lost on the way).
    pingback_drop_rate: float = 0.0
    #: Share of in.php / res.php requests that hang ``hang_s`` seconds before answering.
    hang_rate: float = 0.0
    hang_s: float = 60.0
    #: Share of in.php / res.php requests answered HTTP 429 with ``Retry-After: retry_after``.
    status_429_rate: float = 0.0
    retry_after: int = 2
    #: Beyond the plan's threads, accept captchas and let them wait for a free thread (as
    #: CaptchaAI's SDK says its API does), instead of answering ``thread_error``.
    queue_silently: bool = False
    #: The provider's name, shown in its stats and start-up line.
    name: str = "sandbox"
    #: The first captcha id it issues (then +1 each).  Two sandboxes with the same one issue
    #: colliding ids, as two providers may.  Fixed once it runs.
    first_id: int = FIRST_CAPTCHA_ID
    #: Captchas accepted before the balance runs out; then every submit is refused with
    #: ``ERROR_ZERO_BALANCE`` and ``getbalance`` answers 0.  Counted from when it is set:
    #: setting it again refills.  None: never runs out.
    balance_captchas: int | None = None
    #: An outage window ``outage_s`` seconds long (0: none), starting ``outage_in`` seconds
    #: after the sandbox starts or after any ``outage_*`` field is set at run time.
    outage_s: float = 0.0
    outage_in: float = 0.0
    #: One of :data:`OUTAGE_MODES`.
    outage_mode: str = "refuse"
    #: The protocol it speaks: "captchaai" / "2captcha" (in.php) or a JSON dialect's kind
    #: ("anticaptcha", "capsolver", "capmonster"; see :mod:`.jsonface`).
    kind: str = "captchaai"
    #: A test's latch: while true the sandbox's clock stands still, so no captcha becomes
    #: ready, no thread frees and no token ages; set false, time runs on from where it
    #: stopped.  An ordering test holds the answers until the state it tests is reached
    #: (every captcha parked, say) instead of counting on slow solves.
    hold: bool = False
    #: The latch closing itself: once this many more solved captchas have been read (a
    #: token handed to a client), ``hold`` becomes true, at that instant, and this None
    #: again.  A test stops the clock at the first answer, so nothing submitted after it
    #: can become ready whatever the machine's speed.
    hold_after_reads: int | None = None

    def __post_init__(self) -> None:
        # Values also arrive as JSON from POST /sandbox/config, so check types, not just ranges.
        self.threads = _check_int("threads", self.threads, minimum=1)
        self.solve_time = _check_number("solve_time", self.solve_time, 0.0)
        self.jitter = _check_number("jitter", self.jitter, 0.0)
        self.unsolvable_rate = _check_number("unsolvable_rate", self.unsolvable_rate, 0.0, 1.0)
        self.error_rate = _check_number("error_rate", self.error_rate, 0.0, 1.0)
        self.bulk = _check_bool("bulk", self.bulk)
        self.api_keys = _check_api_keys(self.api_keys)
        if not isinstance(self.thread_error, str) or not self.thread_error.strip():
            raise ValueError("thread_error must be a non-empty error code")
        self.token_ttl = _check_token_ttl(self.token_ttl)
        self.balance = _check_number("balance", self.balance, -math.inf)
        self.max_image_bytes = _check_int("max_image_bytes", self.max_image_bytes, minimum=1)
        if self.seed is not None:
            self.seed = _check_int("seed", self.seed, minimum=None)
        if self.pingback_method not in ("GET", "POST"):
            raise ValueError(f"pingback_method must be GET or POST, got {self.pingback_method!r}")
        self.pingback_delay = _check_number("pingback_delay", self.pingback_delay, 0.0)
        self.hang_rate = _check_number("hang_rate", self.hang_rate, 0.0, 1.0)
        self.hang_s = _check_number("hang_s", self.hang_s, 0.0)
        self.status_429_rate = _check_number("status_429_rate", self.status_429_rate, 0.0, 1.0)
        self.retry_after = _check_int("retry_after", self.retry_after, minimum=0)
        self.queue_silently = _check_bool("queue_silently", self.queue_silently)
        self.solve_times_by_task = _check_bool("solve_times_by_task", self.solve_times_by_task)
        self.hold = _check_bool("hold", self.hold)
        if self.hold_after_reads is not None:
            self.hold_after_reads = _check_int("hold_after_reads", self.hold_after_reads, 1)
        self.pingback_drop_rate = _check_number(
            "pingback_drop_rate", self.pingback_drop_rate, 0.0, 1.0
        )
        self._check_provider()

    def _check_provider(self) -> None:
        if not isinstance(self.name, str) or not self.name or set(self.name) - _NAME_CHARS:
            raise ValueError(f"name must be letters, digits, '_', '.' or '-', got {self.name!r}")
        self.first_id = _check_int("first_id", self.first_id, minimum=1)
        if self.balance_captchas is not None:
            self.balance_captchas = _check_int("balance_captchas", self.balance_captchas, 0)
        self.outage_s = _check_number("outage_s", self.outage_s, 0.0)
        self.outage_in = _check_number("outage_in", self.outage_in, 0.0)
        if self.kind not in SANDBOX_KINDS:
            raise ValueError(f"kind must be one of {', '.join(SANDBOX_KINDS)}, got {self.kind!r}")
        if self.outage_mode not in OUTAGE_MODES:
            modes = ", ".join(OUTAGE_MODES)
            raise ValueError(f"outage_mode must be one of {modes}, got {self.outage_mode!r}")

    def ttl_for(self, method: str) -> float:
        """Token lifetime in seconds for a captcha method."""
        return self.token_ttl.get(method, DEFAULT_TOKEN_TTL.get(method, 0.0))

    def public_dict(self) -> dict[str, Any]:
        """The config as JSON-ready data, without the API keys."""
        data = dataclasses.asdict(self)
        del data["api_keys"]
        return data


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _check_int(name: str, value: object, minimum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_number(name: str, value: object, minimum: float, maximum: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return number


def _check_api_keys(value: object) -> tuple[str, ...]:
    # The message never repeats the value: it holds API keys.
    if isinstance(value, str) or not isinstance(value, tuple | list):
        raise ValueError("api_keys must be a list of strings")
    keys = tuple(value)
    if not keys or not all(isinstance(key, str) and key for key in keys):
        raise ValueError("api_keys must hold at least one non-empty string")
    return keys


def _check_token_ttl(value: object) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"token_ttl must map method names to seconds, got {value!r}")
    ttl: dict[str, float] = {}
    for method, seconds in value.items():
        if not isinstance(method, str):
            raise ValueError(f"token_ttl keys must be method names, got {method!r}")
        ttl[method] = _check_number(f"token_ttl[{method!r}]", seconds, 0.0)
    return ttl


# -- replies -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _text_reply(text: str, status: int = 200) -> _Reply:
    return _Reply(status, _TEXT, text.encode())


def _json_reply(data: object, status: int = 200) -> _Reply:
    return _Reply(status, _JSON, json.dumps(data).encode())


def _api(ok: bool, request: object, json_mode: bool, text: str | None = None) -> _Reply:
    """A protocol reply: ``{"status", "request"}`` in JSON mode, else ``text`` (or request)."""
    if json_mode:
        return _json_reply({"status": 1 if ok else 0, "request": request})
    return _text_reply(str(request) if text is None else text)


def _fail(code: str, json_mode: bool) -> _Reply:
    return _api(False, code, json_mode)


def _wants_json(params: Mapping[str, str]) -> bool:
    return params.get("json", "").strip().lower() in ("1", "true")


def _injected_reply(kind: int, json_mode: bool) -> _Reply:
    if kind == 0:
        return _Reply(500, _HTML, _HTML_500)
    if kind == 1:
        return _Reply(200, _HTML, _HTML_200)
    if kind == 2:
        return _Reply(200, _TEXT, b"")
    return _fail("ERROR_SERVER_ERROR", json_mode)


# -- submissions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Submission:
    """A validated in.php request."""

    method: str
    sitekey: str = ""
    pageurl: str = ""
    challenge: str = ""
    bad_proxy: bool = False
    charset: str = string.ascii_lowercase + string.digits
    min_len: int = _IMAGE_LEN[0]
    max_len: int = _IMAGE_LEN[1]
    #: Grid and BLS: the answer is a JSON array of cells from 1 to ``cells``.
    cells: int = 0
    #: CaptchaAI answers with this user agent (in the reply's ``user_agent``).
    user_agent: str | None = None
    #: CaptchaAI puts the answer in ``result`` instead of ``request``.
    in_result: bool = False


def _pageurl(params: Mapping[str, str]) -> str | None:
    url = params.get("pageurl", "").strip()
    return url if url.lower().startswith(("http://", "https://")) else None


def _bad_proxy(params: Mapping[str, str]) -> bool:
    return "bad-proxy" in params.get("proxy", "")


def _agent(params: Mapping[str, str]) -> str:
    """The caller's agent (CaptchaAI's ``userAgent``, or ``user_agent``), else the solver's."""
    given = params.get("userAgent", "").strip() or params.get("user_agent", "").strip()
    return given or SOLVER_USER_AGENT


def _truthy(params: Mapping[str, str], name: str) -> bool:
    return params.get(name, "").strip().lower() in ("1", "true")


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _validate_recaptcha(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    googlekey = params.get("googlekey", "").strip()
    if not googlekey:
        return "ERROR_GOOGLEKEY"
    pageurl = _pageurl(params)
    if pageurl is None:
        return "ERROR_PAGEURL"
    if "min_score" in params and not _is_number(params["min_score"]):
        return "ERROR_BAD_PARAMETERS"
    enterprise = _truthy(params, "enterprise")
    return _Submission(
        "userrecaptcha",
        sitekey=googlekey,
        pageurl=pageurl,
        bad_proxy=_bad_proxy(params),
        user_agent=_agent(params) if enterprise else None,
        in_result=enterprise,
    )


def _validate_turnstile(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    sitekey = params.get("sitekey", "").strip()
    if not sitekey:
        return "ERROR_BAD_PARAMETERS"
    pageurl = _pageurl(params)
    if pageurl is None:
        return "ERROR_PAGEURL"
    return _Submission("turnstile", sitekey=sitekey, pageurl=pageurl, bad_proxy=_bad_proxy(params))


def _validate_geetest(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    gt = params.get("gt", "").strip()
    challenge = params.get("challenge", "").strip()
    if not gt or not challenge:
        return "ERROR_BAD_PARAMETERS"
    pageurl = _pageurl(params)
    if pageurl is None:
        return "ERROR_PAGEURL"
    return _Submission(
        "geetest", sitekey=gt, pageurl=pageurl, challenge=challenge, bad_proxy=_bad_proxy(params)
    )


def _decoded_size(body: str) -> int:
    """Decoded size of a base64 image, 0 when it is empty or not base64."""
    text = "".join(body.split())
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        return len(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return 0


def _int_param(params: Mapping[str, str], name: str) -> int | None:
    """A small non-negative integer parameter; 0 when absent, None when malformed."""
    raw = params.get(name, "").strip()
    if not raw:
        return 0
    return int(raw) if raw.isdigit() and int(raw) <= _IMAGE_MAX_LEN else None


def _image_lengths(params: Mapping[str, str]) -> tuple[int, int] | None:
    min_len, max_len = _int_param(params, "min_len"), _int_param(params, "max_len")
    if min_len is None or max_len is None or (min_len and max_len and min_len > max_len):
        return None
    low = min_len or min(_IMAGE_LEN[0], max_len or _IMAGE_LEN[0])
    high = max_len or max(_IMAGE_LEN[1], low)
    return low, high


def _image_error(body: str, config: SandboxConfig) -> str | None:
    size = _decoded_size(body)
    if size == 0:
        return "ERROR_ZERO_CAPTCHA_FILESIZE"
    if size > config.max_image_bytes:
        return "ERROR_TOO_BIG_CAPTCHA_FILESIZE"
    return None


def _validate_image(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    problem = _image_error(params.get("body", ""), config)
    if problem is not None:
        return problem
    if "grid_size" in params:
        return _validate_grid(params)
    lengths = _image_lengths(params)
    if lengths is None:
        return "ERROR_BAD_PARAMETERS"
    numeric = params.get("numeric", "").strip()
    charsets = {"1": string.digits, "2": string.ascii_lowercase}
    return _Submission(
        "base64",
        charset=charsets.get(numeric, string.ascii_lowercase + string.digits),
        min_len=lengths[0],
        max_len=lengths[1],
    )


def _validate_grid(params: Mapping[str, str]) -> _Submission | str:
    """A grid captcha: ``method=base64`` with ``grid_size`` and ``instructions``."""
    cells = _GRID_SIZES.get(params.get("grid_size", "").strip())
    if cells is None or not params.get("instructions", "").strip():
        return "ERROR_BAD_PARAMETERS"
    return _Submission("base64", cells=cells)


def _validate_bls(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    for number in range(1, _BLS_IMAGES + 1):
        problem = _image_error(params.get(f"image_base64_{number}", ""), config)
        if problem is not None:
            return problem
    if not params.get("instructions", "").strip():
        return "ERROR_BAD_PARAMETERS"
    return _Submission("bls", cells=_BLS_IMAGES)


def _validate_cloudflare(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    pageurl = _pageurl(params)
    if pageurl is None:
        return "ERROR_PAGEURL"
    if not params.get("proxy", "").strip() or not params.get("proxytype", "").strip():
        return "ERROR_BAD_PARAMETERS"
    return _Submission(
        "cloudflare_challenge",
        pageurl=pageurl,
        bad_proxy=_bad_proxy(params),
        user_agent=_agent(params),
        in_result=True,
    )


def _validate_sitekey_method(
    method: str, params: Mapping[str, str], *, proxy: bool = False
) -> _Submission | str:
    sitekey = params.get("sitekey", "").strip()
    if not sitekey:
        return "ERROR_BAD_PARAMETERS"
    pageurl = _pageurl(params)
    if pageurl is None:
        return "ERROR_PAGEURL"
    if proxy and not params.get("proxy", "").strip():
        return "ERROR_BAD_PARAMETERS"
    return _Submission(
        method,
        sitekey=sitekey,
        pageurl=pageurl,
        bad_proxy=_bad_proxy(params),
        user_agent=_agent(params) if proxy else None,
    )


def _validate_captchafox(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    return _validate_sitekey_method("captchafox", params, proxy=True)


def _validate_friendly(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    if params.get("version", "v1").strip() not in ("v1", "v2"):
        return "ERROR_BAD_PARAMETERS"
    return _validate_sitekey_method("friendly_captcha", params)


def _validate_lemin(params: Mapping[str, str], config: SandboxConfig) -> _Submission | str:
    captcha_id = params.get("captcha_id", "").strip()
    if not captcha_id or not params.get("div_id", "").strip():
        return "ERROR_BAD_PARAMETERS"
    pageurl = _pageurl(params)
    if pageurl is None:
        return "ERROR_PAGEURL"
    return _Submission("lemin", sitekey=captcha_id, pageurl=pageurl, bad_proxy=_bad_proxy(params))


_VALIDATORS: dict[str, Callable[[Mapping[str, str], SandboxConfig], _Submission | str]] = {
    "userrecaptcha": _validate_recaptcha,
    "turnstile": _validate_turnstile,
    "geetest": _validate_geetest,
    "base64": _validate_image,
    "bls": _validate_bls,
    "cloudflare_challenge": _validate_cloudflare,
    "captchafox": _validate_captchafox,
    "friendly_captcha": _validate_friendly,
    "lemin": _validate_lemin,
}


# -- answers -----------------------------------------------------------------------------


def _random_token(rng: random.Random, prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(rng.randbytes(_TOKEN_RANDOM_BYTES)).decode()


def _image_answer(rng: random.Random, spec: _Submission) -> str:
    length = rng.randint(spec.min_len, spec.max_len)
    chars = [rng.choice(spec.charset) for _ in range(length)]
    # Real image answers can contain "|", which breaks clients that split on it.
    if length >= 2 and rng.random() < _PIPE_ANSWER_RATE:
        chars[rng.randrange(1, length)] = "|"
    return "".join(chars)


def _cells_answer(rng: random.Random, cells: int) -> str:
    """A grid or BLS answer: the cells to click, a JSON array as CaptchaAI sends it."""
    return json.dumps(sorted(rng.sample(range(1, cells + 1), rng.randint(1, 4))))


def _geetest_text(answer: Mapping[str, str]) -> str:
    return (
        f"challenge:{answer['geetest_challenge']},validate:{answer['geetest_validate']},"
        f"seccode:{answer['geetest_seccode']}"
    )


@dataclass(slots=True, eq=False)
class _Captcha:
    captcha_id: str
    method: str
    ready_at: float
    forget_at: float
    answer: str | dict[str, str] | None
    error: str | None
    token: str | None
    read_epoch: int = -1
    #: Whether a client ever asked about it (a captcha paid for and never asked about was
    #: lost by its client, e.g. killed before it could note the id).
    asked: bool = False
    #: The counters' epoch it was created in (see ``reset``).
    epoch: int = 0
    user_agent: str | None = None
    in_result: bool = False


def _callback_of(captcha: _Captcha, dialect: Dialect | None, method: str) -> tuple[str, str]:
    """What a captcha's callback carries, and how it is made: an in.php provider's
    ``code`` (by ``method``), or the JSON family's POST of the task's JSON."""
    if dialect is not None:
        body = callback_body(
            dialect,
            captcha.captcha_id,
            captcha.method,
            captcha.answer,
            captcha.error,
            captcha.user_agent,
        )
        return body, "JSON"
    answer = captcha.answer
    code = captcha.error or (json.dumps(answer) if isinstance(answer, dict) else str(answer))
    return code, method


@dataclass(slots=True, eq=False)
class _Token:
    method: str
    sitekey: str
    pageurl: str
    valid_from: float
    expires_at: float
    used: bool = False


@dataclass(frozen=True, slots=True)
class _Outage:
    """An outage window on the sandbox's clock."""

    mode: str
    start: float
    end: float

    def active(self, now: float) -> bool:
        return self.start <= now < self.end


def _outage_from(config: SandboxConfig, now: float) -> _Outage | None:
    if config.outage_s <= 0:
        return None
    start = now + config.outage_in
    return _Outage(config.outage_mode, start, start + config.outage_s)


@dataclass(frozen=True, slots=True)
class _Hang:
    """A request held ``seconds`` (real time) or until ``gate`` opens; then it answers
    ``then``, or is served after all when ``then`` is None."""

    seconds: float
    gate: threading.Event
    then: _Reply | None


def _drop_seed(seed: int | None) -> int | None:
    return None if seed is None else seed + 1


def _open_journal(path: Path | None) -> IO[str] | None:
    # Line-buffered: each line reaches the OS before in.php answers, so it survives a
    # SIGKILL of this process.
    return None if path is None else path.open("a", buffering=1, encoding="utf-8")


def _journal_line(captcha_id: str, spec: _Submission) -> str:
    """A paid captcha, as the journal records it: what was solved, not how (no proxy)."""
    fields = {"id": captcha_id, "method": spec.method, "sitekey": spec.sitekey}
    return json.dumps({**fields, "pageurl": spec.pageurl, "at": time.time()}) + "\n"


def _refusal(fault: _Reply | _Hang) -> str:
    """Why a submit met by ``fault`` created no captcha, for the stats."""
    reply = fault.then if isinstance(fault, _Hang) else fault
    if reply is None or reply is _GATEWAY_TIMEOUT:
        return "hang"
    return f"HTTP_{reply.status}"


_UNAVAILABLE = _Reply(503, _HTML, _HTML_503)
_GATEWAY_TIMEOUT = _Reply(504, _HTML, _HTML_504)
_OUTAGE_FIELDS = frozenset({"outage_s", "outage_in", "outage_mode"})


# -- state -------------------------------------------------------------------------------


class _Latch:
    """The sandbox's clock: the injected one, less the time it was held still."""

    def __init__(self, clock: Callable[[], float], held: bool = False) -> None:
        self._clock = clock
        # (when the hold began or None, seconds held before it): one value, read whole.
        self._state: tuple[float | None, float] = (clock() if held else None, 0.0)

    def __call__(self) -> float:
        since, lag = self._state
        return (self._clock() if since is None else since) - lag

    def hold(self, held: bool) -> None:
        since, lag = self._state
        if held and since is None:
            self._state = (self._clock(), lag)
        elif not held and since is not None:
            self._state = (None, lag + self._clock() - since)


class _State:
    """Everything the sandbox knows, behind one lock; independent of HTTP."""

    def __init__(
        self, config: SandboxConfig, clock: Callable[[], float], journal: Path | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._clock = _Latch(clock, held=config.hold)
        self._config = dataclasses.replace(config)
        self._rng = random.Random(config.seed)
        # Callbacks are dropped by a random stream of their own: a seeded sandbox gives the
        # same solve times whatever share of callbacks it drops (benchmarks compare runs).
        self._drops = random.Random(_drop_seed(config.seed))
        self._next_id = config.first_id
        self._captchas: dict[str, _Captcha] = {}
        self._tokens: dict[str, _Token] = {}
        self._by_age: deque[_Captcha] = deque()
        # Ready times of captchas still holding a thread; the earliest is released first.
        self._busy: list[float] = []
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._by_method = dict.fromkeys(METHODS, 0)
        # When each captcha was asked for alone (a JSON face's getTaskResult): its budgets.
        self._poll_times: dict[str, list[float]] = {}
        self._peak = 0
        # reset() bumps the epoch so "read at least once" is counted afresh.
        self._epoch = 0
        self._pingback_addrs: set[str] = set()
        # When the last 429's Retry-After window opened and until when it asks clients to
        # stay away.
        self._retry_window = (-math.inf, -math.inf)
        self.caller = Caller(self._clock)
        # Submits that created no captcha, by reason (an error code, HTTP_503, ...).
        self._refusals: dict[str, int] = {}
        self._captchas_left = config.balance_captchas
        self._outage = _outage_from(config, self._clock())
        # Hangs end when their gate opens: ``_drop`` when the listener closes or the server
        # stops; ``_hang_gate`` (requests hung by a "hang" window) also when the window ends.
        self._drop = threading.Event()
        self._hang_gate = threading.Event()
        #: Set on every config change: wakes the server's outage supervisor.
        self.changed = threading.Event()
        self._journal = _open_journal(journal)
        # The count of solved reads at which the latch closes itself (hold_after_reads).
        self._hold_at_read = self._hold_target(config)

    def _hold_target(self, config: SandboxConfig) -> int | None:
        after = config.hold_after_reads
        return None if after is None else self._counts["solved_reads"] + after

    def close(self) -> None:
        with self._lock:
            if self._journal is not None:
                self._journal.close()
                self._journal = None

    # -- config and stats --------------------------------------------------------------
    def config(self) -> SandboxConfig:
        with self._lock:
            return dataclasses.replace(self._config)

    def body_limit(self) -> int:
        # A base64 image is 4/3 of its size, and form encoding can inflate it further; a
        # BLS captcha sends nine.
        return max(_MIN_BODY_LIMIT, 2 * _BLS_IMAGES * self._config.max_image_bytes)

    def update_config(self, changes: Mapping[str, Any]) -> SandboxConfig:
        known = {f.name for f in dataclasses.fields(SandboxConfig)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown config field(s): {', '.join(unknown)}")
        with self._lock:
            config = dataclasses.replace(self._config, **changes)
            if config.first_id != self._config.first_id:
                # Changing it could reissue ids already given out.
                raise ValueError("first_id can only be set at start")
            self._config = config
            self._clock.hold(config.hold)
            if "hold_after_reads" in changes:
                self._hold_at_read = self._hold_target(config)
            if "seed" in changes:
                self._rng.seed(config.seed)
                self._drops.seed(_drop_seed(config.seed))
            if "balance_captchas" in changes:
                self._captchas_left = config.balance_captchas
            if _OUTAGE_FIELDS & set(changes):
                self._outage = _outage_from(config, self._clock())
            self.changed.set()
            return dataclasses.replace(config)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            in_flight = self._release(self._clock())
            data: dict[str, Any] = dict(self._counts)
            data["in_flight"] = in_flight
            data["peak_in_flight"] = self._peak
            data["captchas_stored"] = len(self._captchas)
            orphans = [
                c
                for c in self._captchas.values()
                if c.epoch == self._epoch and not c.asked and c.read_epoch < 0
            ]
            data["never_asked"] = len(orphans)
            # Orphans also counted in unsolvable_created: a caller that lost
            # an in.php reply pays for the captcha whatever its fate.
            data["never_asked_unsolvable"] = sum(
                1 for c in orphans if c.error == "ERROR_CAPTCHA_UNSOLVABLE"
            )
            data["submits_by_method"] = dict(self._by_method)
            data["refused_submits"] = dict(self._refusals)
            data["provider"] = self._config.name
            data["balance"] = {"value": self._balance(), "captchas_left": self._captchas_left}
            data["outage"] = self._outage_status()
            data["config"] = self._config.public_dict()
            data.update(self.caller.counts)
            return data

    def _outage_status(self) -> dict[str, Any] | None:
        window, now = self._outage, self._clock()
        if window is None or now >= window.end:
            return None
        return {
            "mode": window.mode,
            "active": window.active(now),
            "starts_in": max(0.0, window.start - now),
            "ends_in": window.end - now,
        }

    def reset(self) -> None:
        with self._lock:
            self._counts = dict.fromkeys(_COUNTERS, 0)
            self._by_method = dict.fromkeys(METHODS, 0)
            self._poll_times = {}
            self._refusals = {}
            self._peak = 0
            self._epoch += 1
            self.caller.counts.update(dict.fromkeys(self.caller.counts, 0))
            self._hold_at_read = self._hold_target(self._config)

    # -- in.php ------------------------------------------------------------------------
    def in_php(self, params: Mapping[str, str]) -> _Reply:
        json_mode = _wants_json(params)
        with self._lock:
            now = self._clock()
            self._counts["in_php_requests"] += 1
            config = self._config
            spec = self._submission(params)
            if isinstance(spec, str):
                self._refused(spec)
                return _fail(spec, json_mode)
            injected = self._maybe_inject(json_mode)
            if injected is not None:
                self._refused("injected")
                return injected
            self._prune(now)
            in_flight = self._release(now)
            start = now
            if in_flight >= config.threads:
                if not config.queue_silently:
                    self._counts["thread_rejections"] += 1
                    self._refused(config.thread_error)
                    return _fail(config.thread_error, json_mode)
                self._counts["queued_silently"] += 1
                start = heapq.nsmallest(in_flight - config.threads + 1, self._busy)[-1]
            self._peak = max(self._peak, in_flight + 1)
            captcha_id = self._create(spec, start)
            self._call_back(self._captchas[captcha_id], params.get("pingback", "").strip())
            return _api(True, captcha_id, json_mode, f"OK|{captcha_id}")

    def _submission(self, params: Mapping[str, str]) -> _Submission | str:
        """The captcha an in.php request asks for, or the error code refusing it."""
        problem = self._key_error(params)
        if problem is not None:
            return problem
        if self._captchas_left == 0:
            return "ERROR_ZERO_BALANCE"
        validator = _VALIDATORS.get(params.get("method", "").strip())
        if validator is None:
            return "ERROR_BAD_PARAMETERS"
        return validator(params, self._config)

    def poll_times(self, captcha_id: str) -> list[float]:
        """When the captcha was asked for alone (sandbox clock), oldest first."""
        with self._lock:
            return list(self._poll_times.get(captcha_id, ()))

    def method_of(self, captcha_id: str) -> str | None:
        """The method a captcha was submitted with (None: no such captcha)."""
        with self._lock:
            captcha = self._captchas.get(captcha_id)
            return captcha.method if captcha is not None else None

    def _refused(self, reason: str) -> None:
        self._refusals[reason] = self._refusals.get(reason, 0) + 1

    def _balance(self) -> float:
        return 0.0 if self._captchas_left == 0 else self._config.balance

    def _call_back(self, captcha: _Captcha, url: str) -> None:
        """Schedule the captcha's callback, as its provider would make it."""
        config = self._config
        if not url:
            return
        self._counts["pingbacks_scheduled"] += 1
        dialect = DIALECTS.get(config.kind)
        if (
            dialect is None
            and config.pingback_method == "POST"
            and not any(url.startswith(addr) for addr in self._pingback_addrs)
        ):
            self._counts["pingbacks_unregistered"] += 1
            return
        if self._drops.random() < config.pingback_drop_rate:
            self._counts["pingbacks_dropped"] += 1
            return
        code, verb = _callback_of(captcha, dialect, config.pingback_method)
        at = captcha.ready_at + config.pingback_delay
        captcha.asked = True  # the provider tells the client itself
        self.caller.schedule(at, url, captcha.captcha_id, code, verb)

    def ready_times(self, ids: Sequence[str]) -> dict[str, float]:
        """When each captcha's answer was (or will be) ready, as Unix time."""
        with self._lock:
            offset = time.time() - self._clock()
            found = (self._captchas.get(i) for i in ids)
            return {c.captcha_id: c.ready_at + offset for c in found if c is not None}

    def token_ready_times(self, tokens: Sequence[str]) -> dict[str, float]:
        """When each token's captcha had it ready, as Unix time (tokens it never issued
        are left out)."""
        with self._lock:
            offset = time.time() - self._clock()
            found = ((t, self._tokens.get(t)) for t in tokens)
            return {t: info.valid_from + offset for t, info in found if info is not None}

    def transport_fault(self, submit: bool) -> _Reply | _Hang | None:
        """What happens to the next protocol request (``submit``: an in.php one) before it
        is served: an outage's answer or hang, an injected hang or HTTP 429, or nothing."""
        with self._lock:
            config = self._config
            now = self._clock()
            opened, until = self._retry_window
            if opened + _IN_FLIGHT_GRACE <= now < until:  # sent after the 429 was seen
                self._counts["requests_within_retry_after"] += 1
            fault = self._outage_fault(now)
            if fault is None and config.hang_rate > 0 and self._rng.random() < config.hang_rate:
                self._counts["hangs"] += 1
                return _Hang(config.hang_s, self._drop, None)
            if fault is None and config.status_429_rate > 0:
                fault = self._maybe_429(now)
            if fault is not None and submit:
                self._refused(_refusal(fault))
            return fault

    def _outage_fault(self, now: float) -> _Reply | _Hang | None:
        window = self._outage
        if window is None or not window.active(now):
            return None
        if window.mode == "503":
            self._counts["outage_503"] += 1
            return _UNAVAILABLE
        if window.mode == "hang":
            self._counts["outage_hangs"] += 1
            if self._hang_gate.is_set():  # opened at the end of an earlier window
                self._hang_gate = threading.Event()
            return _Hang(self._config.hang_s, self._hang_gate, _GATEWAY_TIMEOUT)
        # "refuse", and the listener is not closed yet: the connection is about to drop.
        return _Hang(self._config.hang_s, self._drop, _UNAVAILABLE)

    def _maybe_429(self, now: float) -> _Reply | None:
        config = self._config
        if self._rng.random() >= config.status_429_rate:
            return None
        self._counts["status_429"] += 1
        self._retry_window = (now, now + config.retry_after)
        retry = (("Retry-After", str(config.retry_after)),)
        return _Reply(429, _TEXT, b"Too Many Requests", retry)

    # -- the listener's side of outages --------------------------------------------------
    def outage_tick(self) -> tuple[bool, bool]:
        """Whether the listener must be closed now, and whether a window is still ahead or
        under way (so the clock must be watched).  Opens the gate of hung requests once
        their window is over."""
        with self._lock:
            window, now = self._outage, self._clock()
            if window is None or now >= window.end:
                self._hang_gate.set()
                return False, False
            active = window.active(now)
            if not (active and window.mode == "hang"):
                self._hang_gate.set()
            return active and window.mode == "refuse", True

    def listener_closing(self) -> None:
        """The listener is about to close for an outage: hung requests end now."""
        with self._lock:
            self._counts["listener_closes"] += 1
            self._drop_hangs()

    def drop_hangs(self) -> None:
        """Every hung request ends now (the server stops)."""
        with self._lock:
            self._drop_hangs()

    def _drop_hangs(self) -> None:
        self._drop.set()
        self._hang_gate.set()

    def listener_opened(self) -> None:
        with self._lock:
            self._drop = threading.Event()

    def _key_error(self, params: Mapping[str, str]) -> str | None:
        key = params.get("key", "")
        if not key:
            return "ERROR_KEY_DOES_NOT_EXIST"
        if key not in self._config.api_keys:
            return "ERROR_WRONG_USER_KEY"
        return None

    def _maybe_inject(self, json_mode: bool) -> _Reply | None:
        rate = self._config.error_rate
        if rate <= 0.0 or self._rng.random() >= rate:
            return None
        self._counts["injected_errors"] += 1
        return _injected_reply(self._rng.randrange(4), json_mode)

    def _release(self, now: float) -> int:
        """Free the threads of captchas whose ready time has come; returns the busy count."""
        while self._busy and self._busy[0] <= now:
            heapq.heappop(self._busy)
        return len(self._busy)

    def _prune(self, now: float) -> None:
        # Creation order is close enough to forget order: an entry that outlives its
        # neighbours only delays their removal a little.
        while self._by_age and self._by_age[0].forget_at <= now:
            captcha = self._by_age.popleft()
            self._captchas.pop(captcha.captcha_id, None)
            if captcha.token is not None:
                self._tokens.pop(captcha.token, None)

    def _create(self, spec: _Submission, now: float) -> str:
        config, rng = self._config, self._rng
        captcha_id = str(self._next_id)
        self._next_id += 1
        solve = max(0.0, config.solve_time + rng.uniform(-config.jitter, config.jitter))
        if config.solve_times_by_task and config.seed is not None:
            task = random.Random(f"{config.seed}|{spec.method}|{spec.sitekey}|{spec.pageurl}")
            solve = max(0.0, config.solve_time + task.uniform(-config.jitter, config.jitter))
        ready_at = now + solve
        ttl = config.ttl_for(spec.method)
        error: str | None = None
        if spec.bad_proxy:
            error = "ERROR_PROXY_CONNECTION_FAILED"
        elif rng.random() < config.unsolvable_rate:
            error = "ERROR_CAPTCHA_UNSOLVABLE"
            self._counts["unsolvable_created"] += 1
        captcha = _Captcha(
            captcha_id=captcha_id,
            method=spec.method,
            ready_at=ready_at,
            forget_at=ready_at + max(2 * ttl, _MIN_RETENTION),
            answer=None,
            error=error,
            token=None,
            user_agent=spec.user_agent,
            in_result=spec.in_result,
            epoch=self._epoch,
        )
        if error is None:
            self._solve(captcha, spec, ready_at + ttl)
        self._captchas[captcha_id] = captcha
        self._by_age.append(captcha)
        heapq.heappush(self._busy, ready_at)
        self._counts["submits"] += 1
        self._by_method[spec.method] = self._by_method.get(spec.method, 0) + 1
        if self._captchas_left is not None:
            self._captchas_left -= 1
        if self._journal is not None:
            self._journal.write(_journal_line(captcha_id, spec))
        return captcha_id

    def _solve(self, captcha: _Captcha, spec: _Submission, expires_at: float) -> None:
        """Decide the answer now; it is only revealed once the captcha is ready."""
        rng = self._rng
        if spec.cells:
            captcha.answer = _cells_answer(rng, spec.cells)
            return
        if spec.method == "base64":
            captcha.answer = _image_answer(rng, spec)
            return
        while True:
            if spec.method == "geetest":
                validate = rng.randbytes(16).hex()
                answer: str | dict[str, str] = {
                    "geetest_challenge": spec.challenge,
                    "geetest_validate": validate,
                    "geetest_seccode": rng.randbytes(16).hex(),
                }
                token = validate
            elif spec.method == "lemin":
                # CaptchaAI sends Lemin's answer as JSON text in ``request``.
                token = _random_token(rng, _TOKEN_PREFIX["lemin"])
                challenge_uuid = rng.randbytes(16).hex()
                answer = json.dumps({"answer": token, "challenge_uuid": challenge_uuid})
            else:
                token = _random_token(rng, _TOKEN_PREFIX[spec.method])
                answer = token
            if token not in self._tokens:
                break
        captcha.answer, captcha.token = answer, token
        self._tokens[token] = _Token(
            spec.method, spec.sitekey, spec.pageurl, captcha.ready_at, expires_at
        )

    # -- res.php -----------------------------------------------------------------------
    def res_php(self, params: Mapping[str, str]) -> _Reply:
        json_mode = _wants_json(params)
        action = params.get("action", "").strip()
        with self._lock:
            now = self._clock()
            self._counts["res_php_requests"] += 1
            ids, bulk = self._requested_ids(params)
            if action == "get":
                self._counts["res_php_get_requests"] += 1
                self._counts["res_php_ids"] += len(ids)
                if len(ids) == 1 and not bulk:
                    self._poll_times.setdefault(ids[0], []).append(now)
            problem = self._key_error(params)
            if problem is not None:
                return _fail(problem, json_mode)
            injected = self._maybe_inject(json_mode)
            if injected is not None:
                return injected
            if action != "get":
                return self._other_action(action, params, json_mode, now)
            if bulk:
                return self._get_many(ids, json_mode, now)
            return self._get_one(ids, json_mode, now)

    def _requested_ids(self, params: Mapping[str, str]) -> tuple[list[str], bool]:
        """The ids a get asks for, and whether it is a bulk request."""
        ids = [part.strip() for part in params.get("ids", "").split(",") if part.strip()]
        if ids and self._config.bulk:
            return ids, True
        # A server without bulk support ignores ``ids`` and sees no ``id`` at all.
        single = params.get("id", "").strip()
        return ([single] if single else []), False

    def _get_one(self, ids: Sequence[str], json_mode: bool, now: float) -> _Reply:
        captcha = self._captchas.get(ids[0]) if ids else None
        if captcha is None:
            return _fail("ERROR_WRONG_CAPTCHA_ID", json_mode)
        captcha.asked = True
        if now < captcha.ready_at:
            return _fail("CAPCHA_NOT_READY", json_mode)
        if captcha.error is not None or captcha.answer is None:
            return _fail(captcha.error or "ERROR_CAPTCHA_UNSOLVABLE", json_mode)
        self._mark_read(captcha)
        answer = captcha.answer
        text = _geetest_text(answer) if isinstance(answer, dict) else answer
        if not json_mode:
            return _text_reply(f"OK|{text}")
        return _json_reply(_solved_fields(captcha, answer))

    def _get_many(self, ids: Sequence[str], json_mode: bool, now: float) -> _Reply:
        if len(ids) > MAX_BULK_IDS:
            return _fail("ERROR_BAD_PARAMETERS", json_mode)
        joined = "|".join(self._bulk_item(captcha_id, now) for captcha_id in ids)
        return _api(True, joined, json_mode)

    def _bulk_item(self, captcha_id: str, now: float) -> str:
        captcha = self._captchas.get(captcha_id)
        if captcha is None:
            return "ERROR_WRONG_CAPTCHA_ID"
        captcha.asked = True
        if now < captcha.ready_at:
            return "CAPCHA_NOT_READY"
        if captcha.error is not None or captcha.answer is None:
            return captcha.error or "ERROR_CAPTCHA_UNSOLVABLE"
        self._mark_read(captcha)
        answer = captcha.answer
        return _geetest_text(answer) if isinstance(answer, dict) else answer

    def _mark_read(self, captcha: _Captcha) -> None:
        if captcha.read_epoch != self._epoch:
            captcha.read_epoch = self._epoch
            self._counts["solved_reads"] += 1
            self._close_latch_if_due()

    def _close_latch_if_due(self) -> None:
        """``hold_after_reads``: the latch closes at the read it was waiting for."""
        due = self._hold_at_read
        if due is not None and self._counts["solved_reads"] >= due:
            self._config = dataclasses.replace(self._config, hold=True, hold_after_reads=None)
            self._clock.hold(True)
            self._hold_at_read = None

    def _other_action(
        self, action: str, params: Mapping[str, str], json_mode: bool, now: float
    ) -> _Reply:
        if action == "getbalance":
            return _api(True, _decimal(self._balance()), json_mode)
        if action in ("reportbad", "reportgood"):
            if params.get("id", "").strip() not in self._captchas:
                return _fail("ERROR_WRONG_CAPTCHA_ID", json_mode)
            self._counts["reports_bad" if action == "reportbad" else "reports_good"] += 1
            return _api(True, "OK_REPORT_RECORDED", json_mode)
        if action in ("add_pingback", "del_pingback", "get_pingback"):
            return self._pingback_action(action, params.get("addr", "").strip(), json_mode)
        if action == "threadsinfo":
            threads = self._config.threads
            working = min(self._release(now), threads)  # the queued wait for a thread
            if json_mode:  # CaptchaAI: the counts are top-level fields
                return _json_reply({"status": 1, "threads": threads, "working_threads": working})
            return _text_reply(f"threads={threads}|working_threads={working}")
        return _fail("ERROR_BAD_PARAMETERS", json_mode)

    def _pingback_action(self, action: str, addr: str, json_mode: bool) -> _Reply:
        if action == "get_pingback":
            return _api(
                True, sorted(self._pingback_addrs), json_mode, ",".join(self._pingback_addrs)
            )
        if action == "del_pingback":
            self._pingback_addrs.difference_update(
                set(self._pingback_addrs) if addr == "all" else {addr}
            )
            return _api(True, "OK", json_mode, "OK")
        if not addr.startswith(("http://", "https://")):
            return _fail("ERROR_BAD_PARAMETERS", json_mode)
        self._pingback_addrs.add(addr)
        return _api(True, "OK", json_mode, "OK")

    # -- siteverify --------------------------------------------------------------------
    def siteverify(self, params: Mapping[str, str]) -> _Reply:
        value = params.get("response", "").strip()
        with self._lock:
            now = self._clock()
            token = self._tokens.get(value) if value else None
            if token is None or now < token.valid_from:
                return self._verify_failed("unknown-token")
            if token.used:
                return self._verify_failed("already-used")
            if now >= token.expires_at:
                return self._verify_failed("expired-token")
            token.used = True
            self._counts["verifies_ok"] += 1
            return _json_reply(
                {
                    "success": True,
                    "method": token.method,
                    "sitekey": token.sitekey,
                    "pageurl": token.pageurl,
                }
            )

    def _verify_failed(self, code: str) -> _Reply:
        self._counts["verifies_failed"] += 1
        return _json_reply({"success": False, "error-codes": [code]})


def _solved_fields(captcha: _Captcha, answer: str | dict[str, str]) -> dict[str, Any]:
    """A solved captcha's JSON reply, as CaptchaAI sends it for its method."""
    data: dict[str, Any] = {"status": 1}
    data["result" if captcha.in_result else "request"] = answer
    if captcha.user_agent is not None:
        data["user_agent"] = captcha.user_agent
    return data


def _decimal(value: float) -> str:
    text = f"{value:.10f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


# -- HTTP --------------------------------------------------------------------------------


def _query_params(text: str) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(text, keep_blank_values=True).items()}


def _admin_stats(state: _State, body: bytes) -> _Reply:
    return _json_reply(state.stats())


def _admin_reset(state: _State, body: bytes) -> _Reply:
    state.reset()
    return _json_reply({"ok": True})


def _admin_get_config(state: _State, body: bytes) -> _Reply:
    return _json_reply(state.config().public_dict())


def _admin_set_config(state: _State, body: bytes) -> _Reply:
    try:
        changes = json.loads(body or b"{}")
    except ValueError:
        return _json_reply({"error": "body must be a JSON object"}, 400)
    if not isinstance(changes, dict):
        return _json_reply({"error": "body must be a JSON object"}, 400)
    try:
        config = state.update_config(changes)
    except ValueError as exc:
        return _json_reply({"error": str(exc)}, 400)
    return _json_reply(config.public_dict())


def _admin_ready(state: _State, query: str) -> _Reply:
    ids = [i for i in _query_params(query).get("ids", "").split(",") if i]
    return _json_reply(state.ready_times(ids))


def _health(state: _State, body: bytes) -> _Reply:
    return _text_reply("ok")


_PROTOCOL_ROUTES: dict[str, Callable[[_State, Mapping[str, str]], _Reply]] = {
    "/in.php": _State.in_php,
    "/res.php": _State.res_php,
    "/siteverify": _State.siteverify,
}
_ADMIN_ROUTES: dict[tuple[str, str], Callable[[_State, bytes], _Reply]] = {
    ("GET", "/health"): _health,
    ("GET", "/sandbox/stats"): _admin_stats,
    ("POST", "/sandbox/reset"): _admin_reset,
    ("GET", "/sandbox/config"): _admin_get_config,
    ("POST", "/sandbox/config"): _admin_set_config,
}
_ADMIN_PATHS = {path for _, path in _ADMIN_ROUTES}

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def wsgi_app(state: _State) -> Callable[[dict[str, Any], StartResponse], list[bytes]]:
    """The sandbox as a WSGI application."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        reply = _handle(state, environ)
        status = f"{reply.status} {HTTPStatus(reply.status).phrase}"
        headers = [("Content-Type", reply.content_type), ("Content-Length", str(len(reply.body)))]
        headers += list(reply.headers)
        start_response(status, headers)
        return [reply.body]

    return app


def _handle(state: _State, environ: Mapping[str, Any]) -> _Reply:
    body = _read_body(environ, state.body_limit())
    if body is None:
        return _text_reply("bad or too large Content-Length", 413)
    try:
        return _route(state, environ, body)
    except Exception as exc:  # a sandbox bug must still answer, or keep-alive clients hang
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        # Only the type and place: an exception message could contain request data.
        print(f"sandbox: internal error {type(exc).__name__} at {frame.lineno}", file=sys.stderr)
        return _text_reply("sandbox internal error", 500)


def _read_body(environ: Mapping[str, Any], limit: int) -> bytes | None:
    raw = environ.get("CONTENT_LENGTH") or "0"
    length = int(raw) if raw.isdigit() else -1
    if length < 0 or length > limit:
        return None
    return bytes(environ["wsgi.input"].read(length)) if length else b""


def _json_route(state: _State, dialect: Dialect, endpoint: str, body: bytes) -> _Reply:
    fault = state.transport_fault(submit=endpoint == "createTask")
    if isinstance(fault, _Reply):
        return fault
    if fault is not None:
        fault.gate.wait(fault.seconds)  # the client has given up by then
        if fault.then is not None:
            return fault.then
    return _json_reply(json_call(state, dialect, endpoint, body))


def _route(state: _State, environ: Mapping[str, Any], body: bytes) -> _Reply:
    verb, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
    dialect = DIALECTS.get(state.config().kind)
    if dialect is not None and verb == "POST" and path.lstrip("/") in JSON_ENDPOINTS:
        return _json_route(state, dialect, path.lstrip("/"), body)
    protocol = _PROTOCOL_ROUTES.get(path)
    if protocol is not None and path != "/siteverify":
        fault = state.transport_fault(submit=path == "/in.php")
        if isinstance(fault, _Reply):
            return fault
        if fault is not None:
            fault.gate.wait(fault.seconds)  # the client has given up by then
            if fault.then is not None:
                return fault.then
    if protocol is not None:
        params = _query_params(environ.get("QUERY_STRING", ""))
        content_type = (environ.get("CONTENT_TYPE") or "").split(";")[0].strip().lower()
        if body and content_type in ("", "application/x-www-form-urlencoded"):
            params.update(_query_params(body.decode("utf-8", errors="replace")))
        return protocol(state, params)
    if (verb, path) == ("GET", "/sandbox/ready"):
        return _admin_ready(state, environ.get("QUERY_STRING", ""))
    admin = _ADMIN_ROUTES.get((verb, path))
    if admin is not None:
        return admin(state, body)
    if path in _ADMIN_PATHS:
        return _text_reply("Method Not Allowed", 405)
    return _text_reply("Not Found", 404)


# -- public server -----------------------------------------------------------------------


class _WsgiServer(wsgi.Server):
    """cheroot's WSGI server, with SO_REUSEADDR on every listening socket.

    cheroot leaves it off for port 0; but the sockets a listener accepts inherit it, and a
    port is rebound at once despite their TIME_WAIT only if they have it: after an outage
    (the same port reopened) or a SIGKILL (a fresh process on the same port)."""

    # cheroot closes the listening socket only once its selector loop has noticed the stop:
    # the loop's timeout bounds how late an outage closes the port (cheroot's is 0.5 s).
    expiration_interval = 0.1

    @classmethod
    def prepare_socket(cls, *args: Any, **kwargs: Any) -> socket.socket:
        sock: socket.socket = super().prepare_socket(*args, **kwargs)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return sock


class _Listener:
    """One listening socket, served by cheroot (CherryPy's WSGI server) in a thread."""

    def __init__(self, app: Callable[..., list[bytes]], host: str, port: int) -> None:
        self.server = _WsgiServer(
            (host, port),
            app,
            numthreads=SERVER_THREADS,
            server_name="CaptchaAISandbox",
            timeout=_IDLE_CONNECTION_TIMEOUT,
        )
        self.server.prepare()
        self.thread = threading.Thread(
            target=self.server.serve, name=f"captcha-sandbox-{self.port}", daemon=True
        )

    @property
    def host(self) -> str:
        return str(self.server.bind_addr[0])

    @property
    def port(self) -> int:
        return int(self.server.bind_addr[1])

    def close(self) -> None:
        """Close the socket and drop every connection (answers being written still go out)."""
        self.server.stop()
        if self.thread.is_alive():
            self.thread.join()


class SandboxServer:
    """One provider: a CaptchaAI-compatible HTTP server on ``host:port`` (0 picks a free
    port), served in background threads.

    The socket is bound on construction, so :attr:`url` is known before :meth:`start`.  An
    outage window of mode "refuse" really closes it, and reopens it on the same port.
    With a ``journal``, every captcha it accepts (and so is paid for) is appended to that
    file as a JSON line before ``in.php`` answers: the count survives a SIGKILL.
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        journal: Path | None = None,
    ) -> None:
        self._state = _State(config if config is not None else SandboxConfig(), clock, journal)
        self._app = wsgi_app(self._state)
        listener = _Listener(self._app, host, port)
        self._listener: _Listener | None = listener
        self._host, self._port = listener.host, listener.port
        # Held while the listener is closed or reopened.
        self._lock = threading.Lock()
        self._supervisor: threading.Thread | None = None
        self._stopped = False
        self._reopen_failed = False

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        host = self._host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def name(self) -> str:
        """The provider's name (``SandboxConfig.name``)."""
        return self._state.config().name

    @property
    def listening(self) -> bool:
        """False while an outage of mode "refuse" keeps the port closed."""
        return self._listener is not None

    @property
    def config(self) -> SandboxConfig:
        """A copy of the current config."""
        return self._state.config()

    def start(self) -> SandboxServer:
        """Serve in background daemon threads; returns self."""
        if self._supervisor is not None or self._stopped:
            raise RuntimeError("a SandboxServer can only be started once")
        # An outage from the start keeps the port closed before anyone can connect.
        self._apply_outage(serving=False)
        if self._listener is not None:
            self._listener.thread.start()
        self._supervisor = threading.Thread(
            target=self._supervise, name=f"captcha-sandbox-outages-{self.port}", daemon=True
        )
        self._supervisor.start()
        return self

    def _supervise(self) -> None:
        changed = self._state.changed
        while not self._stopped:
            changed.clear()  # before looking, so a change made meanwhile wakes the wait
            watch = self._apply_outage()
            changed.wait(_OUTAGE_TICK if watch else None)

    def _apply_outage(self, serving: bool = True) -> bool:
        """Close or reopen the listener as the outage window says; returns whether to keep
        watching the clock."""
        with self._lock:
            if self._stopped:
                return False
            refuse, watch = self._state.outage_tick()
            if refuse and self._listener is not None:
                # not listening from before the port closes: a caller refused a connection
                # finds it so, however long the close takes (it joins cheroot's thread)
                closing, self._listener = self._listener, None
                self._state.listener_closing()
                closing.close()
            elif not refuse and self._listener is None:
                try:
                    listener = _Listener(self._app, self._host, self._port)
                except OSError as exc:  # the port was taken meanwhile: try again soon
                    if not self._reopen_failed:
                        print(f"sandbox: cannot reopen port {self._port}: {exc}", file=sys.stderr)
                    self._reopen_failed = True
                    return True
                self._reopen_failed = False
                self._state.listener_opened()
                if serving:
                    listener.thread.start()
                self._listener = listener
            return watch

    def stop(self) -> None:
        """Stop serving, close the listening socket and drop open connections."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._state.drop_hangs()
        self._state.changed.set()
        if self._supervisor is not None:
            self._supervisor.join()
        if self._listener is not None:
            self._listener.close()
        self._state.caller.stop()
        self._state.close()

    def __enter__(self) -> SandboxServer:
        if self._supervisor is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stats(self) -> dict[str, Any]:
        """Counters and config, as served by ``GET /sandbox/stats``."""
        return self._state.stats()

    def poll_times(self, captcha_id: str) -> list[float]:
        """When the captcha (the sandbox's id) was asked for alone, on the sandbox's clock:
        a JSON face's getTaskResult requests for one task, oldest first."""
        return self._state.poll_times(captcha_id)

    def ready_times(self, ids: Sequence[str]) -> dict[str, float]:
        """When each captcha's answer was ready, as Unix time (``GET /sandbox/ready``)."""
        return self._state.ready_times(ids)

    def token_ready_times(self, tokens: Sequence[str]) -> dict[str, float]:
        """When the captcha of each token had its answer ready, as Unix time (for latency
        benchmarks whose results carry tokens, not captcha ids)."""
        return self._state.token_ready_times(tokens)

    def reset(self) -> None:
        """Zero the counters and the in-flight peak; captchas and config are kept."""
        self._state.reset()

    def update_config(self, **changes: Any) -> SandboxConfig:
        """Change config fields (validated as in :class:`SandboxConfig`); returns the result.

        Unlike ``POST /sandbox/config``, an outage that starts now has begun on return (a
        "refuse" one has closed the port)."""
        config = self._state.update_config(changes)
        if self._supervisor is not None:
            self._apply_outage()
        return config


def serve(
    host: str, providers: Mapping[int, SandboxConfig], journal_dir: Path | None = None
) -> None:
    """Run one sandbox per ``port: config`` in the foreground until interrupted (Ctrl-C or
    SIGTERM), each journaling its paid captchas to ``journal_dir/<name>.paid.jsonl`` when
    given.  Raises ``OSError`` naming the port when one cannot be bound."""
    servers: list[SandboxServer] = []
    try:
        for port, config in providers.items():
            journal = journal_path(journal_dir, config.name) if journal_dir else None
            try:
                servers.append(SandboxServer(config, host, port, journal=journal))
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot listen on {host}:{port} ({config.name}): {exc.strerror}"
                ) from None
        for server in servers:
            server.start()
            settings = json.dumps(server.config.public_dict(), sort_keys=True)
            keys = len(server.config.api_keys)
            print(f"CaptchaAI sandbox on {server.url} ({keys} API key(s)) config={settings}")
        print(f"{len(servers)} provider(s) ready", flush=True)
        _wait_for_a_stop_signal()
    finally:
        for server in servers:
            server.stop()


def journal_path(directory: Path, provider: str) -> Path:
    """Where :func:`serve` journals the captchas ``provider`` accepted."""
    return directory / f"{provider}.paid.jsonl"


def _wait_for_a_stop_signal() -> None:
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with contextlib.suppress(KeyboardInterrupt):
        stopping.wait()
