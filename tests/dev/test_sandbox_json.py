"""The JSON client against the sandbox's JSON dialects, over real HTTP, on a fake clock."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from captcha_tasks import errors
from captcha_tasks.core.answers import NOT_READY, Answer
from captcha_tasks.core.dialects import CAPMONSTER, CAPSOLVER, DIALECTS, Dialect
from captcha_tasks.methods import build_request
from captcha_tasks.providers.jsonapi import JSONClient
from captcha_tasks.testing.jsonface import sandbox_id
from captcha_tasks.testing.processes import free_port, wait_until
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from tests.image_files import png

pytestmark = pytest.mark.redis

KEY = "sandbox-key"
SITEKEY = "6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=sorted(DIALECTS))
def dialect(request: pytest.FixtureRequest) -> Dialect:
    return DIALECTS[request.param]


@pytest.fixture
def sandbox(dialect: Dialect) -> Iterator[tuple[SandboxServer, Clock]]:
    clock = Clock()
    config = SandboxConfig(kind=dialect.kind, solve_time=5.0, jitter=0.0, threads=2)
    with SandboxServer(config, clock=clock) as server:
        yield server, clock


def _client(server: SandboxServer, dialect: Dialect, clock: Clock, key: str = KEY) -> JSONClient:
    return JSONClient(server.url, key, dialect, clock=clock)


def test_recaptcha_turnstile_and_image_are_solved(
    sandbox: tuple[SandboxServer, Clock], dialect: Dialect
) -> None:
    server, clock = sandbox
    client = _client(server, dialect, clock)
    recaptcha = build_request("userrecaptcha", sitekey=SITEKEY, pageurl="https://example.com/")
    turnstile = build_request("turnstile", sitekey="0x4AAAAAAAB", pageurl="https://example.com/")
    image = build_request("base64", body=base64.b64encode(png()).decode())
    ids = [client.submit(r) for r in (recaptcha, turnstile)]
    if dialect.id_type == "int":
        assert all(i.isdigit() for i in ids)
    else:
        assert all(len(i) == 36 and "-" in i for i in ids)
    assert client.get_many(ids) == {i: NOT_READY for i in ids}
    clock.now += 5.1
    answers = client.get_many(ids)
    assert answers is not None
    assert all(isinstance(a, Answer) and isinstance(a.value, str) for a in answers.values())
    image_id = client.submit(image)
    clock.now += 5.1
    assert isinstance(client.get(image_id), Answer)
    assert client.balance() > 0


def test_capsolver_answers_an_image_inside_create_task() -> None:
    clock = Clock()
    with SandboxServer(
        SandboxConfig(kind="capsolver", solve_time=0.0, jitter=0.0), clock=clock
    ) as s:
        client = JSONClient(s.url, KEY, CAPSOLVER, clock=clock)
        task_id = client.submit(build_request("base64", body=base64.b64encode(png()).decode()))
        requests_before = s.stats()["res_php_requests"]
        assert isinstance(client.get(task_id), Answer)
        assert s.stats()["res_php_requests"] == requests_before  # no getTaskResult needed


def test_capmonster_polls_a_task_at_most_every_two_seconds() -> None:
    clock = Clock()
    with SandboxServer(
        SandboxConfig(kind="capmonster", solve_time=5.0, jitter=0.0), clock=clock
    ) as s:
        client = JSONClient(s.url, KEY, CAPMONSTER, clock=clock)
        task_id = client.submit(
            build_request("userrecaptcha", sitekey=SITEKEY, pageurl="https://e.com/")
        )
        polls = s.stats()["res_php_get_requests"]
        assert client.get(task_id) is NOT_READY
        assert s.stats()["res_php_get_requests"] == polls + 1
        clock.now += 1.9
        assert client.get(task_id) is NOT_READY
        assert s.stats()["res_php_get_requests"] == polls + 1  # inside the gap: not asked
        clock.now += 3.2
        assert isinstance(client.get(task_id), Answer)
        assert s.stats()["res_php_get_requests"] == polls + 2


PROXY = "user:pw@10.0.0.1:3128"


def test_a_proxy_task_with_cookies_and_user_agent_end_to_end(
    sandbox: tuple[SandboxServer, Clock], dialect: Dialect
) -> None:
    """reCAPTCHA Enterprise through a proxy, in the dialect's proxy task type: the sandbox
    reads the variant, the proxy and the user agent back from the task (it answers an
    enterprise token with the caller's agent, and a proxy it cannot use with a proxy
    error)."""
    server, clock = sandbox
    client = _client(server, dialect, clock)
    extras = {"cookies": "sid:abc;theme:dark", "userAgent": "UA/proxy-test"}
    good = build_request(
        "userrecaptcha", SITEKEY, "https://e.com/", enterprise=1, proxy=PROXY, **extras
    )
    bad = build_request("userrecaptcha", SITEKEY, "https://e.com/", proxy="u:p@bad-proxy.test:8080")
    good_id, bad_id = client.submit(good), client.submit(bad)
    clock.now += 5.1
    answers = client.get_many([good_id, bad_id])
    assert answers is not None
    answer = answers[good_id]
    assert isinstance(answer, Answer) and isinstance(answer.value, str)
    assert answer.user_agent == "UA/proxy-test"
    assert isinstance(answers[bad_id], errors.ProxyError)


def test_geetest_and_the_cloudflare_challenge_come_back_in_one_shape(
    sandbox: tuple[SandboxServer, Clock], dialect: Dialect
) -> None:
    server, clock = sandbox
    client = _client(server, dialect, clock)
    geetest = client.submit(build_request("geetest", "gt-1", "https://e.com/", challenge="c1"))
    challenge = build_request(
        "cloudflare_challenge", None, "https://e.com/", proxy=PROXY, userAgent="UA/cf"
    )
    if not dialect.supports("cloudflare_challenge", proxied=True):
        with pytest.raises(errors.ValidationError, match="no task type"):
            client.submit(challenge)
        cf_id = None
    else:
        cf_id = client.submit(challenge)
    clock.now += 5.1
    answer = client.get(geetest)
    assert isinstance(answer, Answer) and isinstance(answer.value, dict)
    assert set(answer.value) == {"geetest_challenge", "geetest_validate", "geetest_seccode"}
    if cf_id is not None:  # CapSolver: cf_clearance with the user agent it goes with
        cleared = client.get(cf_id)
        assert isinstance(cleared, Answer) and isinstance(cleared.value, str)
        assert cleared.user_agent == "UA/cf"


def test_a_task_type_the_dialect_lacks_is_refused_with_its_code(
    sandbox: tuple[SandboxServer, Clock], dialect: Dialect
) -> None:
    server, _ = sandbox
    for task_type in ("AntiCloudflareTask", "FunCaptchaTaskProxyless"):
        if dialect.method_of(task_type) is not None:
            continue
        reply = requests.post(
            f"{server.url}/createTask",
            json={"clientKey": KEY, "task": {"type": task_type, "websiteURL": "https://e.com/"}},
            timeout=5,
        ).json()
        assert (reply["errorId"], reply["errorCode"]) == (1, dialect.unsupported_code)
        assert dialect.unsupported_code in dialect.errors


def test_the_poll_budgets_hold_per_task(
    sandbox: tuple[SandboxServer, Clock], dialect: Dialect
) -> None:
    """Asked every 0.5 s for 300 s, a task is polled no more often than its dialect's gap
    and no more than its cap (then it is given up as unsolvable): counted by the sandbox."""
    server, clock = sandbox
    server.update_config(solve_time=10_000.0)
    client = _client(server, dialect, clock)
    task_id = client.submit(build_request("turnstile", "0x4A", "https://e.com/"))
    values = []
    for _ in range(600):
        clock.now += 0.5
        found = client.get_many([task_id])
        assert found is not None
        values.append(found[task_id])
    times = server.poll_times(str(sandbox_id(dialect, task_id)))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= dialect.poll_gap_s
    expected = int(300 / max(dialect.poll_gap_s, 0.5))
    if dialect.polls_per_task is None:
        assert len(times) == expected and all(v is NOT_READY for v in values)
    else:
        assert len(times) == min(expected, dialect.polls_per_task) == dialect.polls_per_task
        assert isinstance(values[-1], errors.UnsolvableError)


def test_errors_come_back_typed(sandbox: tuple[SandboxServer, Clock], dialect: Dialect) -> None:
    server, clock = sandbox
    request = build_request("userrecaptcha", sitekey=SITEKEY, pageurl="https://example.com/")
    with pytest.raises(errors.AuthError):
        _client(server, dialect, clock, key="wrong").submit(request)
    client = _client(server, dialect, clock)
    client.submit(request)
    client.submit(request)
    with pytest.raises(errors.NoSlotError):
        client.submit(request)
    server.update_config(balance_captchas=0)
    clock.now += 10
    with pytest.raises(errors.ZeroBalance):
        client.submit(request)


def test_cli_kind_and_a_providers_files_kinds_speak_their_dialects(tmp_path: Path) -> None:
    """``captcha-tasks sandbox --kind capmonster`` with a providers file whose entries
    name kinds of their own: each port speaks its own dialect (ids, task types)."""
    ports = [free_port(), free_port(), free_port()]
    entries = [
        {"name": "anti", "port": ports[0], "kind": "anticaptcha"},
        {"name": "solver", "port": ports[1], "kind": "capsolver"},
        {"name": "monster", "port": ports[2]},  # the --kind default
    ]
    path = tmp_path / "providers.json"
    path.write_text(json.dumps(entries))
    argv = [sys.executable, "-m", "captcha_tasks.cli", "sandbox", "--providers-file", str(path)]
    argv += ["--kind", "capmonster", "--solve-time", "0", "--jitter", "0"]
    log = tmp_path / "sandbox.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "3 provider(s) ready" in log.read_text(), 30, what="the sandbox")
        kinds = [
            requests.get(f"http://127.0.0.1:{port}/sandbox/config", timeout=5).json()["kind"]
            for port in ports
        ]
        found = {}
        for port, kind in zip(ports, kinds, strict=True):
            client = JSONClient(f"http://127.0.0.1:{port}", KEY, DIALECTS[kind])
            request = build_request("turnstile", sitekey="0x4A", pageurl="https://e.com/")
            task_id = client.submit(request)
            found[kind] = (task_id, client.get(task_id))
        # a task type of another dialect is refused as the provider refuses it
        wrong = requests.post(
            f"http://127.0.0.1:{ports[1]}/createTask",
            json={"clientKey": KEY, "task": {"type": "TurnstileTaskProxyless"}},
            timeout=5,
        ).json()
    finally:
        proc.terminate()
        proc.wait(10)
    assert kinds == ["anticaptcha", "capsolver", "capmonster"]
    assert found["anticaptcha"][0].isdigit() and found["capmonster"][0].isdigit()
    assert len(found["capsolver"][0]) == 36  # a uuid
    assert all(isinstance(answer, Answer) for _, answer in found.values())
    assert wrong["errorCode"] == "ERROR_TASK_NOT_SUPPORTED"


def test_cli_refuses_an_unknown_kind() -> None:
    from click.testing import CliRunner

    from captcha_tasks.testing.cli import sandbox

    result = CliRunner().invoke(sandbox, ["--kind", "anticaptha"])
    assert result.exit_code == 2
    assert "'anticaptha' is not one of" in result.output
