"""The sandbox API server, over real HTTP, with a fake clock instead of sleeping."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from captcha_tasks.testing.processes import RESTART_ID_STEP, SandboxProcess, free_port, wait_until
from captcha_tasks.testing.sandbox import (
    FIRST_CAPTCHA_ID,
    MAX_BULK_IDS,
    SandboxConfig,
    SandboxServer,
)

pytestmark = pytest.mark.redis

KEY = "sandbox-test-" + os.urandom(4).hex()
PAGE = "https://example.com/login"
RECAPTCHA = {"method": "userrecaptcha", "googlekey": "6Lc-site", "pageurl": PAGE}
TURNSTILE = {"method": "turnstile", "sitekey": "0x4AAA-site", "pageurl": PAGE}
GEETEST = {"method": "geetest", "gt": "gt-value", "challenge": "ch-value", "pageurl": PAGE}
IMAGE = {"method": "base64", "body": base64.b64encode(b"\x89PNG fake image bytes").decode()}
TRANSIENT = {"http-500-html", "http-200-html", "empty", "ERROR_SERVER_ERROR"}


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Api:
    """A client for one sandbox: protocol calls with the test key, plus admin calls."""

    def __init__(self, server: SandboxServer, clock: FakeClock, key: str = KEY) -> None:
        self.server = server
        self.clock = clock
        self.key = key
        self.url = server.url
        self.session = requests.Session()

    @property
    def config(self) -> SandboxConfig:
        return self.server.config

    def in_php(self, fields: dict[str, Any], *, json: bool = False, **kw: Any) -> Any:
        return self._call("in.php", {**fields, **kw}, json)

    def res_php(self, *, json: bool = False, **fields: Any) -> Any:
        return self._call("res.php", fields, json)

    def _call(self, endpoint: str, fields: dict[str, Any], json: bool) -> Any:
        data = {"key": self.key, **fields}
        if json:
            data["json"] = 1
        resp = self.session.post(f"{self.url}/{endpoint}", data=data, timeout=5)
        assert resp.status_code == 200, resp.text
        if json:
            assert resp.headers["Content-Type"] == "application/json"
            return resp.json()
        assert resp.headers["Content-Type"] == "text/plain"
        return resp.text

    def submit(self, fields: dict[str, Any], **kw: Any) -> str:
        reply = self.in_php(fields, json=True, **kw)
        assert reply["status"] == 1, reply
        return str(reply["request"])

    def get(self, captcha_id: str) -> Any:
        return self.res_php(json=True, action="get", id=captcha_id)

    def verify(self, token: str) -> dict[str, Any]:
        resp = self.session.post(f"{self.url}/siteverify", data={"response": token}, timeout=5)
        assert resp.status_code == 200
        return dict(resp.json())

    def stats(self) -> dict[str, Any]:
        return dict(self.session.get(f"{self.url}/sandbox/stats", timeout=5).json())

    def solve_all(self) -> None:
        cfg = self.config
        self.clock.advance(cfg.solve_time + cfg.jitter + 0.001)


@pytest.fixture
def make_api() -> Iterator[Callable[..., Api]]:
    started: list[Api] = []

    def make(**config: Any) -> Api:
        clock = FakeClock()
        config.setdefault("api_keys", (KEY,))
        server = SandboxServer(SandboxConfig(**config), clock=clock).start()
        api = Api(server, clock, config["api_keys"][0])
        started.append(api)
        return api

    yield make
    for api in started:
        api.session.close()
        api.server.stop()


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api(seed=7)


# -- solve times ---------------------------------------------------------------------------


def solve_times(api: Api, sitekeys: list[str]) -> dict[str, float]:
    """Each task's solve time (less the shortest), all submitted at once in this order."""
    ids = {key: api.submit({**RECAPTCHA, "googlekey": key}) for key in sitekeys}
    ready = api.server.ready_times(list(ids.values()))
    first = min(ready.values())
    return {key: ready[cid] - first for key, cid in ids.items()}


def test_with_solve_times_by_task_a_task_takes_its_time_whatever_its_turn(
    make_api: Callable[..., Api],
) -> None:
    keys = [f"site-{n}" for n in range(6)]
    one = solve_times(make_api(seed=5, solve_times_by_task=True), keys)
    other = solve_times(make_api(seed=5, solve_times_by_task=True), keys[::-1])
    assert one == pytest.approx(other)
    assert len({round(t, 6) for t in one.values()}) == len(keys)  # still drawn, not one
    by_turn = solve_times(make_api(seed=5), keys[::-1])
    assert by_turn != pytest.approx(solve_times(make_api(seed=5), keys))  # by turn otherwise


# -- submit and poll -----------------------------------------------------------------------


def test_not_ready_then_ready_text_mode(api: Api) -> None:
    reply = api.in_php(RECAPTCHA)
    assert reply.startswith("OK|")
    captcha_id = reply.split("|", 1)[1]
    assert captcha_id.isdigit() and int(captcha_id) >= FIRST_CAPTCHA_ID

    assert api.res_php(action="get", id=captcha_id) == "CAPCHA_NOT_READY"
    api.solve_all()
    answer = api.res_php(action="get", id=captcha_id)
    assert answer.startswith("OK|03A")
    token = answer[3:]
    assert len(token) >= 200
    assert set(token) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
    # Reading an answer does not consume it.
    assert api.res_php(action="get", id=captcha_id) == answer
    assert api.stats()["solved_reads"] == 1


def test_ready_exactly_at_solve_time_without_jitter(make_api: Callable[..., Api]) -> None:
    api = make_api(solve_time=2.0, jitter=0.0)
    captcha_id = api.submit(TURNSTILE)
    api.clock.advance(api.config.solve_time - 0.5)
    assert api.get(captcha_id) == {"status": 0, "request": "CAPCHA_NOT_READY"}
    api.clock.advance(0.5)
    assert api.get(captcha_id)["status"] == 1


def test_hold_keeps_every_answer_and_thread_until_released(make_api: Callable[..., Api]) -> None:
    api = make_api(solve_time=2.0, jitter=0.0, threads=1)
    before = api.submit(TURNSTILE)
    api.clock.advance(1.5)
    api.server.update_config(hold=True)
    api.clock.advance(60)  # however long it is held, nothing becomes ready
    assert api.get(before) == {"status": 0, "request": "CAPCHA_NOT_READY"}
    assert api.stats()["in_flight"] == 1
    assert api.in_php(TURNSTILE, json=True)["request"] == "ERROR_NO_SLOT_AVAILABLE"
    api.server.update_config(hold=False)
    assert api.get(before)["status"] == 0  # time runs on from where it stopped
    api.clock.advance(0.5)
    assert api.get(before)["status"] == 1 and api.stats()["in_flight"] == 0


def test_the_latch_closes_itself_after_the_reads_it_was_given(
    make_api: Callable[..., Api],
) -> None:
    api = make_api(solve_time=2.0, jitter=0.0, threads=3)
    first, second = api.submit(TURNSTILE), api.submit(TURNSTILE)
    api.clock.advance(1.0)
    late = api.submit(TURNSTILE)  # ready one second after the other two
    api.clock.advance(1.0)
    api.server.update_config(hold_after_reads=1)
    assert api.get(first)["status"] == 1  # the first read closes the latch
    config = api.server.config
    assert config.hold is True and config.hold_after_reads is None
    api.clock.advance(60)
    assert api.get(second)["status"] == 1  # ready before it closed: read as ever
    assert api.get(late) == {"status": 0, "request": "CAPCHA_NOT_READY"}
    api.server.update_config(hold=False)
    api.clock.advance(1.0)
    assert api.get(late)["status"] == 1
    with pytest.raises(ValueError, match="hold_after_reads must be an integer"):
        api.server.update_config(hold_after_reads=0.5)
    with pytest.raises(ValueError, match="hold_after_reads must be"):
        api.server.update_config(hold_after_reads=0)


def test_json_replies_and_unique_increasing_ids(api: Api) -> None:
    ids = [api.submit(TURNSTILE) for _ in range(5)]
    assert [int(i) for i in ids] == sorted(int(i) for i in ids)
    assert len(set(ids)) == len(ids)
    api.solve_all()
    tokens = [api.get(i)["request"] for i in ids]
    assert all(t.startswith("0.") and len(t) >= 200 for t in tokens)
    assert len(set(tokens)) == len(tokens)


def test_get_params_work_in_query_string(api: Api) -> None:
    resp = api.session.get(f"{api.url}/in.php", params={"key": KEY, **RECAPTCHA}, timeout=5)
    assert resp.text.startswith("OK|")
    captcha_id = resp.text[3:]
    resp = api.session.get(
        f"{api.url}/res.php", params={"key": KEY, "action": "get", "id": captcha_id}, timeout=5
    )
    assert resp.text == "CAPCHA_NOT_READY"
    assert resp.raw.version == 11  # HTTP/1.1, so the connection can be kept alive


def test_unknown_id(api: Api) -> None:
    assert api.get("123") == {"status": 0, "request": "ERROR_WRONG_CAPTCHA_ID"}
    assert api.res_php(action="get") == "ERROR_WRONG_CAPTCHA_ID"


def test_unsolvable_rate_one(make_api: Callable[..., Api]) -> None:
    api = make_api(unsolvable_rate=1.0)
    ids = [api.submit(fields) for fields in (RECAPTCHA, TURNSTILE, GEETEST, IMAGE)]
    assert all(api.get(i)["request"] == "CAPCHA_NOT_READY" for i in ids)
    api.solve_all()
    assert [api.get(i) for i in ids] == [
        {"status": 0, "request": "ERROR_CAPTCHA_UNSOLVABLE"} for _ in ids
    ]


def test_never_asked_counts_orphans_and_which_were_unsolvable(make_api: Callable[..., Api]) -> None:
    api = make_api(unsolvable_rate=1.0)
    orphan, asked = api.submit(RECAPTCHA), api.submit(RECAPTCHA)
    resp = api.session.post(f"{api.url}/sandbox/config", json={"unsolvable_rate": 0.0}, timeout=5)
    assert resp.status_code == 200
    api.submit(RECAPTCHA)  # a solvable orphan
    api.get(asked)
    stats = api.stats()
    assert orphan != asked and stats["unsolvable_created"] == 2
    assert (stats["never_asked"], stats["never_asked_unsolvable"]) == (2, 1)


def test_bad_proxy_fails_at_ready_time(api: Api) -> None:
    captcha_id = api.submit(RECAPTCHA, proxy="user:pw@bad-proxy.example:3128", proxytype="HTTP")
    good_id = api.submit(RECAPTCHA, proxy="user:pw@proxy.example:3128", proxytype="HTTP")
    assert api.get(captcha_id)["request"] == "CAPCHA_NOT_READY"
    api.solve_all()
    assert api.get(captcha_id) == {"status": 0, "request": "ERROR_PROXY_CONNECTION_FAILED"}
    assert api.get(good_id)["status"] == 1


# -- thread limit ----------------------------------------------------------------------------


def test_thread_limit_uses_configured_error_and_tracks_peak(make_api: Callable[..., Api]) -> None:
    api = make_api(threads=3, thread_error="ERROR_ZERO_BALANCE", solve_time=10.0, jitter=0.0)
    threads = api.config.threads
    ids = [api.submit(RECAPTCHA) for _ in range(threads)]
    assert api.in_php(RECAPTCHA) == api.config.thread_error
    assert api.in_php(TURNSTILE, json=True) == {"status": 0, "request": api.config.thread_error}

    stats = api.stats()
    assert stats["submits"] == threads
    assert stats["thread_rejections"] == 2
    assert stats["in_flight"] == threads
    assert stats["peak_in_flight"] == threads
    info = api.res_php(json=True, action="threadsinfo")
    # CaptchaAI: the counts are top-level fields
    assert info == {"status": 1, "threads": threads, "working_threads": threads}

    # A thread is held until the captcha's ready time, then freed.
    api.clock.advance(api.config.solve_time)
    assert api.res_php(action="threadsinfo") == f"threads={threads}|working_threads=0"
    assert api.get(ids[0])["status"] == 1
    api.submit(RECAPTCHA)
    stats = api.stats()
    assert stats["in_flight"] == 1
    assert stats["peak_in_flight"] == threads


def test_peak_counts_the_new_submit_even_if_instant(make_api: Callable[..., Api]) -> None:
    api = make_api(solve_time=0.0, jitter=0.0)
    captcha_id = api.submit(IMAGE)
    assert api.get(captcha_id)["status"] == 1
    stats = api.stats()
    assert (stats["in_flight"], stats["peak_in_flight"]) == (0, 1)


def test_failed_captchas_hold_their_thread(make_api: Callable[..., Api]) -> None:
    api = make_api(threads=1, unsolvable_rate=1.0)
    api.submit(IMAGE)
    assert api.in_php(IMAGE) == api.config.thread_error
    api.solve_all()
    api.submit(IMAGE)


# -- answers by method -------------------------------------------------------------------------


def test_geetest_answer_json_and_text(api: Api) -> None:
    captcha_id = api.submit(GEETEST, api_server="api.geetest.com")
    api.solve_all()
    answer = api.get(captcha_id)["request"]
    assert set(answer) == {"geetest_challenge", "geetest_validate", "geetest_seccode"}
    assert answer["geetest_challenge"] == GEETEST["challenge"]
    text = api.res_php(action="get", id=captcha_id)
    assert text == (
        f"OK|challenge:{answer['geetest_challenge']},validate:{answer['geetest_validate']},"
        f"seccode:{answer['geetest_seccode']}"
    )
    verdict = api.verify(answer["geetest_validate"])
    assert verdict == {
        "success": True,
        "method": "geetest",
        "sitekey": GEETEST["gt"],
        "pageurl": GEETEST["pageurl"],
    }


def test_image_answers_keep_pipes_in_json_mode(make_api: Callable[..., Api]) -> None:
    api = make_api(seed=7, threads=40)
    ids = [api.submit(IMAGE) for _ in range(api.config.threads)]
    api.solve_all()
    answers = [api.get(i)["request"] for i in ids]
    assert all(4 <= len(a) <= 8 for a in answers)
    piped = [(i, a) for i, a in zip(ids, answers, strict=True) if "|" in a]
    assert piped, "expected some image answers with a pipe"
    assert len(piped) < len(answers)
    captcha_id, answer = piped[0]
    assert api.res_php(action="get", id=captcha_id) == f"OK|{answer}"
    assert api.verify(answer)["error-codes"] == ["unknown-token"]


def test_image_numeric_and_length_options(api: Api) -> None:
    captcha_id = api.submit(IMAGE, numeric=1, min_len=6, max_len=6)
    api.solve_all()
    answer = api.get(captcha_id)["request"]
    assert len(answer) == 6
    assert set(answer) <= set("0123456789|")


def test_image_size_checks(make_api: Callable[..., Api]) -> None:
    api = make_api(max_image_bytes=100)
    limit = api.config.max_image_bytes
    at_limit = base64.b64encode(b"x" * limit).decode()
    too_big = base64.b64encode(b"x" * (limit + 1)).decode()
    assert api.in_php({**IMAGE, "body": at_limit}).startswith("OK|")
    assert api.in_php({**IMAGE, "body": too_big}) == "ERROR_TOO_BIG_CAPTCHA_FILESIZE"
    for body in ("", "not base64 !!!"):
        assert api.in_php({**IMAGE, "body": body}) == "ERROR_ZERO_CAPTCHA_FILESIZE"
    assert api.in_php({"method": "base64"}) == "ERROR_ZERO_CAPTCHA_FILESIZE"


PROXY = {"proxy": "user:pw@10.0.0.1:3128", "proxytype": "HTTP"}
CELL = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(2000)).decode()
NEW_METHODS: list[tuple[dict[str, Any], str, bool]] = [
    # fields, the field holding the answer, whether a user agent comes with it
    ({**RECAPTCHA, "enterprise": 1}, "result", True),
    ({**RECAPTCHA, "version": "v3", "action": "login", "enterprise": "1"}, "result", True),
    ({"method": "cloudflare_challenge", "pageurl": PAGE, **PROXY}, "result", True),
    ({"method": "captchafox", "sitekey": "sk-fox", "pageurl": PAGE, **PROXY}, "request", True),
    ({"method": "friendly_captcha", "sitekey": "FCM1", "pageurl": PAGE}, "request", False),
    (
        {"method": "friendly_captcha", "sitekey": "FCM2", "pageurl": PAGE, "version": "v2"},
        "request",
        False,
    ),
]


@pytest.mark.parametrize(("fields", "where", "agent"), NEW_METHODS)
def test_captchaai_token_methods(api: Api, fields: dict[str, Any], where: str, agent: bool) -> None:
    captcha_id = api.submit(fields)
    api.solve_all()
    reply = api.get(captcha_id)
    assert reply["status"] == 1
    other = {"result", "request"} - {where}
    assert other.isdisjoint(reply), reply
    token = reply[where]
    assert api.verify(token)["success"] is True
    assert ("user_agent" in reply) is agent
    if agent:
        assert reply["user_agent"].startswith("Mozilla/5.0")
        mine = api.submit(fields, userAgent="Mozilla/5.0 mine")
        api.solve_all()
        assert api.get(mine)["user_agent"] == "Mozilla/5.0 mine"
    assert api.res_php(action="get", id=captcha_id) == f"OK|{token}"


def test_captchaai_structured_answers(api: Api) -> None:
    grid = api.submit({"method": "base64", "body": CELL, "instructions": "bus", "grid_size": "4x4"})
    bls = api.submit(
        {"method": "bls", "instructions": "cars"}
        | {f"image_base64_{n}": f"data:image/png;base64,{CELL}" for n in range(1, 10)}
    )
    lemin = api.submit(
        {"method": "lemin", "captcha_id": "CROPPED_x", "div_id": "lemin-box", "pageurl": PAGE}
    )
    api.solve_all()
    for captcha_id, cells in ((grid, 16), (bls, 9)):
        text = api.get(captcha_id)["request"]
        assert isinstance(text, str)
        chosen = json.loads(text)
        assert chosen and set(chosen) <= set(range(1, cells + 1)), chosen
    answer = json.loads(api.get(lemin)["request"])
    assert set(answer) == {"answer", "challenge_uuid"}
    assert api.verify(answer["answer"])["sitekey"] == "CROPPED_x"
    by_method = api.stats()["submits_by_method"]
    assert (by_method["base64"], by_method["bls"], by_method["lemin"]) == (1, 1, 1)


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"method": "cloudflare_challenge", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        ({"method": "cloudflare_challenge", **PROXY}, "ERROR_PAGEURL"),
        ({"method": "captchafox", "sitekey": "k", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        ({"method": "friendly_captcha", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        (
            {"method": "friendly_captcha", "sitekey": "k", "pageurl": PAGE, "version": "v9"},
            "ERROR_BAD_PARAMETERS",
        ),
        ({"method": "lemin", "captcha_id": "c", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        (
            {"method": "base64", "body": CELL, "grid_size": "5x5", "instructions": "x"},
            "ERROR_BAD_PARAMETERS",
        ),
        ({"method": "base64", "body": CELL, "grid_size": "3x3"}, "ERROR_BAD_PARAMETERS"),
        (
            {"method": "bls", "instructions": "x"}
            | {f"image_base64_{n}": CELL for n in range(1, 9)},
            "ERROR_ZERO_CAPTCHA_FILESIZE",
        ),
    ],
)
def test_captchaai_methods_refuse_bad_requests(api: Api, fields: dict[str, Any], code: str) -> None:
    assert api.in_php(fields) == code


# -- siteverify ------------------------------------------------------------------------------


def test_token_single_use_and_expiry(make_api: Callable[..., Api]) -> None:
    api = make_api(solve_time=1.0, jitter=0.0, token_ttl={"userrecaptcha": 30, "turnstile": 60})
    first, second = api.submit(RECAPTCHA), api.submit(RECAPTCHA)
    api.solve_all()
    token, other = api.get(first)["request"], api.get(second)["request"]

    assert api.verify(token) == {
        "success": True,
        "method": "userrecaptcha",
        "sitekey": RECAPTCHA["googlekey"],
        "pageurl": RECAPTCHA["pageurl"],
    }
    assert api.verify(token) == {"success": False, "error-codes": ["already-used"]}

    # The token's life starts at the ready time, not at the first read.
    # Its life started at the ready time, which solve_all() passed a moment ago.
    api.clock.advance(api.config.token_ttl["userrecaptcha"])
    assert api.verify(other) == {"success": False, "error-codes": ["expired-token"]}
    assert api.verify("03Anot-a-real-token") == {
        "success": False,
        "error-codes": ["unknown-token"],
    }
    stats = api.stats()
    assert (stats["verifies_ok"], stats["verifies_failed"]) == (1, 3)


def test_token_valid_until_just_before_ttl(make_api: Callable[..., Api]) -> None:
    api = make_api(solve_time=0.0, jitter=0.0, token_ttl={"turnstile": 50})
    captcha_id = api.submit(TURNSTILE)
    token = api.get(captcha_id)["request"]
    api.clock.advance(api.config.token_ttl["turnstile"] - 0.001)
    assert api.verify(token)["success"] is True


def test_token_unknown_before_ready(make_api: Callable[..., Api]) -> None:
    api = make_api(seed=3, solve_time=5.0)
    captcha_id = api.submit(TURNSTILE)
    # Peek through a second sandbox with the same seed: same tokens, but already solved.
    twin = make_api(seed=3, solve_time=0.0, jitter=0.0)
    token = twin.get(twin.submit(TURNSTILE))["request"]
    assert api.verify(token)["error-codes"] == ["unknown-token"]
    api.solve_all()
    assert api.get(captcha_id)["request"] == token
    assert api.verify(token)["success"] is True


# -- bulk --------------------------------------------------------------------------------------


def test_bulk_ids_keep_order_and_mark_each(make_api: Callable[..., Api]) -> None:
    api = make_api(solve_time=1.0, jitter=0.0)
    done = api.submit(RECAPTCHA)
    proxy_failed = api.submit(TURNSTILE, proxy="bad-proxy:1")
    api.solve_all()
    pending = api.submit(TURNSTILE)
    done_token = api.get(done)["request"]
    ids = [pending, done, "999", proxy_failed]
    expected = f"CAPCHA_NOT_READY|{done_token}|ERROR_WRONG_CAPTCHA_ID|ERROR_PROXY_CONNECTION_FAILED"

    assert api.res_php(action="get", ids=",".join(ids)) == expected
    assert api.res_php(json=True, action="get", ids=",".join(ids)) == {
        "status": 1,
        "request": expected,
    }
    api.solve_all()
    reply = api.res_php(action="get", ids=f"{pending},{done}")
    assert reply == f"{api.get(pending)['request']}|{done_token}"
    stats = api.stats()
    assert stats["res_php_ids"] == 1 + len(ids) + len(ids) + 2 + 1
    assert stats["res_php_get_requests"] == 5


def test_bulk_too_many_ids(api: Api) -> None:
    ids = ",".join(str(FIRST_CAPTCHA_ID + n) for n in range(MAX_BULK_IDS + 1))
    assert api.res_php(action="get", ids=ids) == "ERROR_BAD_PARAMETERS"
    within = ",".join(str(FIRST_CAPTCHA_ID + n) for n in range(MAX_BULK_IDS))
    assert api.res_php(action="get", ids=within).count("|") == MAX_BULK_IDS - 1


def test_bulk_disabled_ignores_ids(make_api: Callable[..., Api]) -> None:
    api = make_api(bulk=False, solve_time=0.0, jitter=0.0)
    captcha_id = api.submit(RECAPTCHA)
    assert api.res_php(action="get", ids=captcha_id) == "ERROR_WRONG_CAPTCHA_ID"
    assert api.res_php(json=True, action="get", ids=f"{captcha_id},{captcha_id}") == {
        "status": 0,
        "request": "ERROR_WRONG_CAPTCHA_ID",
    }
    assert api.get(captcha_id)["status"] == 1


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["in.php", "res.php"])
def test_key_errors(api: Api, endpoint: str) -> None:
    fields = {**RECAPTCHA, "action": "getbalance"}
    missing = api.session.post(f"{api.url}/{endpoint}", data=fields, timeout=5)
    assert missing.text == "ERROR_KEY_DOES_NOT_EXIST"
    wrong_key = "wrong-" + KEY
    wrong = api.session.post(
        f"{api.url}/{endpoint}", data={**fields, "key": wrong_key, "json": 1}, timeout=5
    )
    assert wrong.json() == {"status": 0, "request": "ERROR_WRONG_USER_KEY"}
    assert wrong_key not in wrong.text


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"method": "userrecaptcha", "pageurl": PAGE}, "ERROR_GOOGLEKEY"),
        ({"method": "userrecaptcha", "googlekey": "k"}, "ERROR_PAGEURL"),
        ({"method": "userrecaptcha", "googlekey": "k", "pageurl": "example.com"}, "ERROR_PAGEURL"),
        ({"method": "turnstile", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        ({"method": "turnstile", "sitekey": "s", "pageurl": "ftp://x"}, "ERROR_PAGEURL"),
        ({"method": "geetest", "gt": "g", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        ({"method": "geetest", "challenge": "c", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        ({"method": "geetest", "gt": "g", "challenge": "c"}, "ERROR_PAGEURL"),
        ({"method": "hcaptcha", "sitekey": "s", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
        ({"googlekey": "k", "pageurl": PAGE}, "ERROR_BAD_PARAMETERS"),
    ],
)
def test_missing_or_bad_params(api: Api, fields: dict[str, str], error: str) -> None:
    assert api.in_php(fields) == error
    assert api.in_php(fields, json=True) == {"status": 0, "request": error}
    assert api.stats()["submits"] == 0


def test_unknown_action(api: Api) -> None:
    assert api.res_php(action="nope") == "ERROR_BAD_PARAMETERS"
    assert api.res_php(json=True) == {"status": 0, "request": "ERROR_BAD_PARAMETERS"}


def _transient_kind(resp: requests.Response) -> str:
    if resp.status_code == 500 and resp.text.lstrip().startswith("<"):
        return "http-500-html"
    if resp.status_code != 200:
        return f"unexpected status {resp.status_code}"
    if resp.text == "":
        return "empty"
    if resp.text.lstrip().startswith("<"):
        return "http-200-html"
    if resp.headers["Content-Type"] == "application/json":
        return str(resp.json()["request"])
    return resp.text


def test_error_injection_only_transient_kinds(make_api: Callable[..., Api]) -> None:
    api = make_api(error_rate=1.0, seed=11)
    kinds = []
    for n in range(40):
        data = {"key": KEY, **RECAPTCHA, "action": "get", "id": "1", "json": n % 2}
        for endpoint in ("in.php", "res.php"):
            resp = api.session.post(f"{api.url}/{endpoint}", data=data, timeout=5)
            kinds.append(_transient_kind(resp))
    assert set(kinds) == TRANSIENT
    stats = api.stats()
    assert stats["submits"] == 0
    assert stats["injected_errors"] == len(kinds)
    # Key and parameter checks still come first.
    assert api.in_php(RECAPTCHA, key="wrong") == "ERROR_WRONG_USER_KEY"
    assert api.in_php({"method": "turnstile", "pageurl": PAGE}) == "ERROR_BAD_PARAMETERS"


def test_error_injection_rate_zero_never_fires(api: Api) -> None:
    for _ in range(api.config.threads):
        assert api.in_php(IMAGE).startswith("OK|")
    assert api.stats()["injected_errors"] == 0


# -- other res.php actions -------------------------------------------------------------------


def test_getbalance(make_api: Callable[..., Api]) -> None:
    api = make_api(balance=3.4523)
    assert float(api.res_php(action="getbalance")) == api.config.balance
    reply = api.res_php(json=True, action="getbalance")
    assert reply["status"] == 1
    assert isinstance(reply["request"], str)
    assert float(reply["request"]) == api.config.balance


def test_reportbad_and_reportgood(api: Api) -> None:
    captcha_id = api.submit(RECAPTCHA)
    api.solve_all()
    assert api.res_php(action="reportbad", id=captcha_id) == "OK_REPORT_RECORDED"
    assert api.res_php(json=True, action="reportbad", id=captcha_id) == {
        "status": 1,
        "request": "OK_REPORT_RECORDED",
    }
    assert api.res_php(action="reportgood", id=captcha_id) == "OK_REPORT_RECORDED"
    assert api.res_php(action="reportbad", id="42") == "ERROR_WRONG_CAPTCHA_ID"
    stats = api.stats()
    assert (stats["reports_bad"], stats["reports_good"]) == (2, 1)


# -- admin -----------------------------------------------------------------------------------


def test_stats_counts_requests_and_hides_keys(api: Api) -> None:
    captcha_id = api.submit(RECAPTCHA)
    api.submit(IMAGE)
    api.get(captcha_id)
    api.res_php(action="getbalance")
    resp = api.session.get(f"{api.url}/sandbox/stats", timeout=5)
    assert resp.headers["Content-Type"] == "application/json"
    assert KEY not in resp.text
    stats = resp.json()
    assert stats["in_php_requests"] == 2
    assert stats["res_php_requests"] == 2
    assert stats["res_php_get_requests"] == 1
    assert stats["submits_by_method"]["userrecaptcha"] == 1
    assert stats["submits_by_method"]["base64"] == 1
    assert "api_keys" not in stats["config"]
    assert stats["config"]["threads"] == api.config.threads
    assert stats == api.server.stats()


def test_reset_zeroes_counters_but_keeps_captchas(api: Api) -> None:
    captcha_id = api.submit(RECAPTCHA)
    api.solve_all()
    api.get(captcha_id)
    resp = api.session.post(f"{api.url}/sandbox/reset", timeout=5)
    assert resp.status_code == 200
    stats = api.stats()
    counters = {k: v for k, v in stats.items() if isinstance(v, int) and k != "captchas_stored"}
    assert counters and not any(counters.values()), counters
    assert not any(stats["submits_by_method"].values())
    # Captchas survive a reset, and a re-read counts again.
    assert api.get(captcha_id)["status"] == 1
    assert api.stats()["solved_reads"] == 1


def test_admin_config_updates_and_validates(api: Api) -> None:
    url = f"{api.url}/sandbox/config"
    resp = api.session.post(
        url, json={"threads": 2, "bulk": False, "thread_error": "E_X"}, timeout=5
    )
    assert resp.status_code == 200
    assert api.config.threads == 2 and api.config.bulk is False
    assert api.stats()["config"]["thread_error"] == "E_X"

    for bad, field in [({"threads": 0}, "threads"), ({"error_rate": 1.5}, "error_rate")]:
        resp = api.session.post(url, json=bad, timeout=5)
        assert resp.status_code == 400
        assert field in resp.json()["error"]
    resp = api.session.post(url, json={"no_such_field": 1}, timeout=5)
    assert resp.status_code == 400 and "no_such_field" in resp.json()["error"]
    resp = api.session.post(url, data=b"[1, 2]", timeout=5)
    assert resp.status_code == 400
    assert api.config.threads == 2  # unchanged by the rejected updates

    resp = api.session.post(url, json={"api_keys": ["new-secret-key"]}, timeout=5)
    assert resp.status_code == 200 and "new-secret-key" not in resp.text
    assert api.in_php(RECAPTCHA) == "ERROR_WRONG_USER_KEY"


def test_update_config_python_api(api: Api) -> None:
    new = api.server.update_config(solve_time=0.0, jitter=0.0)
    assert (new.solve_time, new.jitter) == (0.0, 0.0)
    assert api.get(api.submit(RECAPTCHA))["status"] == 1
    with pytest.raises(ValueError, match="jitter"):
        api.server.update_config(jitter=-1)


def test_health_and_unknown_paths(api: Api) -> None:
    resp = api.session.get(f"{api.url}/health", timeout=5)
    assert (resp.status_code, resp.text) == (200, "ok")
    assert api.session.get(f"{api.url}/nope", timeout=5).status_code == 404
    assert api.session.get(f"{api.url}/sandbox/reset", timeout=5).status_code == 405


def test_old_captchas_are_forgotten(make_api: Callable[..., Api]) -> None:
    api = make_api(solve_time=1.0, jitter=0.0, token_ttl={"userrecaptcha": 100, "base64": 100})
    old = api.submit(RECAPTCHA)
    api.clock.advance(api.config.solve_time + 10 * api.config.token_ttl["userrecaptcha"])
    api.submit(IMAGE)  # pruning happens on submit
    assert api.get(old)["request"] == "ERROR_WRONG_CAPTCHA_ID"
    assert api.stats()["captchas_stored"] == 1


def test_stop_closes_kept_alive_connections(make_api: Callable[..., Api]) -> None:
    api = make_api()
    assert api.session.get(f"{api.url}/health", timeout=5).text == "ok"
    api.server.stop()
    with pytest.raises(requests.ConnectionError):
        api.session.get(f"{api.url}/health", timeout=5)


def test_context_manager_serves_and_stops() -> None:
    with SandboxServer() as server, requests.Session() as session:
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert session.get(f"{server.url}/health", timeout=5).text == "ok"
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{server.url}/health", timeout=5)


# -- config and CLI --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"threads": 0}, "threads"),
        ({"solve_time": -0.1}, "solve_time"),
        ({"jitter": -1}, "jitter"),
        ({"unsolvable_rate": 1.01}, "unsolvable_rate"),
        ({"error_rate": -0.5}, "error_rate"),
        ({"token_ttl": {"turnstile": -1}}, "token_ttl"),
        ({"api_keys": ()}, "api_keys"),
        ({"max_image_bytes": 0}, "max_image_bytes"),
        ({"name": "primary one"}, "name"),
        ({"first_id": 0}, "first_id"),
        ({"balance_captchas": -1}, "balance_captchas"),
        ({"balance_captchas": 2.5}, "balance_captchas"),
        ({"outage_s": -1}, "outage_s"),
        ({"outage_in": -1}, "outage_in"),
        ({"outage_mode": "down"}, "outage_mode"),
    ],
)
def test_config_validation_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SandboxConfig(**changes)


def test_cli_sandbox_serves_the_configuration_given(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "captcha_tasks.cli", "sandbox", "--port", str(port)]
    argv += ["--threads", "4", "--no-bulk", "--thread-error", "ERROR_ZERO_BALANCE"]
    argv += ["--token-ttl", "42", "--error-rate", "0.25", "--solve-time", "0.5", "--seed", "7"]
    log = tmp_path / "sandbox.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: "CaptchaAI sandbox on" in log.read_text(), 30, what="the sandbox")
        config = requests.get(f"{url}/sandbox/config", timeout=5).json()
    finally:
        proc.terminate()
        proc.wait(10)
    assert config["threads"] == 4 and config["bulk"] is False
    assert config["thread_error"] == "ERROR_ZERO_BALANCE"
    assert set(config["token_ttl"].values()) == {42.0}
    assert set(config["token_ttl"]) == set(SandboxConfig().token_ttl)
    assert (config["error_rate"], config["solve_time"], config["seed"]) == (0.25, 0.5, 7)
    assert proc.returncode == 0  # SIGTERM stops it cleanly


def test_cli_sandbox_refuses_a_bad_value_naming_it() -> None:
    argv = [sys.executable, "-m", "captcha_tasks.cli", "sandbox", "--threads", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "threads must be >= 1" in done.stderr
    assert "Traceback" not in done.stderr


# -- several providers -----------------------------------------------------------------------


def test_two_providers_are_two_accounts(make_api: Callable[..., Api]) -> None:
    primary = make_api(name="primary", api_keys=("key-primary",), threads=1, solve_time=5.0)
    backup = make_api(name="backup", api_keys=("key-backup",), threads=2, solve_time=5.0)
    assert primary.url != backup.url
    assert primary.in_php(RECAPTCHA, key=backup.key) == "ERROR_WRONG_USER_KEY"
    assert backup.in_php(RECAPTCHA, key=primary.key) == "ERROR_WRONG_USER_KEY"

    first = primary.submit(RECAPTCHA)
    assert primary.in_php(RECAPTCHA) == primary.config.thread_error  # its one thread is busy
    ids = [backup.submit(TURNSTILE) for _ in range(backup.config.threads)]  # not the backup's
    # Two sandboxes number their captchas alike by default: the ids collide.
    assert first == ids[0] == str(FIRST_CAPTCHA_ID)
    primary.solve_all()
    backup.solve_all()
    assert primary.get(first)["request"].startswith("03A")  # each id names its own captcha
    assert backup.get(ids[0])["request"].startswith("0.")

    stats = primary.stats(), backup.stats()
    assert [s["provider"] for s in stats] == ["primary", "backup"]
    assert [s["submits"] for s in stats] == [1, backup.config.threads]
    assert [s["refused_submits"] for s in stats] == [
        {"ERROR_WRONG_USER_KEY": 1, primary.config.thread_error: 1},
        {"ERROR_WRONG_USER_KEY": 1},
    ]


def test_first_id_numbers_the_captchas_and_is_fixed_once_running(
    make_api: Callable[..., Api],
) -> None:
    api = make_api(first_id=123)
    assert [api.submit(IMAGE) for _ in range(2)] == ["123", "124"]
    with pytest.raises(ValueError, match="first_id"):
        api.server.update_config(first_id=500)
    resp = api.session.post(f"{api.url}/sandbox/config", json={"first_id": 9}, timeout=5)
    assert resp.status_code == 400 and "first_id" in resp.json()["error"]
    api.server.update_config(**api.config.public_dict())  # the same value is no change
    assert api.submit(IMAGE) == "125"


def _cli(*args: str) -> Any:
    """``captcha-tasks sandbox`` in this process, for arguments it refuses before serving."""
    from click.testing import CliRunner

    from captcha_tasks.testing.cli import sandbox

    return CliRunner().invoke(sandbox, list(args))


class CliSandbox:
    """``captcha-tasks sandbox ARGS`` in a process of its own, stopped with SIGTERM."""

    def __init__(self, tmp_path: Path, args: list[str], ports: list[int]) -> None:
        argv = [sys.executable, "-m", "captcha_tasks.cli", "sandbox", *args]
        self.log = tmp_path / "sandbox.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.urls = [f"http://127.0.0.1:{port}" for port in ports]
        ready = f"{len(ports)} provider(s) ready"
        wait_until(lambda: self._ready(ready), 30, what="the sandbox's providers")

    def _ready(self, marker: str) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        return marker in self.log.read_text()

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(10)


def _submit(url: str, key: str, fields: dict[str, Any] = TURNSTILE) -> str:
    return requests.post(f"{url}/in.php", data={"key": key, **fields}, timeout=5).text


@pytest.mark.parametrize("colliding", [False, True], ids=["own-ids", "colliding-ids"])
def test_cli_runs_providers_on_their_own_ports_with_their_own_keys(
    tmp_path: Path, colliding: bool
) -> None:
    from captcha_tasks.testing.cli import PROVIDER_ID_SPAN

    ports = [free_port(), free_port()]
    args = ["--provider", f"primary:{ports[0]}:key-a:2", "--provider", f"backup:{ports[1]}:key-b"]
    args += ["--threads", "7", "--solve-time", "0.2", *(["--colliding-ids"] if colliding else [])]
    sandbox = CliSandbox(tmp_path, args, ports)
    try:
        primary, backup = sandbox.urls
        configs = [requests.get(f"{url}/sandbox/config", timeout=5).json() for url in sandbox.urls]
        replies = [_submit(primary, "key-a"), _submit(backup, "key-b"), _submit(backup, "key-a")]
        stats = [requests.get(f"{url}/sandbox/stats", timeout=5).json() for url in sandbox.urls]
    finally:
        assert sandbox.stop() == 0
    assert [(c["name"], c["threads"]) for c in configs] == [("primary", 2), ("backup", 7)]
    assert all(c["solve_time"] == 0.2 for c in configs)  # the options apply to both
    offset = 0 if colliding else PROVIDER_ID_SPAN
    assert replies == [
        f"OK|{FIRST_CAPTCHA_ID}",
        f"OK|{FIRST_CAPTCHA_ID + offset}",
        "ERROR_WRONG_USER_KEY",
    ]
    assert [(s["provider"], s["submits"]) for s in stats] == [("primary", 1), ("backup", 1)]
    assert "key-a" not in sandbox.log.read_text()


def test_cli_providers_file_gives_each_its_own_fields_and_faults(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    providers = [
        {"name": "primary", "port": ports[0], "api_keys": ["k1", "k2"], "balance_captchas": 1},
        {"name": "backup", "port": ports[1], "outage_mode": "503", "outage_s": 600},
    ]
    path = tmp_path / "providers.json"
    path.write_text(json.dumps(providers))
    sandbox = CliSandbox(tmp_path, ["--providers-file", str(path), "--threads", "3"], ports)
    try:
        primary, backup = sandbox.urls
        replies = [_submit(primary, "k2"), _submit(primary, "k1")]
        down = requests.post(f"{backup}/in.php", data={"key": "sandbox-key"}, timeout=5)
        stats = [requests.get(f"{url}/sandbox/stats", timeout=5).json() for url in sandbox.urls]
    finally:
        sandbox.stop()
    assert replies == [f"OK|{FIRST_CAPTCHA_ID}", "ERROR_ZERO_BALANCE"]
    assert down.status_code == 503
    assert [s["config"]["threads"] for s in stats] == [3, 3]
    assert stats[0]["balance"]["captchas_left"] == 0
    assert stats[1]["outage"]["mode"] == "503" and stats[1]["outage"]["active"]
    assert stats[1]["refused_submits"] == {"HTTP_503": 1}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--provider", "a:1:secret-key:2:9"], "expected NAME:PORT:KEY[:THREADS], got 5"),
        (["--provider", "a:http:secret-key"], "port must be a number"),
        (["--provider", "a:7001:secret-key", "--provider", "b:7001:k"], "name and port"),
        (["--provider", "a:7001:secret-key", "--provider", "a:7002:k"], "name and port"),
        (["--provider", "a:7001:secret-key:0"], "provider a: threads must be >= 1"),
        (["--provider", "a:70000:secret-key"], "port must be 1-65535"),
        (["--provider", "a:7001:secret-key", "--port", "7002"], "drop --port"),
        (["--provider", "a:7001:secret-key", "--api-key", "k"], "drop --port/--api-key"),
        (["--balance-captchas", "-1"], "balance_captchas must be >= 0"),
    ],
)
def test_cli_refuses_bad_providers_in_one_line(args: list[str], message: str) -> None:
    result = _cli(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert "secret-key" not in result.output


def test_cli_providers_file_errors_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "providers.json"
    path.write_text(json.dumps([{"name": "a", "port": free_port(), "treads": 3}]))
    result = _cli("--providers-file", str(path))
    assert result.exit_code == 2 and "provider 1: unknown field(s) treads" in result.output
    path.write_text(json.dumps([{"port": free_port()}]))
    assert 'needs "name" and "port"' in _cli("--providers-file", str(path)).output


def test_cli_names_a_port_it_cannot_listen_on() -> None:
    with SandboxServer() as taken:
        result = _cli("--provider", f"a:{free_port()}:k", "--provider", f"b:{taken.port}:k")
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{taken.port} (b)" in result.output
    assert "Traceback" not in result.output


# -- faults: outages, hangs, an empty balance --------------------------------------------------


def _answers(url: str) -> bool:
    """Whether anything accepts a connection on the sandbox's port and answers."""
    try:
        return requests.get(f"{url}/health", timeout=2).text == "ok"
    except requests.ConnectionError:
        return False


def _set(api: Api, how: str, **changes: Any) -> None:
    if how == "http":
        resp = api.session.post(f"{api.url}/sandbox/config", json=changes, timeout=5)
        assert resp.status_code == 200, resp.text
    else:
        api.server.update_config(**changes)


@pytest.mark.parametrize("how", ["start", "http", "python"])
def test_refuse_outage_closes_the_port_and_reopens_it(
    make_api: Callable[..., Api], how: str
) -> None:
    window = {"outage_mode": "refuse", "outage_in": 2.0, "outage_s": 10.0}
    api = make_api(solve_time=1.0, jitter=0.0, **(window if how == "start" else {}))
    if how != "start":
        _set(api, how, **window)
    captcha_id = api.submit(RECAPTCHA)  # before the window
    api.clock.advance(window["outage_in"])
    wait_until(lambda: not _answers(api.url), 5, what="the port to close")
    with pytest.raises(requests.ConnectionError):  # a kept-alive connection is dropped too
        api.get(captcha_id)
    assert not api.server.listening

    api.clock.advance(window["outage_s"] - 0.5)
    api.server.update_config(jitter=0.0)  # wakes the outage watcher: still closed
    assert not _answers(api.url)
    api.clock.advance(0.5)
    wait_until(lambda: _answers(api.url), 5, what="the port to reopen")
    assert api.get(captcha_id)["status"] == 1  # an outage, not a new account
    stats = api.stats()
    assert (stats["listener_closes"], stats["outage"]) == (1, None)


def test_refuse_outage_set_from_python_has_closed_the_port_on_return(
    make_api: Callable[..., Api],
) -> None:
    api = make_api()
    api.server.update_config(outage_s=5.0)
    assert not api.server.listening
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{api.url}/health", timeout=2)
    api.server.update_config(outage_s=0.0)  # ended early, through the Python API
    assert api.server.listening and _answers(api.url)


@pytest.mark.parametrize("how", ["start", "http"])
def test_503_outage_answers_protocol_requests_but_not_admin(
    make_api: Callable[..., Api], how: str
) -> None:
    window = {"outage_mode": "503", "outage_s": 5.0}
    api = make_api(**(window if how == "start" else {}))
    if how != "start":
        _set(api, how, **window)
    replies = [
        api.session.post(f"{api.url}/{endpoint}", data={"key": KEY, **RECAPTCHA}, timeout=5)
        for endpoint in ("in.php", "res.php", "in.php")
    ]
    assert [r.status_code for r in replies] == [503, 503, 503]
    assert replies[0].text.lstrip().startswith("<html>")  # as a proxy in front would say
    stats = api.stats()  # admin endpoints answer throughout
    assert stats["outage"] == {"mode": "503", "active": True, "starts_in": 0.0, "ends_in": 5.0}
    assert (stats["outage_503"], stats["refused_submits"]) == (3, {"HTTP_503": 2})
    assert stats["submits"] == 0

    api.clock.advance(window["outage_s"])
    assert api.in_php(RECAPTCHA).startswith("OK|")


@pytest.mark.parametrize("how", ["start", "http"])
def test_hang_outage_never_answers_and_processes_nothing(
    make_api: Callable[..., Api], how: str
) -> None:
    window = {"outage_mode": "hang", "outage_s": 30.0}
    api = make_api(**(window if how == "start" else {}))
    if how != "start":
        _set(api, how, **window)
    url, data = f"{api.url}/in.php", {"key": KEY, **RECAPTCHA}
    with pytest.raises(requests.ReadTimeout):  # the client's read timeout passes
        requests.post(url, data=data, timeout=(5, 0.3))
    late: list[requests.Response] = []

    def wait_for_an_answer() -> None:
        late.append(requests.post(url, data=data, timeout=30))

    waiting = threading.Thread(target=wait_for_an_answer)
    waiting.start()
    wait_until(lambda: api.stats()["outage_hangs"] == 2, 5, what="the second request to hang")
    assert waiting.is_alive()  # admin endpoints answer meanwhile

    api.clock.advance(window["outage_s"])  # the window ends: hung requests are let go
    waiting.join(5)
    assert [r.status_code for r in late] == [504]
    assert api.in_php(RECAPTCHA).startswith("OK|")
    stats = api.stats()
    assert stats["submits"] == 1  # a hung submit never became a captcha
    assert stats["refused_submits"] == {"hang": 2}


def test_balance_runs_out_and_is_refilled(make_api: Callable[..., Api]) -> None:
    api = make_api(balance_captchas=2, balance=7.5)
    ids = [api.submit(RECAPTCHA)]
    assert float(api.res_php(action="getbalance")) == api.config.balance
    ids.append(api.in_php(TURNSTILE).split("|")[1])
    assert api.in_php(RECAPTCHA) == "ERROR_ZERO_BALANCE"
    assert api.in_php(TURNSTILE, json=True) == {"status": 0, "request": "ERROR_ZERO_BALANCE"}
    assert float(api.res_php(action="getbalance")) == 0.0
    assert api.res_php(json=True, action="getbalance")["request"] in ("0", "0.0")
    api.solve_all()
    assert all(api.get(i)["status"] == 1 for i in ids)  # captchas paid for are still answered
    stats = api.stats()
    assert stats["refused_submits"] == {"ERROR_ZERO_BALANCE": 2}
    assert stats["balance"] == {"value": 0.0, "captchas_left": 0}

    _set(api, "http", balance_captchas=1)  # refilled through the admin endpoint
    assert float(api.res_php(action="getbalance")) == api.config.balance
    api.submit(IMAGE)
    assert api.in_php(IMAGE) == "ERROR_ZERO_BALANCE"
    _set(api, "http", balance_captchas=None)  # never runs out
    api.submit(IMAGE)
    assert api.stats()["balance"]["captchas_left"] is None


def test_balance_emptied_at_run_time(api: Api) -> None:
    api.submit(RECAPTCHA)
    _set(api, "http", balance_captchas=0)
    assert api.in_php(RECAPTCHA) == "ERROR_ZERO_BALANCE"
    # The key is checked first: a wrong key is still told so.
    assert api.in_php(RECAPTCHA, key="wrong") == "ERROR_WRONG_USER_KEY"


def test_refused_submits_are_counted_by_reason_and_reset(make_api: Callable[..., Api]) -> None:
    api = make_api(threads=1, solve_time=5.0)
    api.submit(RECAPTCHA)
    assert api.in_php(RECAPTCHA) == api.config.thread_error
    assert api.in_php(RECAPTCHA, key="wrong") == "ERROR_WRONG_USER_KEY"
    assert api.in_php({"method": "nope"}) == "ERROR_BAD_PARAMETERS"
    api.res_php(action="get", id="1", key="wrong")  # not a submit
    api.server.update_config(status_429_rate=1.0)
    resp = api.session.post(f"{api.url}/in.php", data={"key": KEY, **RECAPTCHA}, timeout=5)
    assert resp.status_code == 429
    assert api.stats()["refused_submits"] == {
        api.config.thread_error: 1,
        "ERROR_WRONG_USER_KEY": 1,
        "ERROR_BAD_PARAMETERS": 1,
        "HTTP_429": 1,
    }
    api.server.reset()
    assert api.stats()["refused_submits"] == {}


# -- a sandbox process, killed and restarted -----------------------------------------------------


def _lingering_sockets(port: int) -> int:
    """Sockets on ``port`` other than a listener (TIME_WAIT, FIN_WAIT...), from /proc."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if int(local.split(":")[1], 16) == port and state != "0A":  # 0A: LISTEN
            count += 1
    return count


def test_a_killed_sandbox_process_restarts_on_the_same_port(tmp_path: Path) -> None:
    process = SandboxProcess("primary", "key-p", options=["--solve-time", "0"], log_dir=tmp_path)
    # what an earlier run in the same log directory was paid is not this provider's
    process.journal.write_text('{"id": "1", "method": "turnstile"}\n')
    with process.start():
        session = requests.Session()
        old = session.post(f"{process.url}/in.php", data={"key": "key-p", **TURNSTILE}, timeout=5)
        assert old.text == f"OK|{FIRST_CAPTCHA_ID}"
        process.kill()
        assert process.proc is not None and process.proc.returncode == -signal.SIGKILL
        assert not _answers(process.url)
        # The dead server's sockets linger on the port; SO_REUSEADDR lets a fresh one bind.
        assert _lingering_sockets(process.port) > 0

        process.restart()
        new = session.post(f"{process.url}/in.php", data={"key": "key-p", **TURNSTILE}, timeout=5)
        stale = session.get(
            f"{process.url}/res.php",
            params={"key": "key-p", "action": "get", "id": old.text[3:]},
            timeout=5,
        )
        stats = process.stats()
        session.close()
    assert not process.alive()
    assert new.text == f"OK|{FIRST_CAPTCHA_ID + RESTART_ID_STEP}"  # never an id of the dead one
    assert stale.text == "ERROR_WRONG_CAPTCHA_ID"  # a fresh process knows nothing of it
    assert (stats["provider"], stats["submits"]) == ("primary", 1)
    # What the killed process accepted was paid for: its journal line survived the kill.
    paid = process.paid()
    assert [entry["id"] for entry in paid] == [old.text[3:], new.text[3:]]
    assert {(e["method"], e["sitekey"], e["pageurl"]) for e in paid} == {
        (TURNSTILE["method"], TURNSTILE["sitekey"], TURNSTILE["pageurl"])
    }
