"""The steps of a captcha's life, as plain functions: no worker, no Redis, no network, and
the time passed in."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from image_files import png_b64

from captcha_tasks import errors
from captcha_tasks.core import decisions, steps
from captcha_tasks.core.admission import Admission
from captcha_tasks.core.answers import NOT_READY, Answer
from captcha_tasks.core.channel import DEGRADED, DOWN, UP, Heard
from captcha_tasks.core.decisions import (
    Deliver,
    Fail,
    Policy,
    PollAt,
    Resubmit,
    Stop,
    Submit,
    SubmitAt,
)
from captcha_tasks.core.job import Job
from captcha_tasks.core.outcome import parse_iso
from captcha_tasks.core.timing import Timing
from captcha_tasks.methods import build_request

pytestmark = pytest.mark.unit

T0 = 1_000_000.0
PAGE = "https://example.com/steps"
POLICY = Policy(
    solve_timeout=300.0,
    poll_interval=5.0,
    bulk_interval=0.5,
    transport_retries=2,
    max_resubmits=1,
    random=lambda: 0.0,  # back-offs at their lowest: half the exponential base
)
COLD = Timing(first_wait=10.0, earliest=10.0, typical=10.0)
COLD_DEFAULT = Timing(first_wait=10.0, earliest=10.0, typical=10.0, probe=True)
WARM = Timing(first_wait=14.0, earliest=12.0, typical=15.0, warm=True, spread=2.0)
BULK = steps.Pace(bulk=True, every=0.5)


def job(method: str = "turnstile", **params: Any) -> Job:
    sitekey = None if method == "base64" else "k"
    pageurl = None if method == "base64" else PAGE
    request = build_request(method, sitekey, pageurl, **params)
    return Job.new("solve-1", request, T0, POLICY.solve_timeout)


def submitted(at: float = T0 + 1, **params: Any) -> Job:
    decision = steps.on_submitted(job(**params), "7001", at, COLD, POLICY, bulk=True)
    assert isinstance(decision, PollAt)
    return decision.job


# -- submit ---------------------------------------------------------------------------------


def test_a_new_job_carries_its_budgets_and_deadline() -> None:
    new = job()
    assert (new.started, new.deadline) == (T0, T0 + POLICY.solve_timeout)
    assert (new.attempt, new.transport_errors, new.resubmits) == (0, 0, 0)
    data = new.to_dict()  # what travels in messages and Redis
    assert "key" not in data and "key" not in data["request"]["params"]  # workers hold it
    assert Job.from_json(new.to_json()) == new


def test_a_submit_past_the_deadline_fails() -> None:
    assert steps.before_submit(job(), T0 + 299) is None
    late = steps.before_submit(job(), T0 + 300)
    assert isinstance(late, Fail) and isinstance(late.error, errors.SolveTimeout)


@pytest.mark.parametrize(
    ("admission", "expected"),
    [
        (Admission("go"), Submit()),
        (Admission("parked"), Stop("parked")),
        (Admission("cancelled"), Stop("cancelled")),
        (Admission("done"), Stop("done")),
        (Admission("deferred", 1.5), Stop("deferred")),
    ],
)
def test_admission_decisions(admission: Admission, expected: object) -> None:
    assert steps.on_admission(job(), admission, T0) == expected


def test_a_spent_tenant_budget_fails_at_once() -> None:
    crawler = dataclasses.replace(job(), tenant="crawler")
    failed = steps.on_admission(crawler, Admission("over_budget"), T0)
    assert isinstance(failed, Fail) and isinstance(failed.error, errors.BudgetExceeded)
    assert failed.error.code == "ERROR_BUDGET_EXCEEDED"
    assert "'crawler'" in failed.error.message and "00:00 UTC" in failed.error.message
    # the caller's side rebuilds the same type from the stored code
    assert type(errors.from_api_code("ERROR_BUDGET_EXCEEDED")) is errors.BudgetExceeded


def test_a_busy_claim_means_later() -> None:
    busy = steps.on_admission(job(), Admission("busy", 40.0), T0)
    assert isinstance(busy, SubmitAt) and busy.at == T0 + 40 and busy.keep_claim


def test_a_submitted_captcha_is_first_polled_after_the_cold_wait() -> None:
    decision = steps.on_submitted(job(), "7001", T0 + 1, COLD, POLICY, bulk=True)
    assert isinstance(decision, PollAt)
    assert decision.at == T0 + 1 + COLD.first_wait
    assert (decision.job.captcha_id, decision.job.submitted_at) == ("7001", T0 + 1)


def test_warm_bulk_polls_start_at_the_earliest_likely_finish() -> None:
    bulk = steps.on_submitted(job(), "7001", T0, WARM, POLICY, bulk=True)
    single = steps.on_submitted(job(), "7001", T0, WARM, POLICY, bulk=False)
    image = steps.on_submitted(job("base64", body=png_b64()), "7001", T0, WARM, POLICY, True)
    assert isinstance(bulk, PollAt) and bulk.at == T0 + WARM.earliest
    assert isinstance(single, PollAt) and single.at == T0 + WARM.first_wait
    # image answers may hold "|": never asked for in bulk
    assert isinstance(image, PollAt) and image.at == T0 + WARM.first_wait


def test_transport_errors_back_off_then_give_up() -> None:
    error = errors.TransportError("in.php: HTTP 500")
    first = steps.on_submitted(job(), error, T0, COLD, POLICY, bulk=True)
    assert isinstance(first, SubmitAt) and first.error is error
    assert first.at == T0 + decisions.BACKOFF_BASE * 0.5
    assert first.job.transport_errors == 1
    second = steps.on_submitted(first.job, error, T0, COLD, POLICY, bulk=True)
    assert isinstance(second, SubmitAt) and second.at == T0 + decisions.BACKOFF_BASE
    third = steps.on_submitted(second.job, error, T0, COLD, POLICY, bulk=True)
    assert isinstance(third, Fail) and isinstance(third.error, errors.RetriesExhausted)
    assert third.error.code == "ERROR_TRANSPORT"


def test_too_many_requests_at_submit_waits_without_spending_a_retry() -> None:
    slow = errors.from_api_code("ERROR_TOO_MUCH_REQUESTS")
    decision = steps.on_submitted(job(), slow, T0, COLD, POLICY, bulk=True)
    assert decision == SubmitAt(T0 + errors.DEFAULT_RETRY_AFTER, job(), slow)
    # as often as it comes: the transport budget (2) is never spent on it
    again = steps.on_submitted(job(), slow, T0, COLD, POLICY, bulk=True)
    for _ in range(POLICY.transport_retries + 2):
        assert isinstance(again, SubmitAt) and again.job.transport_errors == 0
        again = steps.on_submitted(again.job, slow, T0, COLD, POLICY, bulk=True)


def test_too_many_requests_at_poll_waits_without_spending_a_retry() -> None:
    polled = submitted()
    slow = errors.from_api_code("ERROR_TOO_MUCH_REQUESTS", "7001")
    decision = steps.on_answer(polled, slow, None, 1, T0 + 12, COLD, POLICY, BULK)
    assert decision == steps.on_poll_budget(polled, errors.DEFAULT_RETRY_AFTER, 1, T0 + 12)
    assert isinstance(decision, PollAt) and decision.poll_errors == 1


def test_fatal_submit_errors_fail_at_once() -> None:
    auth = errors.AuthError("ERROR_WRONG_USER_KEY", "ERROR_WRONG_USER_KEY")
    assert steps.on_submitted(job(), auth, T0, COLD, POLICY, BULK) == Fail(auth)


def test_a_bad_pooled_proxy_is_replaced_but_a_callers_proxy_is_fatal() -> None:
    bad = errors.ProxyError("ERROR_BAD_PROXY", "ERROR_BAD_PROXY")
    pooled = steps.on_submitted(job(proxy="pool"), bad, T0, COLD, POLICY, BULK)
    assert isinstance(pooled, Resubmit) and pooled.replace_proxy
    assert (pooled.job.attempt, pooled.job.resubmits) == (1, 1)
    own = steps.on_submitted(job(proxy="u:p@10.0.0.1:3128"), bad, T0, COLD, POLICY, BULK)
    assert own == Fail(bad)


# -- poll -----------------------------------------------------------------------------------


def test_cold_not_ready_is_polled_again_at_the_bulk_pace_or_the_poll_interval() -> None:
    polled = submitted()
    again = steps.on_answer(polled, NOT_READY, None, 0, T0 + 11, COLD, POLICY, BULK)
    assert again == PollAt(T0 + 11 + BULK.every, polled)
    single = steps.Pace(bulk=False, every=POLICY.poll_interval)
    again = steps.on_answer(polled, NOT_READY, None, 0, T0 + 11, COLD, POLICY, single)
    assert again == PollAt(T0 + 11 + POLICY.poll_interval, polled)


def test_warm_bulk_polls_are_frequent_only_past_the_earliest_finish() -> None:
    polled = submitted(at=T0)
    pace = steps.pace(POLICY, WARM, bulk=True)
    early = steps.on_answer(polled, NOT_READY, None, 0, T0 + 5, WARM, POLICY, pace)
    late = steps.on_answer(polled, NOT_READY, None, 0, T0 + 13, WARM, POLICY, pace)
    # before the earliest likely finish: at that finish, or the poll interval if sooner
    assert isinstance(early, PollAt) and early.at == T0 + 5 + POLICY.poll_interval
    soon = steps.on_answer(polled, NOT_READY, None, 0, T0 + 11, WARM, POLICY, pace)
    assert isinstance(soon, PollAt) and soon.at == T0 + WARM.earliest
    assert isinstance(late, PollAt) and late.at == T0 + 13 + pace.every


@pytest.mark.parametrize(
    ("spread", "expected"),
    [
        (2.0, 2.0 / steps.BULK_POLLS_PER_SPREAD),  # a few polls across the finishing window
        (0.0, steps.MIN_BULK_EVERY),  # never faster than this
        (60.0, 0.5),  # never slower than the bulk window
    ],
)
def test_the_bulk_pace_follows_the_spread_of_solve_times(spread: float, expected: float) -> None:
    warm = Timing(first_wait=14.0, earliest=12.0, typical=15.0, warm=True, spread=spread)
    assert steps.pace(POLICY, warm, bulk=True) == steps.Pace(True, expected)
    assert steps.pace(POLICY, COLD, bulk=True) == steps.Pace(True, POLICY.bulk_interval)
    assert steps.pace(POLICY, warm, bulk=False) == steps.Pace(False, POLICY.poll_interval)


def test_cold_bulk_captchas_are_probed_early_unless_the_operator_set_the_wait() -> None:
    probed = steps.on_submitted(job(), "7001", T0, COLD_DEFAULT, POLICY, bulk=True)
    assert isinstance(probed, PollAt) and probed.at == T0 + 10.0 * steps.COLD_PROBE
    told = steps.on_submitted(job(), "7001", T0, COLD, POLICY, bulk=True)
    assert isinstance(told, PollAt) and told.at == T0 + COLD.first_wait
    single = steps.on_submitted(job(), "7001", T0, COLD_DEFAULT, POLICY, bulk=False)
    assert isinstance(single, PollAt) and single.at == T0 + COLD.first_wait


def test_polls_never_go_past_the_deadline_and_then_fail() -> None:
    polled = submitted()
    last = steps.on_answer(polled, NOT_READY, None, 0, T0 + 299.8, COLD, POLICY, BULK)
    assert isinstance(last, PollAt) and last.at == polled.deadline
    over = steps.on_answer(polled, NOT_READY, None, 0, T0 + 300, COLD, POLICY, BULK)
    assert isinstance(over, Fail) and isinstance(over.error, errors.SolveTimeout)


def test_an_answer_is_delivered_with_a_conservative_expiry() -> None:
    polled = submitted(at=T0)
    decision = steps.on_answer(polled, Answer("0.tok"), T0 + 9, 0, T0 + 10, COLD, POLICY, BULK)
    assert isinstance(decision, Deliver)
    outcome = decision.outcome.to_dict()
    assert (outcome["status"], outcome["token"], outcome["source"]) == ("solved", "0.tok", "api")
    # the token was made after the last "not ready" at T0 + 9
    life = POLICY.token_life(polled.request)
    assert decision.outcome.expires_at == T0 + 9 + life
    assert parse_iso(outcome["expires_at"]) == pytest.approx(T0 + 9 + life, abs=0.001)
    # its solve time: midway between the last "not ready" (T0 + 9) and now (T0 + 10)
    assert decision.solve_time_s == 9.5
    first = steps.on_answer(polled, Answer("0.tok"), None, 0, T0 + 10, COLD, POLICY, BULK)
    assert isinstance(first, Deliver) and first.solve_time_s == 10.0  # an upper bound
    assert list(outcome)[-1] == "token"  # a truncated repr never shows it


def test_an_answer_too_old_to_use_is_solved_again() -> None:
    polled = submitted(at=T0)
    life = POLICY.token_life(polled.request)
    stale = steps.on_answer(polled, Answer("0.tok"), None, 0, T0 + life - 0.5, COLD, POLICY, BULK)
    assert isinstance(stale, Resubmit) and isinstance(stale.error, errors.TokenExpired)
    assert stale.job.captcha_id is None and stale.job.attempt == 1


def test_unsolvable_is_resubmitted_within_its_budget() -> None:
    unsolvable = errors.UnsolvableError("ERROR_CAPTCHA_UNSOLVABLE", "ERROR_CAPTCHA_UNSOLVABLE")
    first = steps.on_answer(submitted(), unsolvable, None, 0, T0 + 12, COLD, POLICY, BULK)
    assert isinstance(first, Resubmit)
    again = steps.on_submitted(first.job, "7002", T0 + 13, COLD, POLICY, BULK)
    assert isinstance(again, PollAt)
    second = steps.on_answer(again.job, unsolvable, None, 0, T0 + 25, COLD, POLICY, BULK)
    assert second == Fail(unsolvable)


def test_poll_transport_errors_have_their_own_budget() -> None:
    polled = submitted()
    error = errors.TransportError("res.php: timed out")
    first = steps.on_answer(polled, error, None, 0, T0 + 12, COLD, POLICY, BULK)
    assert isinstance(first, PollAt) and (first.poll_errors, first.error) == (1, error)
    third = steps.on_answer(polled, error, None, 2, T0 + 14, COLD, POLICY, BULK)
    assert isinstance(third, Fail) and isinstance(third.error, errors.RetriesExhausted)


def test_a_spent_res_budget_polls_later() -> None:
    polled = submitted()
    assert steps.on_poll_budget(polled, 30.0, 1, T0 + 12) == PollAt(T0 + 42, polled, 1)


# -- provider callbacks -----------------------------------------------------------------------

CALLBACKS = dataclasses.replace(POLICY, pingback_fallback=1.0)
#: Solve times of 12 s (5th percentile), 15 s (median) and 18 s (95th percentile).
SOLVES = Timing(first_wait=16.0, earliest=12.0, typical=15.0, warm=True, spread=6.0)


def sent(timing: Timing, channel: str, policy: Policy = CALLBACKS) -> PollAt:
    """The decision for a captcha submitted at T0 + 1 with the channel in ``channel``."""
    decision = steps.on_submitted(job(), "7001", T0 + 1, timing, policy, True, channel=channel)
    assert isinstance(decision, PollAt)
    return decision


def test_while_callbacks_arrive_a_captcha_is_polled_soon_after_its_callback_is_overdue() -> None:
    decision = sent(SOLVES, UP)
    p95 = SOLVES.earliest + SOLVES.spread  # the solve times' 95th percentile
    assert decision.at == pytest.approx(T0 + 1 + p95 + CALLBACKS.pingback_fallback)  # type: ignore[operator]
    assert decision.job.callback_due == decision.at  # overdue from then on
    slower = dataclasses.replace(SOLVES, spread=10.0)
    assert sent(slower, UP).at == pytest.approx(decision.at + 4.0)  # the solve times decide


def test_while_many_callbacks_are_lost_polls_start_before_the_median_solve_time() -> None:
    decision = sent(SOLVES, DEGRADED)
    assert decision.at == T0 + 1 + (SOLVES.earliest + SOLVES.typical) / 2
    assert decision.job.callback_due == sent(SOLVES, UP).at  # it still waits for one


def test_once_callbacks_stopped_captchas_are_polled_as_without_them() -> None:
    down, off = sent(SOLVES, DOWN), sent(SOLVES, UP, policy=POLICY)
    assert down.at == off.at == T0 + 1 + SOLVES.earliest
    assert down.job.callback_due is None


@pytest.mark.parametrize("channel", [UP, DEGRADED, DOWN])
def test_with_no_solve_times_known_captchas_are_probed_as_without_callbacks(
    channel: str,
) -> None:
    # so the policy converges when no callback ever comes: the polls teach the times
    probe = sent(COLD_DEFAULT, channel)
    assert probe.at == sent(COLD_DEFAULT, UP, policy=POLICY).at
    assert probe.at == T0 + 1 + COLD_DEFAULT.first_wait * steps.COLD_PROBE
    assert probe.job.callback_due is None
    found = steps.on_answer(probe.job, Answer("0.tok"), None, 0, probe.at, COLD, CALLBACKS, BULK)
    assert isinstance(found, Deliver) and found.solve_time_s is not None


def test_answers_with_a_user_agent_are_polled_even_with_callbacks() -> None:
    request = build_request("cloudflare_challenge", pageurl=PAGE, proxy="u:p@10.0.0.1:3128")
    new = Job.new("solve-3", request, T0, CALLBACKS.solve_timeout)
    assert not steps.uses_pingback(new) and steps.uses_pingback(job())
    decision = steps.on_submitted(new, "7001", T0 + 1, COLD, CALLBACKS, bulk=True)
    assert isinstance(decision, PollAt) and decision.at == T0 + 1 + COLD.first_wait


def test_a_callback_answer_is_delivered_like_a_polled_one() -> None:
    polled = submitted()
    decision = steps.on_callback(polled, Answer("0.tok"), None, T0 + 12, CALLBACKS)
    assert isinstance(decision, Deliver)
    assert (decision.outcome.token, decision.outcome.captcha_id) == ("0.tok", "7001")
    assert decision.solve_time_s == pytest.approx(11.0)


def test_a_callback_error_takes_the_polls_route() -> None:
    polled = submitted()
    unsolvable = errors.from_api_code("ERROR_CAPTCHA_UNSOLVABLE", "7001")
    decision = steps.on_callback(polled, unsolvable, None, T0 + 12, CALLBACKS)
    assert decision == steps.on_answer(polled, unsolvable, None, 0, T0 + 12, COLD, CALLBACKS, BULK)
    assert isinstance(decision, Resubmit)
    fatal = errors.from_api_code("ERROR_BAD_TOKEN_OR_PAGEURL", "7001")
    assert isinstance(steps.on_callback(polled, fatal, None, T0 + 12, CALLBACKS), Fail)


def test_a_callback_that_ends_nothing_changes_nothing() -> None:
    polled = submitted()
    assert steps.on_callback(polled, NOT_READY, None, T0 + 12, CALLBACKS) is None
    transient = errors.from_api_code("ERROR_SERVER_ERROR", "7001")
    assert steps.on_callback(polled, transient, None, T0 + 12, CALLBACKS) is None


def _polled(request: Any) -> Job:
    decision = steps.on_submitted(
        Job.new("solve-2", request, T0, POLICY.solve_timeout), "7009", T0, COLD, POLICY, True
    )
    assert isinstance(decision, PollAt)
    return decision.job


def test_only_plain_tokens_without_a_user_agent_are_polled_in_bulk() -> None:
    proxy = "u:p@10.0.0.1:3128"
    singles = [
        build_request("userrecaptcha", "k", PAGE, enterprise=1),
        build_request("cloudflare_challenge", pageurl=PAGE, proxy=proxy),
        build_request("captchafox", "k", PAGE, proxy=proxy),
        build_request("grid", body=png_b64(), instructions="bus", grid_size="3x3"),
        build_request("lemin", "k", PAGE, div_id="d"),
        build_request("geetest", "k", PAGE, challenge="c"),
    ]
    for request in singles:
        assert not steps.uses_bulk(_polled(request), bulk=True), request.method
    for method in ("userrecaptcha", "turnstile", "friendly_captcha"):
        assert steps.uses_bulk(job(method), bulk=True)
        assert not steps.uses_bulk(job(method), bulk=False)


def test_the_user_agent_reaches_the_outcome() -> None:
    request = build_request("cloudflare_challenge", pageurl=PAGE, proxy="u:p@10.0.0.1:3128")
    agent = "Mozilla/5.0 (X11; Linux x86_64) Solver"
    decision = steps.on_answer(
        _polled(request), Answer("cf.clearance", agent), None, 0, T0 + 20, COLD, POLICY, BULK
    )
    assert isinstance(decision, Deliver)
    assert decision.outcome.user_agent == agent
    assert decision.outcome.token == "cf.clearance"
    assert list(decision.outcome.to_dict())[-1] == "token"
    plain = steps.on_answer(submitted(at=T0), Answer("0.tok"), None, 0, T0 + 5, COLD, POLICY, BULK)
    assert isinstance(plain, Deliver) and "user_agent" not in plain.outcome.to_dict()


def test_structured_answers_are_delivered_as_json_values() -> None:
    grid = build_request("grid", body=png_b64(), instructions="bus", grid_size="4x4")
    decision = steps.on_answer(_polled(grid), Answer("[3,16]"), None, 0, T0 + 5, COLD, POLICY, BULK)
    assert isinstance(decision, Deliver) and decision.outcome.token == [3, 16]
    lemin = build_request("lemin", "k", PAGE, div_id="d")
    answer = Answer('{"answer":"0xaa","challenge_uuid":"u-1"}')
    decision = steps.on_answer(_polled(lemin), answer, None, 0, T0 + 5, COLD, POLICY, BULK)
    assert isinstance(decision, Deliver)
    assert decision.outcome.token == {"answer": "0xaa", "challenge_uuid": "u-1"}


@pytest.mark.parametrize("channel", [UP, DEGRADED])
def test_a_first_poll_late_on_purpose_teaches_no_solve_time(channel: str) -> None:
    polled = sent(SOLVES, channel)
    late = steps.on_answer(polled.job, Answer("0.tok"), None, 0, polled.at, SOLVES, CALLBACKS, BULK)
    assert isinstance(late, Deliver) and late.solve_time_s is None
    again = steps.on_answer(
        polled.job, Answer("0.tok"), polled.at, 0, polled.at + 1, SOLVES, CALLBACKS, BULK
    )
    assert isinstance(again, Deliver)
    assert again.solve_time_s == pytest.approx(polled.at + 0.5 - (T0 + 1))


@pytest.mark.parametrize("channel", [UP, DEGRADED])
def test_a_captcha_counting_on_its_callback_is_polled_seldom_in_case_it_was_lost(
    channel: str,
) -> None:
    polled = sent(SOLVES, channel)
    assert steps.counts_on_callback(polled.job, SOLVES, CALLBACKS, channel)
    pace = steps.pace(CALLBACKS, SOLVES, True, waits=True)
    # a few polls across the finishing window, however short the bulk window is
    assert pace == steps.Pace(True, SOLVES.spread / steps.CALLBACK_POLLS_PER_SPREAD)
    assert pace.every > steps.pace(CALLBACKS, SOLVES, True).every == CALLBACKS.bulk_interval
    again = steps.on_answer(polled.job, NOT_READY, None, 0, polled.at, SOLVES, CALLBACKS, pace)
    assert isinstance(again, PollAt) and again.at == pytest.approx(polled.at + pace.every)
    narrow = dataclasses.replace(SOLVES, spread=0.4)  # never faster than the bulk window
    assert steps.pace(CALLBACKS, narrow, True, waits=True).every == CALLBACKS.bulk_interval


def test_cold_captchas_counting_on_their_callback_are_probed_seldom() -> None:
    probe = sent(COLD_DEFAULT, UP)
    assert steps.counts_on_callback(probe.job, COLD_DEFAULT, CALLBACKS, UP)
    slow = dataclasses.replace(COLD_DEFAULT, first_wait=20.0)  # a reCAPTCHA's, say
    pace = steps.pace(CALLBACKS, slow, True, waits=True)
    assert pace == steps.Pace(True, slow.first_wait * steps.COLD_CALLBACK_PACE)
    assert pace.every > steps.pace(CALLBACKS, slow, True).every == CALLBACKS.bulk_interval
    # never faster than the bulk window
    assert steps.pace(CALLBACKS, COLD_DEFAULT, True, waits=True).every >= CALLBACKS.bulk_interval


def test_a_captcha_registered_cold_waits_for_its_callback_once_the_times_are_known() -> None:
    probe = sent(COLD_DEFAULT, UP)  # registered cold: probed, waiting for no callback yet
    assert probe.job.callback_due is None
    due_s = steps.callback_due(SOLVES, CALLBACKS)  # the times are known by its first probe
    assert steps.adopts_callback(probe.job, SOLVES, CALLBACKS, UP)
    pace = steps.adopting(CALLBACKS, SOLVES, True, UP)
    # it is paced as one counting on its callback: its round does not bring the next one
    # forward to the bulk window
    assert pace.every == steps.pace(CALLBACKS, SOLVES, True, waits=True).every
    assert pace.every > CALLBACKS.bulk_interval
    again = steps.on_answer(probe.job, NOT_READY, None, 0, probe.at, SOLVES, CALLBACKS, pace)
    # not polled again until its callback is overdue, as if it had been registered warm
    assert isinstance(again, PollAt) and again.at == pytest.approx(T0 + 1 + due_s)
    assert again.job.callback_due == again.at
    assert not steps.adopts_callback(again.job, SOLVES, CALLBACKS, UP)  # once
    # overdue already: it is polled at the pace of one counting on its callback
    late = steps.on_answer(probe.job, NOT_READY, None, 0, T0 + 60, SOLVES, CALLBACKS, pace)
    assert isinstance(late, PollAt) and late.at == pytest.approx(T0 + 60 + pace.every)
    assert late.job.callback_due == pytest.approx(T0 + 1 + due_s)
    # while many callbacks are lost, from when one registered warm is first polled
    degraded = steps.adopting(CALLBACKS, SOLVES, True, DEGRADED)
    assert steps.adopts_callback(probe.job, SOLVES, CALLBACKS, DEGRADED)
    early = steps.on_answer(probe.job, NOT_READY, None, 0, probe.at, SOLVES, CALLBACKS, degraded)
    start = steps.degraded_start(SOLVES)
    assert isinstance(early, PollAt) and early.at == pytest.approx(T0 + 1 + start)
    assert early.job.callback_due == pytest.approx(T0 + 1 + due_s)
    # not once callbacks stopped, nor while the times are unknown, nor with callbacks off
    assert not steps.adopts_callback(probe.job, SOLVES, CALLBACKS, DOWN)
    assert not steps.adopts_callback(probe.job, COLD_DEFAULT, CALLBACKS, UP)
    assert not steps.adopts_callback(probe.job, SOLVES, POLICY, UP)  # callbacks off


def test_once_callbacks_stopped_or_when_off_captchas_are_polled_at_the_usual_pace() -> None:
    for channel in (UP, DEGRADED, DOWN):
        down = sent(SOLVES, DOWN)  # registered while down: it waits for no callback
        assert not steps.counts_on_callback(down.job, SOLVES, CALLBACKS, channel)
    waiting = sent(SOLVES, UP)
    assert not steps.counts_on_callback(waiting.job, SOLVES, CALLBACKS, DOWN)  # stopped since
    assert not steps.counts_on_callback(sent(COLD_DEFAULT, UP).job, COLD, CALLBACKS, DOWN)
    off = sent(SOLVES, UP, policy=POLICY)
    assert not steps.counts_on_callback(off.job, SOLVES, POLICY, UP)


# -- what answers say of the callback channel ----------------------------------------------


def test_what_a_poll_that_found_the_answer_says_of_the_callbacks() -> None:
    polled = sent(SOLVES, UP)
    due = polled.job.callback_due
    assert due is not None
    at_due = steps.heard_by_poll(polled.job, Answer("t"), None, due, SOLVES, CALLBACKS)
    # found at its first poll: it became ready since its method's earliest likely finish
    late = (due - (T0 + 1) - SOLVES.earliest) / 2
    assert at_due == Heard("poll", "7001", pytest.approx(late), overdue=True)  # type: ignore[arg-type]
    seen = steps.heard_by_poll(polled.job, Answer("t"), due, due + 0.4, SOLVES, CALLBACKS)
    assert seen is not None and seen.late_s == pytest.approx(0.2)  # half the gap
    early = sent(SOLVES, DEGRADED)
    before = steps.heard_by_poll(early.job, Answer("t"), None, early.at, SOLVES, CALLBACKS)
    assert before is not None and (before.by, before.overdue) == ("poll", False)
    assert before.late_s == pytest.approx((SOLVES.typical - SOLVES.earliest) / 4)
    down = sent(SOLVES, DOWN)  # first polled at the earliest likely finish: not late
    found = steps.heard_by_poll(down.job, Answer("t"), None, down.at, SOLVES, CALLBACKS)
    assert found == Heard("poll", "7001", 0.0, overdue=False)
    unsolvable = errors.from_api_code("ERROR_CAPTCHA_UNSOLVABLE", "7001")
    assert steps.heard_by_poll(polled.job, unsolvable, None, due, SOLVES, CALLBACKS) is not None


def test_polls_that_end_nothing_or_asked_for_no_callback_say_nothing() -> None:
    polled = sent(SOLVES, UP)
    for reply in (NOT_READY, errors.TransportError("res.php: timed out")):
        assert steps.heard_by_poll(polled.job, reply, None, T0 + 30, SOLVES, CALLBACKS) is None
    off = sent(SOLVES, UP, policy=POLICY)
    assert steps.heard_by_poll(off.job, Answer("t"), None, T0 + 30, SOLVES, POLICY) is None
    request = build_request("cloudflare_challenge", pageurl=PAGE, proxy="u:p@10.0.0.1:3128")
    agent = steps.on_submitted(
        Job.new("s", request, T0, 300.0), "7002", T0, SOLVES, CALLBACKS, True, channel=UP
    )
    assert isinstance(agent, PollAt) and agent.job.callback_due is None
    assert steps.heard_by_poll(agent.job, Answer("t"), None, T0 + 30, SOLVES, CALLBACKS) is None
    assert steps.heard_by_callback(sent(SOLVES, UP).job) == Heard("callback", "7001")
    assert steps.heard_late("7001") == Heard("late", "7001")


def test_a_failed_submit_at_a_provider_out_of_rotation_goes_elsewhere_at_once() -> None:
    refused = errors.TransportError("in.php: ConnectionRefused")
    decision = steps.on_submitted(job(), refused, T0, COLD, POLICY, bulk=True, down=True)
    assert decision == SubmitAt(T0, job(), refused)  # no retry spent, no back-off
    empty = errors.from_api_code("ERROR_ZERO_BALANCE")
    assert steps.on_submitted(job(), empty, T0, COLD, POLICY, True, down=True) == SubmitAt(
        T0, job(), empty
    )


# -- a captcha paid for while Redis is away ---------------------------------------------------


def test_a_captcha_paid_for_is_held_with_doubling_waits_up_to_its_deadline() -> None:
    held = submitted()  # deadline T0 + 300
    waits = [steps.hold(held, T0 + 10, tries, POLICY) for tries in (1, 2, 3, 4, 9)]
    assert [w.wait_s for w in waits] == [0.2, 0.4, 0.8, 1.0, 1.0]  # type: ignore[union-attr]
    assert all(isinstance(w, steps.Hold) and w.register for w in waits)
    # the last try to register lands at the deadline, no later
    near = steps.hold(held, held.deadline - 0.3, 9, POLICY)
    assert near == steps.Hold(pytest.approx(0.3), register=False)


def test_past_its_deadline_the_solve_is_ended_for_a_grace_then_given_up_as_lost() -> None:
    held = submitted()
    grace = dataclasses.replace(POLICY, hold_grace=20.0)
    after = steps.hold(held, held.deadline, 1, grace)
    assert after == steps.Hold(0.2, register=False)  # its completion is what is tried now
    assert steps.hold(held, held.deadline + 19.5, 9, grace) == steps.Hold(
        pytest.approx(0.5), register=False
    )
    assert isinstance(steps.hold(held, held.deadline + 20, 1, grace), steps.Lost)
    none = dataclasses.replace(POLICY, hold_grace=0.0)
    assert isinstance(steps.hold(held, held.deadline, 1, none), steps.Lost)


def test_a_solve_held_past_its_deadline_ends_in_a_timeout_naming_its_captcha() -> None:
    ending = steps.held_past_deadline("7001")
    assert isinstance(ending.error, errors.SolveTimeout)
    assert ending.error.captcha_id == "7001" and "7001" in ending.error.message


def test_an_answer_that_came_with_the_submit_ends_the_solve_at_once() -> None:
    image = job("base64", body=png_b64())
    decision = steps.on_answered_at_submit(image, "7002", Answer("W9H5K"), T0 + 1, POLICY)
    assert isinstance(decision, Deliver)
    outcome = decision.outcome
    assert (outcome.token, outcome.captcha_id, outcome.elapsed_s) == ("W9H5K", "7002", 1.0)
    assert decision.solve_time_s == 0.0  # answered as it was submitted


def test_a_provider_that_probes_asks_about_a_cold_captcha_early_and_often() -> None:
    """The JSON family has no bulk poll: a cold method's captcha is probed on its own from
    a tenth of its default wait, then at that pace, so its first answers teach the real
    times (an in.php provider without bulk polls waits the default wait, then the poll
    interval, as before)."""
    now = T0 + 1
    probed = steps.on_submitted(job(), "7001", now, COLD_DEFAULT, POLICY, False, probes=True)
    plain = steps.on_submitted(job(), "7001", now, COLD_DEFAULT, POLICY, False)
    assert isinstance(probed, PollAt) and isinstance(plain, PollAt)
    assert (probed.at - now, plain.at - now) == (1.0, 10.0)
    probing = steps.pace(POLICY, COLD_DEFAULT, bulk=False, probes=True)
    assert probing == steps.Pace(False, 1.0)
    again = steps.on_answer(probed.job, NOT_READY, None, 0, T0 + 2, COLD_DEFAULT, POLICY, probing)
    assert isinstance(again, PollAt) and again.at == T0 + 3
    # warm: from the method's earliest likely finish, four polls within its window (2 s)
    assert steps.pace(POLICY, WARM, bulk=False, probes=True) == steps.Pace(False, 0.5)
    warm = steps.on_submitted(job(), "7001", now, WARM, POLICY, False, probes=True)
    assert isinstance(warm, PollAt) and warm.at - now == WARM.earliest
    assert steps.pace(POLICY, WARM, bulk=False) == steps.Pace(False, 5.0)
    # cold with CAPTCHAAI_INITIAL_WAIT set: the given wait, then the poll interval
    assert steps.pace(POLICY, COLD, bulk=False, probes=True) == steps.Pace(False, 5.0)
    given = steps.on_submitted(job(), "7001", now, COLD, POLICY, False, probes=True)
    assert isinstance(given, PollAt) and given.at - now == COLD.first_wait


def test_a_captcha_alone_at_a_bulk_provider_is_polled_at_the_poll_interval() -> None:
    image = steps.on_submitted(job("base64", body=png_b64()), "7001", T0, WARM, POLICY, True)
    assert isinstance(image, PollAt)
    decision = steps.on_answer(image.job, NOT_READY, None, 0, T0 + 20, WARM, POLICY, BULK)
    assert isinstance(decision, PollAt) and decision.at == T0 + 20 + POLICY.poll_interval
