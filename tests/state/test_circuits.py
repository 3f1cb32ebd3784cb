"""Provider circuits against a real Redis server: consecutive transport failures open one,
an empty balance or a refused key at once, probes come due on a back-off and a good answer
closes it; each transition is reported to the one caller that made it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from captcha_tasks.state.circuits import PROBE_MAX_S, Circuits
from captcha_tasks.state.db import Db
from captcha_tasks.state.keys import Keys

pytestmark = pytest.mark.redis


def make(redis_conn: Any, keys: Keys, threshold: int = 3) -> Circuits:
    return Circuits(Db(redis_conn, keys), ["main", "backup"], threshold)


def test_consecutive_transport_failures_open_it_once(redis_conn: Any, keys: Keys) -> None:
    circuits = make(redis_conn, keys)
    first, second = (circuits.failed("main", "ERROR_TRANSPORT", "soft") for _ in range(2))
    assert not first.open and not second.open
    circuits.succeeded("main")  # an answer in between: they were not consecutive
    assert circuits.read()["main"].failures == 0
    found = [circuits.failed("main", "ERROR_TRANSPORT", "soft") for _ in range(4)]
    assert [(f.open, f.opened) for f in found] == [
        (False, False), (False, False), (True, True), (True, False),
    ]  # fmt: skip
    main = circuits.read()["main"]
    assert (main.open, main.why, main.code, main.up) == (True, "soft", "ERROR_TRANSPORT", False)
    assert circuits.read()["backup"].up  # one provider's circuit only


def test_an_empty_balance_or_a_refused_key_opens_it_at_once(redis_conn: Any, keys: Keys) -> None:
    circuits = make(redis_conn, keys)
    assert circuits.failed("main", "ERROR_ZERO_BALANCE", "balance").opened
    assert circuits.failed("backup", "ERROR_WRONG_USER_KEY", "key").opened
    view = circuits.read()
    assert (view["main"].why, view["backup"].why) == ("balance", "key")


def test_probes_come_due_one_at_a_time_on_a_back_off(
    redis_conn: Any, keys: Keys, move_clock: Callable[[float], None], monkeypatch: Any
) -> None:
    # seconds, not the default's one: nothing may come due while the test runs its lines
    monkeypatch.setattr("captcha_tasks.state.circuits.PROBE_FIRST_S", 5.0)
    assert PROBE_MAX_S >= 2 * 5.0
    circuits = make(redis_conn, keys)
    circuits.failed("main", "ERROR_ZERO_BALANCE", "balance")
    assert circuits.probes_due() == []  # not before the first probe's time
    move_clock(5.1)
    assert circuits.probes_due() == ["main"]
    assert circuits.probes_due() == []  # taken: the next one waits twice as long
    probe_at = circuits.read()["main"].probe_at
    opened_at = circuits.read()["main"].opened_at
    assert probe_at is not None and opened_at is not None
    assert probe_at - opened_at >= 2 * 5.0


def test_a_good_answer_closes_it_and_a_bad_one_does_not(redis_conn: Any, keys: Keys) -> None:
    circuits = make(redis_conn, keys)
    circuits.failed("main", "ERROR_ZERO_BALANCE", "balance")
    assert not circuits.probed("main", False, balance=0.0, code="ERROR_ZERO_BALANCE")
    assert circuits.read()["main"].open
    assert circuits.probed("main", True, balance=12.5)
    assert not circuits.probed("main", True, balance=12.5)  # closed already: no second line
    main = circuits.read()["main"]
    assert (main.up, main.balance, main.failures) == (True, 12.5, 0)
    assert main.closed_at is not None


def test_a_view_is_reused_briefly_and_a_reset_puts_providers_back(
    redis_conn: Any, keys: Keys
) -> None:
    now = [100.0]
    circuits = Circuits(Db(redis_conn, keys), ["main"], 1, clock=lambda: now[0])
    assert circuits.view()["main"].up
    other = make(redis_conn, keys, threshold=1)  # another process opens it
    other.failed("main", "ERROR_TRANSPORT", "soft")
    assert circuits.view()["main"].up  # what this process read a moment ago
    now[0] += 1.0
    assert not circuits.view()["main"].up
    circuits.reset()
    assert circuits.view()["main"].up
