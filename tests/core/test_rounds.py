"""A poll round's policy (captcha_tasks.core.rounds) on its own: which requests it makes
for the captchas it took, what it puts back, and when the next round runs."""

from __future__ import annotations

import pytest
from image_files import png_b64

from captcha_tasks import errors
from captcha_tasks.core import rounds
from captcha_tasks.core.decisions import PollAt
from captcha_tasks.core.job import Job
from captcha_tasks.core.rounds import BULK_IDS, ROUND_MOST, Again, Asks, Entry
from captcha_tasks.core.steps import Pace
from captcha_tasks.methods import build_request

pytestmark = pytest.mark.unit

T0 = 1_000_000.0
PAGE = "https://example.com/rounds"


def token_job(n: int) -> tuple[str, Job]:
    request = build_request("turnstile", "0x4A", PAGE)
    return str(7000 + n), Job.new(f"solve-{n}", request, T0, 300.0)


def image_job(n: int) -> tuple[str, Job]:
    request = build_request("base64", body=png_b64())
    return str(9000 + n), Job.new(f"image-{n}", request, T0, 300.0)


def test_pipe_safe_captchas_are_asked_for_in_chunks_and_the_others_one_by_one() -> None:
    tokens = [token_job(n) for n in range(BULK_IDS + 30)]
    images = [image_job(n) for n in range(3)]
    asks = rounds.asks([*tokens, *images], bulk=True)
    assert [len(c) for c in asks.chunks] == [BULK_IDS, 30]
    assert asks.single == tuple(cid for cid, _ in images)
    assert asks.requests == 2 + 3
    # every captcha is asked for once
    asked = [cid for chunk in asks.chunks for cid in chunk] + list(asks.single)
    assert sorted(asked) == sorted(cid for cid, _ in [*tokens, *images])


def test_without_bulk_every_captcha_is_asked_for_on_its_own() -> None:
    tokens = [token_job(n) for n in range(3)]
    assert rounds.asks(tokens, bulk=False) == Asks((), tuple(cid for cid, _ in tokens))


def test_a_chunk_of_one_is_asked_for_on_its_own() -> None:
    tokens = [token_job(n) for n in range(BULK_IDS + 1)]
    asks = rounds.asks(tokens, bulk=True)
    assert [len(c) for c in asks.chunks] == [BULK_IDS]
    assert asks.single == (tokens[-1][0],)
    assert rounds.asks(tokens[:1], bulk=True) == Asks((), (tokens[0][0],))


def test_a_captcha_polled_again_goes_back_due_at_its_decision() -> None:
    cid, job = token_job(1)
    entry = Entry(cid, job.to_json(), None, 0)
    decision = PollAt(T0 + 7.5, job, poll_errors=2)
    assert rounds.again(entry, decision, T0 + 5) == Again(cid, job.solve_id, 2.5, 2, polls=1)


def test_a_captcha_put_back_counts_its_polls_and_when_the_last_was_answered() -> None:
    cid, job = token_job(1)
    entry = Entry(cid, job.to_json(), T0 + 1.0, 0, polls=4)
    decision = PollAt(T0 + 9.0, job)
    # asked, its budget counting from the reply: one more poll, answered then
    put = rounds.again(entry, decision, T0 + 5, replied_at=T0 + 5.2)
    assert (put.polls, put.asked, put.polled_at) == (5, True, T0 + 5.2)
    # asked, no budget: the round's ask time (None: END_ROUND fills it in)
    put = rounds.again(entry, decision, T0 + 5)
    assert (put.polls, put.asked, put.polled_at) == (5, True, None)
    # held back by a budget, not asked: its count and its last poll stay
    put = rounds.again(entry, decision, T0 + 5, asked=False)
    assert (put.polls, put.asked, put.polled_at) == (4, False, T0 + 1.0)


def test_a_task_budget_holds_a_poll_back_until_its_gap_and_ends_it_once_spent() -> None:
    cid, job = token_job(1)
    budget = rounds.PollBudget(gap_s=2.0, most=120)

    def entry(polled_at: float | None, polls: int) -> Entry:
        return Entry(cid, job.to_json(), polled_at, 0, polls)

    assert rounds.budget_reply(entry(None, 0), budget, T0) is None  # never polled: ask
    assert rounds.budget_reply(entry(T0, 1), budget, T0 + 0.5) == pytest.approx(1.5)
    assert rounds.budget_reply(entry(T0, 1), budget, T0 + 2.0) is None  # the gap has passed
    assert rounds.budget_reply(entry(T0, 119), budget, T0 + 3.0) is None  # its last poll
    spent = rounds.budget_reply(entry(T0, 120), budget, T0 + 3.0)
    assert isinstance(spent, errors.UnsolvableError)
    assert spent.captcha_id == cid and "poll budget" in spent.message
    unlimited = rounds.PollBudget(gap_s=0.0, most=None)
    assert rounds.budget_reply(entry(T0, 10_000), unlimited, T0) is None


def test_only_the_json_kinds_with_limits_have_a_task_budget() -> None:
    assert rounds.budget_of("capmonster") == rounds.PollBudget(gap_s=2.0, most=120)
    capsolver = rounds.budget_of("capsolver")
    assert capsolver is not None and capsolver.most == 120
    assert rounds.budget_of("captchaai") is None  # in.php: budgets per account
    assert rounds.budget_of("2captcha") is None


def test_the_next_round_follows_the_fastest_bulk_pace_less_what_the_round_took() -> None:
    paces = [Pace(True, 0.8), Pace(False, 5.0), Pace(True, 0.3)]
    assert rounds.next_gap(paces, 3, 0.5, took_s=0.1) == 0.3 - 0.1
    assert rounds.next_gap([Pace(False, 5.0)], 1, 0.5, took_s=0.0) == 0.5  # the bulk window
    assert rounds.next_gap([], 0, 0.5, took_s=0.2) == 0.5 - 0.2
    assert rounds.next_gap(paces, 3, 0.5, took_s=2.0) == 0.0  # never negative
    # a full round: more are likely due, the next runs at once
    assert rounds.next_gap(paces, ROUND_MOST, 0.5, took_s=0.0) == 0.0
