"""The routing policy (captcha_tasks.core.routing) on its own: where a submit goes, when
it is routed again, where the work of a provider out of rotation goes.  No Redis, no
worker, the time passed in."""

from __future__ import annotations

import dataclasses

import pytest
from image_files import png_b64

from captcha_tasks import errors
from captcha_tasks.core import routing
from captcha_tasks.core.decisions import Fail, Policy, Resubmit, SubmitAt
from captcha_tasks.core.health import Circuit
from captcha_tasks.core.job import Job
from captcha_tasks.core.providers import ProviderSpec
from captcha_tasks.core.routing import Destination, Reread, Try
from captcha_tasks.methods import build_request

pytestmark = pytest.mark.unit

T0 = 1_000_000.0
PAGE = "https://example.com/routing"
POLICY = Policy(
    solve_timeout=300.0,
    poll_interval=5.0,
    bulk_interval=0.5,
    transport_retries=2,
    max_resubmits=1,
    overflow_after=3.0,
)


def job(method: str = "turnstile", **params: object) -> Job:
    sitekey = None if method == "base64" else "k"
    pageurl = None if method == "base64" else PAGE
    request = build_request(method, sitekey, pageurl, **params)
    return Job.new("solve-1", request, T0, POLICY.solve_timeout)


def submitted() -> Job:
    return job().submitted("7001", T0 + 1)


PRIMARY = ProviderSpec("main", "http://main", "k1", 10)
BACKUP = ProviderSpec("backup", "http://backup", "k2", 5, role="fallback", kind="2captcha")
SPILL = ProviderSpec("spill", "http://spill", "k3", 5, role="overflow")
IMAGES = ProviderSpec("images", "http://images", "k4", 5, "fallback", methods=frozenset({"base64"}))
PROVIDERS = (PRIMARY, IMAGES, BACKUP, SPILL)


def circuits(**down: tuple[str, str]) -> dict[str, Circuit]:
    """Every provider's circuit; ``down``: name -> (why, code) of the open ones."""
    found = {p.name: Circuit(p.name) for p in PROVIDERS}
    for name, (why, code) in down.items():
        found[name] = Circuit(name, open=True, why=why, code=code, probe_at=T0 + 4)
    return found


def test_a_captcha_goes_to_the_primary_while_it_is_in_rotation() -> None:
    assert routing.route(job(), PROVIDERS, circuits(), T0) == Destination("main", ("spill",))


def test_then_to_the_first_fallback_that_takes_its_method() -> None:
    down = circuits(main=("soft", "ERROR_TRANSPORT"))
    assert routing.route(job(), PROVIDERS, down, T0) == Destination("backup", ("spill",))
    image = job("base64", body=png_b64())
    assert routing.route(image, PROVIDERS, down, T0).home == "images"  # type: ignore[union-attr]


def test_a_provider_whose_dialect_lacks_a_method_is_skipped_like_its_methods_list() -> None:
    anti = ProviderSpec("anti", "http://anti", "k5", 5, "fallback", kind="anticaptcha")
    solver = ProviderSpec("solver", "http://solver", "k6", 5, "overflow", kind="capsolver")
    providers = (PRIMARY, anti, solver)
    views = {p.name: Circuit(p.name) for p in providers}
    views["main"] = Circuit("main", open=True, why="soft", code="ERROR_TRANSPORT", probe_at=T0)
    assert routing.route(job(), providers, views, T0) == Destination("anti", ("solver",))
    # neither JSON dialect has a Friendly Captcha task: nobody in rotation takes it
    challenge = job("friendly_captcha")
    decided = routing.route(challenge, providers, views, T0)
    assert not isinstance(decided, Destination)
    assert routing.route(challenge, providers, {**views, "main": Circuit("main")}, T0) == (
        Destination("main", ())
    )


def test_a_json_provider_without_a_proxied_task_type_skips_a_solve_with_a_proxy() -> None:
    solver = ProviderSpec("solver", "http://solver", "k6", 5, "fallback", kind="capsolver")
    anti = ProviderSpec("anti", "http://anti", "k5", 5, "fallback", kind="anticaptcha")
    providers = (solver, anti)
    views = {p.name: Circuit(p.name) for p in providers}
    assert routing.route(job(), providers, views, T0) == Destination("solver", ())
    # CapSolver has no Turnstile task with a proxy: Anti-Captcha's TurnstileTask takes it
    proxied = job(proxy="user:pw@10.0.0.1:8080", proxytype="HTTP")
    assert routing.route(proxied, providers, views, T0) == Destination("anti", ())
    stashed = dataclasses.replace(job(), secrets=("proxy",))  # its proxy waits in Redis
    assert routing.route(stashed, providers, views, T0) == Destination("anti", ())


def test_an_overflow_provider_is_home_when_nothing_else_is_in_rotation() -> None:
    down = circuits(main=("balance", "ERROR_ZERO_BALANCE"), backup=("key", "ERROR_WRONG_USER_KEY"))
    assert routing.route(job(), PROVIDERS, down, T0) == Destination("spill", ())


def test_with_every_provider_empty_the_caller_hears_it_at_once() -> None:
    empty = ("balance", "ERROR_ZERO_BALANCE")
    decision = routing.route(job(), PROVIDERS, circuits(main=empty, backup=empty, spill=empty), T0)
    assert isinstance(decision, Fail)
    assert isinstance(decision.error, errors.ZeroBalance)
    assert "main: ERROR_ZERO_BALANCE" in decision.error.message


def test_with_every_provider_refusing_its_key_the_caller_hears_the_hint() -> None:
    """``ERROR_KEY_DOES_NOT_EXIST`` still opens the circuit at once (no retry can help until
    the account changes; the probe closes it when it does): the failure says what to do."""
    gone = ("key", "ERROR_KEY_DOES_NOT_EXIST")
    decision = routing.route(job(), PROVIDERS, circuits(main=gone, backup=gone, spill=gone), T0)
    assert isinstance(decision, Fail) and isinstance(decision.error, errors.AuthError)
    assert "main: ERROR_KEY_DOES_NOT_EXIST" in decision.error.message
    assert "start a trial or subscribe" in decision.error.message


def test_with_one_that_may_come_back_the_submit_waits_for_its_probe() -> None:
    empty = ("balance", "ERROR_ZERO_BALANCE")
    silent = ("soft", "ERROR_TRANSPORT")
    decision = routing.route(job(), PROVIDERS, circuits(main=silent, backup=empty, spill=empty), T0)
    assert isinstance(decision, SubmitAt) and decision.at == T0 + 4 + 0.5
    assert isinstance(decision.error, errors.ProviderDown)
    late = dataclasses.replace(job(), deadline=T0 + 2)
    assert isinstance(
        routing.route(late, PROVIDERS, circuits(main=silent, backup=empty, spill=empty), T0), Fail
    )


def test_a_captcha_at_a_provider_gone_out_of_rotation_is_moved_not_counted() -> None:
    at = dataclasses.replace(submitted(), provider="main", resubmits=1)
    decision = routing.on_provider_down(at, T0 + 3)
    assert isinstance(decision, Resubmit) and decision.reason == "provider_down"
    assert decision.job.attempt == at.attempt + 1 and decision.job.resubmits == 1
    assert decision.job.captcha_id is None
    over = routing.on_provider_down(at, at.deadline)
    assert isinstance(over, Fail) and isinstance(over.error, errors.SolveTimeout)


def test_overflow_takes_what_would_wait_longer_than_its_setting() -> None:
    # 10 threads finishing a captcha every 2 s each: 5 per second; 3 s of waiting is 15
    assert routing.park_limit(10, 2.0, 3.0) == 15


def test_a_stale_view_that_finds_no_provider_is_read_again_before_it_fails() -> None:
    empty = ("balance", "ERROR_ZERO_BALANCE")
    none_up = circuits(main=empty, backup=empty, spill=empty)
    assert routing.route(job(), PROVIDERS, none_up, T0, fresh=False) == Reread()
    assert isinstance(routing.route(job(), PROVIDERS, none_up, T0, fresh=True), Fail)
    # a view with a provider in rotation is good enough, fresh or not
    assert routing.route(job(), PROVIDERS, circuits(), T0, fresh=False) == Destination(
        "main", ("spill",)
    )


def test_a_submit_turned_away_as_down_is_routed_again_a_bounded_number_of_times() -> None:
    providers = len(PROVIDERS)
    assert routing.after_admission("go", 1, providers) is None
    assert routing.after_admission("parked", 1, providers) is None
    assert routing.after_admission("full", 1, providers) is None  # the last try stands
    for routed in range(1, providers + 1):
        assert routing.after_admission("down", routed, providers) == Reread()
    gave_up = routing.after_admission("down", providers + 1, providers)
    assert isinstance(gave_up, Fail) and isinstance(gave_up.error, errors.ProviderDown)


def test_without_overflow_providers_a_submit_is_admitted_at_home_whatever_the_wait() -> None:
    assert routing.tries("main", ()) == (Try("main"),)
    assert routing.tries("main", (), home_limit=7) == (Try("main"),)


def test_with_overflow_home_first_while_the_wait_is_short_then_a_free_thread_then_home() -> None:
    tried = routing.tries("main", ("spill", "spill2"), home_limit=15)
    assert tried == (
        Try("main", 15, routing.FULL),
        Try("spill", 0, routing.FULL_OR_DOWN),
        Try("spill2", 0, routing.FULL_OR_DOWN),
        Try("main"),
    )
    # a try is left only for the answers it passes on: full at home goes on, down stays
    assert "full" in tried[0].passes and "down" not in tried[0].passes
    assert not tried[-1].passes  # the last one stands, whatever it says


def test_only_a_callers_solve_spills_and_only_with_the_setting() -> None:
    to = Destination("main", ("spill",))
    assert routing.overflow(to, job(), POLICY) == ("spill",)
    off = dataclasses.replace(POLICY, overflow_after=None)
    assert routing.overflow(to, job(), off) == ()
    refill = dataclasses.replace(job(), pool="tokens")
    assert routing.overflow(to, refill, POLICY) == ()


def test_a_job_moving_to_another_provider_lets_go_of_what_it_held() -> None:
    assert routing.leaving(job(), "main") is None  # first admission: it held nothing
    at_main = job().at("main")
    assert routing.leaving(at_main, "main") is None
    assert routing.leaving(at_main, "spill") == "main"


def test_the_captchas_of_a_provider_that_stopped_answering_go_elsewhere() -> None:
    silent = circuits(main=("soft", "ERROR_TRANSPORT"))
    assert routing.work_lost_at("main", silent)
    assert not routing.work_lost_at("backup", silent)  # in rotation itself
    refused = circuits(main=("key", "ERROR_WRONG_USER_KEY"))
    assert routing.work_lost_at("main", refused)
    # an empty balance still solves what it took: polled as before
    assert not routing.work_lost_at("main", circuits(main=("balance", "ERROR_ZERO_BALANCE")))
    # with nowhere to go, paying again gains nothing
    all_silent = circuits(**{p.name: ("soft", "ERROR_TRANSPORT") for p in PROVIDERS})
    assert not routing.work_lost_at("main", all_silent)
    assert not routing.work_lost_at("unknown", silent)


def test_housekeeping_moves_the_work_of_every_provider_out_of_rotation() -> None:
    down = circuits(main=("soft", "ERROR_TRANSPORT"), backup=("balance", "ERROR_ZERO_BALANCE"))
    assert routing.evacuations(down) == [
        routing.Evacuate("main", captchas=True),
        routing.Evacuate("backup", captchas=False),  # its captchas are still solved
    ]
    assert routing.evacuations(circuits()) == []
    all_down = circuits(**{p.name: ("soft", "ERROR_TRANSPORT") for p in PROVIDERS})
    assert routing.evacuations(all_down) == []  # nowhere to go


# -- acceptance on top of the order ------------------------------------------------------


def poor_main() -> routing.Pick:
    """The site rejects most of the primary's tokens and accepts the backup's."""
    from captcha_tasks.core.acceptance import Acceptance, AcceptancePolicy

    return routing.Pick(
        {"main": Acceptance(good=4, bad=12, at=T0), "backup": Acceptance(good=30, at=T0)},
        0.5,
        AcceptancePolicy(),
    )


def test_a_site_that_rejects_the_primary_goes_to_the_provider_it_accepts() -> None:
    assert routing.route(job(), PROVIDERS, circuits(), T0, pick=poor_main()) == Destination(
        "backup", ("spill",), "acceptance"
    )


def test_circuits_still_decide_under_acceptance() -> None:
    # the accepted provider is out of rotation: the order's next one in rotation takes it
    down = circuits(backup=("soft", "ERROR_TRANSPORT"))
    assert routing.route(job(), PROVIDERS, down, T0, pick=poor_main()) == Destination(
        "main", ("spill",), "order"
    )
    # a method the accepted provider does not take stays in order
    pick = poor_main()
    pick = dataclasses.replace(
        pick, acceptance={**pick.acceptance, "images": pick.acceptance["backup"]}
    )
    to = routing.route(job(), (PRIMARY, IMAGES, SPILL), circuits(), T0, pick=pick)
    assert to == Destination("main", ("spill",), "order")
