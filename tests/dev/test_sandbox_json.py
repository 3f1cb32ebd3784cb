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
