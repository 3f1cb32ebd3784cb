"""Providers of the JSON family end to end: a CaptchaAI primary, an ``anticaptcha``
fallback and a ``capsolver`` overflow, each a sandbox process of its own speaking its
protocol over HTTP, with real workers: failover and overflow across both protocol
families, one ``getTaskResult`` per task, CapSolver's images answered inside
``createTask``, reports reaching the JSON provider's report endpoints, and what answers
cost as a metric."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from image_files import png_b64
from prometheus_client.parser import text_string_to_metric_families

from captcha_tasks import report, solve
from captcha_tasks.core.answers import Answer
from captcha_tasks.core.dialects import DIALECTS
from captcha_tasks.providers.jsonapi import JSONClient
from captcha_tasks.testing.jsonface import COSTS, sandbox_id
from captcha_tasks.testing.processes import SandboxProcess, free_port, wait_until
from captcha_tasks.testing.sandbox import SandboxConfig, SandboxServer
from captcha_tasks.worker.app import app

pytestmark = [pytest.mark.e2e]

PAGE = "https://example.com/json-providers"
MAIN_KEY = "main-key-" + os.urandom(4).hex()
ANTI_KEY = "anti-key-" + os.urandom(4).hex()
SOLVER_KEY = "solver-key-" + os.urandom(4).hex()
MAIN_PORT, ANTI_PORT, SOLVER_PORT = free_port(), free_port(), free_port()
#: Each sandbox between tests.  CapSolver's sandbox answers at once, so its images come
#: back inside createTask.
SANDBOX = {
    "main": {"threads": 10, "solve_time": 0.5, "jitter": 0.1, "balance_captchas": None},
    "anti": {"threads": 20, "solve_time": 0.5, "jitter": 0.1, "balance_captchas": None},
    "solver": {"threads": 20, "solve_time": 0.0, "jitter": 0.0, "balance_captchas": None},
}
MODULE_ENV = {
    "CAPTCHAAI_BASE_URL": f"http://127.0.0.1:{MAIN_PORT}",
    "CAPTCHAAI_API_KEY": MAIN_KEY,
    "CAPTCHAAI_PROVIDER_NAME": "main",
    "CAPTCHAAI_THREADS": "10",
    "JSON_TEST_ANTI_KEY": ANTI_KEY,
    "JSON_TEST_SOLVER_KEY": SOLVER_KEY,
    "CAPTCHAAI_PROVIDERS": json.dumps(
        [
            {
                "name": "anti",
                "kind": "anticaptcha",
                "base_url": f"http://127.0.0.1:{ANTI_PORT}",
                "key_env": "JSON_TEST_ANTI_KEY",
                "threads": 20,
                "role": "fallback",
            },
            {
                "name": "solver",
                "kind": "capsolver",
                "base_url": f"http://127.0.0.1:{SOLVER_PORT}",
                "key_env": "JSON_TEST_SOLVER_KEY",
                "threads": 20,
                "role": "overflow",
            },
        ]
    ),
    "CAPTCHAAI_OVERFLOW_AFTER": "2",
    # a provider that does not answer is given up on quickly
    "CAPTCHAAI_CONNECT_TIMEOUT": "1",
    "CAPTCHAAI_READ_TIMEOUT": "1.5",
    "CAPTCHAAI_POLL_INTERVAL": "1",
    "CAPTCHAAI_SOLVE_TIMEOUT": "90",
    "CAPTCHAAI_THREADS_CHECK_EVERY": "0",
}
GET_TIMEOUT = 60
KINDS = {"main": "captchaai", "anti": "anticaptcha", "solver": "capsolver"}
PORTS = {"main": MAIN_PORT, "anti": ANTI_PORT, "solver": SOLVER_PORT}
KEYS = {"main": MAIN_KEY, "anti": ANTI_KEY, "solver": SOLVER_KEY}


@pytest.fixture(scope="module")
def sandboxes(output_dir: Path) -> Iterator[dict[str, SandboxProcess]]:
    started: dict[str, SandboxProcess] = {}
    try:
        for name, kind in KINDS.items():
            options = ["--kind", kind, "--threads", str(SANDBOX[name]["threads"])]
            process = SandboxProcess(
                name, KEYS[name], port=PORTS[name], options=options, log_dir=output_dir
            )
            started[name] = process.start()
        yield started
    finally:
        for process in started.values():
            process.stop()


@pytest.fixture(autouse=True)
def whole_again(sandboxes: dict[str, SandboxProcess]) -> Iterator[None]:
    """Every provider whole and in rotation around each test."""

    def restore() -> None:
        for name, process in sandboxes.items():
            if not process.alive():
                process.restart()
            process.configure(**SANDBOX[name])
        app.runtime().state.circuits.reset()

    restore()
    yield
    restore()


def mixed(count: int) -> list[Any]:
    """``count`` solves: reCAPTCHA v2, Turnstile and base64 images in turn."""
    results = []
    for n in range(count):
        if n % 3 == 0:
            results.append(solve.delay(method="userrecaptcha", sitekey="6Lc-json", pageurl=PAGE))
        elif n % 3 == 1:
            results.append(solve.delay(method="turnstile", sitekey="0x4A-json", pageurl=PAGE))
        else:
            results.append(solve.delay(method="base64", body=png_b64()))
    return results


def by_provider(outcomes: list[dict[str, Any]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for outcome in outcomes:
        found[outcome["provider"]] = found.get(outcome["provider"], 0) + 1
    return found


def held_by_provider(process: SandboxProcess, name: str, outcome: dict[str, Any]) -> bool:
    """Whether the provider's own answer for the outcome's task is its token: asked again
    through its JSON API (a finished task keeps its answer), and for a token, the provider
    verifies it once."""
    client = JSONClient(process.url, KEYS[name], DIALECTS[KINDS[name]])
    try:
        answer = client.get(outcome["captcha_id"])
    finally:
        client.close()
    if not isinstance(answer, Answer) or answer.value != outcome["token"]:
        return False
    if outcome["method"] == "base64":
        return True
    resp = requests.post(
        f"{process.url}/siteverify", data={"response": outcome["token"]}, timeout=5
    )
    return bool(resp.json()["success"])


def metric_samples(metrics_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(requests.get(metrics_url, timeout=10).text)
        for s in family.samples
    }


def test_a_json_fallback_takes_over_polled_one_task_per_request_and_takes_reports(
    sandboxes: dict[str, SandboxProcess], start_worker: Any, metrics_url: str
) -> None:
    anti = sandboxes["anti"]
    start_worker()
    sandboxes["main"].configure(balance_captchas=0)  # out of rotation at its first refusal
    outcomes = [r.get(timeout=GET_TIMEOUT) for r in mixed(12)]
    assert by_provider(outcomes).get("anti", 0) >= 11  # the first may meet the refusal
    ours = [o for o in outcomes if o["provider"] == "anti"]
    assert all(o["captcha_id"].isdigit() for o in ours)  # Anti-Captcha's ids are integers
    assert all(held_by_provider(anti, "anti", o) for o in ours)
    stats = anti.stats()
    # no bulk poll in the family: every getTaskResult asks for one task
    assert stats["res_php_ids"] == stats["res_php_get_requests"] > 0
    # a report reaches Anti-Captcha's endpoint for its kind of captcha (token and image)
    image = next(o for o in ours if o["method"] == "base64")
    token = next(o for o in ours if o["method"] != "base64")
    report(token, good=False).get(timeout=GET_TIMEOUT)
    report(image, good=False).get(timeout=GET_TIMEOUT)
    report(token, good=True).get(timeout=GET_TIMEOUT)
    after = anti.stats()
    assert (after["reports_bad"], after["reports_good"]) == (
        stats["reports_bad"] + 2,
        stats["reports_good"] + 1,
    )
    # what Anti-Captcha said the answers cost, per provider and tenant
    samples = metric_samples(metrics_url)
    cost = samples[
        ("captcha_tasks_provider_cost_total", (("provider", "anti"), ("tenant", "default")))
    ]
    assert cost == pytest.approx(len(ours) * float(COSTS["anticaptcha"]))
    assert (
        "captcha_tasks_provider_cost_total",
        (("provider", "main"), ("tenant", "default")),
    ) not in samples


def test_capsolver_answers_images_inside_the_submit(
    sandboxes: dict[str, SandboxProcess], start_worker: Any
) -> None:
    solver = sandboxes["solver"]
    at = app.runtime().state.provider("solver")
    before = {m: at.stats.solved(m) for m in ("base64", "turnstile")}
    start_worker()
    for name in ("main", "anti"):
        sandboxes[name].configure(balance_captchas=0)
    outcomes = [r.get(timeout=GET_TIMEOUT) for r in mixed(9)]
    ours = [o for o in outcomes if o["provider"] == "solver"]
    assert len(ours) >= 7  # the first ones may meet the others' refusals
    assert all(len(o["captcha_id"]) == 36 for o in ours)  # CapSolver's ids are uuids
    assert all(held_by_provider(solver, "solver", o) for o in ours)

    def more(method: str, source: str) -> int:
        return at.stats.solved(method).get(source, 0) - before[method].get(source, 0)

    assert more("base64", "submit") == sum(o["method"] == "base64" for o in ours) > 0
    assert more("base64", "poll") == 0 and more("base64", "bulk_poll") == 0
    assert more("turnstile", "poll") > 0  # tokens are polled as usual


def test_an_empty_json_provider_leaves_rotation_and_its_probe_brings_it_back(
    sandboxes: dict[str, SandboxProcess], start_worker: Any
) -> None:
    anti = sandboxes["anti"]
    start_worker()
    sandboxes["main"].configure(balance_captchas=0)
    anti.configure(balance_captchas=3)
    outcomes = [r.get(timeout=GET_TIMEOUT) for r in mixed(12)]
    spread = by_provider(outcomes)
    assert spread.get("anti", 0) <= 3 and spread.get("solver", 0) >= 9, spread
    circuits = app.runtime().state.circuits
    circuit = circuits.read()["anti"]
    assert (circuit.open, circuit.code) == (True, "ERROR_ZERO_BALANCE")
    # money on it again: the probe (the family's getBalance) puts it back in rotation
    anti.configure(balance_captchas=None)
    wait_until(lambda: circuits.read()["anti"].up, 30, what="anti's probe")
    assert by_provider([r.get(timeout=GET_TIMEOUT) for r in mixed(3)]) == {"anti": 3}


def test_a_primary_killed_mid_batch_fails_over_to_the_json_family(
    sandboxes: dict[str, SandboxProcess], start_worker: Any
) -> None:
    main, anti, solver = sandboxes["main"], sandboxes["anti"], sandboxes["solver"]
    paid_before = {name: len(p.paid()) for name, p in sandboxes.items()}
    start_worker()
    results = mixed(300)
    wait_until(lambda: sum(r.ready() for r in results) >= 100, 60, what="100 solves")
    main.kill()  # SIGKILL mid-batch; it stays dead
    outcomes = [r.get(timeout=GET_TIMEOUT) for r in results]
    assert all(o["status"] == "solved" for o in outcomes)
    spread = by_provider(outcomes)
    assert spread.get("anti", 0) > 0 and spread.get("solver", 0) > 0, spread
    tokens = [o["token"] for o in outcomes if o["method"] != "base64"]
    assert len(set(tokens)) == len(tokens)  # no token delivered twice
    methods = {}
    for name, process in (("anti", anti), ("solver", solver)):
        ours = [o for o in outcomes if o["provider"] == name]
        methods[name] = {o["method"] for o in ours}
        assert all(held_by_provider(process, name, o) for o in ours), name
    # Which of the two takes a captcha depends on the threads free at the moment (anti's
    # 20, the overflow after 2 s of waiting), not on its method: a run saw anti take no
    # image.  Together they solve every method (anti's images: the probe test above).
    assert set().union(*methods.values()) == {"userrecaptcha", "turnstile", "base64"}, methods
    paid = sum(len(p.paid()) - paid_before[name] for name, p in sandboxes.items())
    assert paid <= len(results) + 15, paid


def test_the_primary_may_speak_the_json_family(
    sandboxes: dict[str, SandboxProcess], start_worker: Any
) -> None:
    """CAPTCHAAI_PROVIDER_KIND=anticaptcha: the primary (still named ``main``) is the
    Anti-Captcha sandbox, and the only provider."""
    anti = sandboxes["anti"]
    submits = anti.stats()["submits"]
    start_worker(
        {
            "CAPTCHAAI_BASE_URL": anti.url,
            "CAPTCHAAI_API_KEY": ANTI_KEY,
            "CAPTCHAAI_PROVIDER_KIND": "anticaptcha",
            "CAPTCHAAI_PROVIDERS": "[]",
        }
    )
    outcomes = [r.get(timeout=GET_TIMEOUT) for r in mixed(6)]
    assert by_provider(outcomes) == {"main": 6}
    assert all(held_by_provider(anti, "anti", o) for o in outcomes)
    assert anti.stats()["submits"] == submits + 6


def test_a_capmonster_task_is_polled_at_its_gap_whichever_worker_polls_it(
    start_worker: Any,
) -> None:
    """Two workers, asked to poll every 0.5 s, share CapMonster's per-task budget through
    the board: its sandbox sees no task polled twice within 2 s (each process counted only
    its own polls before, and rounds go to either worker)."""
    dialect = DIALECTS["capmonster"]
    config = SandboxConfig(kind="capmonster", threads=20, solve_time=5.0, jitter=0.0)
    with SandboxServer(config) as server:
        env = {
            "CAPTCHAAI_BASE_URL": server.url,
            "CAPTCHAAI_API_KEY": config.api_keys[0],
            "CAPTCHAAI_PROVIDER_KIND": "capmonster",
            "CAPTCHAAI_PROVIDERS": "[]",
            "CAPTCHAAI_POLL_INTERVAL": "0.5",
            "CAPTCHAAI_INITIAL_WAIT": "0.5",
        }
        start_worker(env, concurrency=4)
        start_worker(env, concurrency=4)
        pending = [
            solve.delay(method="turnstile", sitekey=f"0x4A-gap{n}", pageurl=PAGE) for n in range(12)
        ]
        outcomes = [r.get(timeout=GET_TIMEOUT) for r in pending]
        times = [server.poll_times(str(sandbox_id(dialect, o["captcha_id"]))) for o in outcomes]
    assert all(o["status"] == "solved" for o in outcomes)
    gaps = [b - a for polls in times for a, b in zip(polls, polls[1:], strict=False)]
    assert len(gaps) >= 12  # every task was polled more than once
    assert min(gaps) >= dialect.poll_gap_s
