"""Which slots count as ours in a provider's count of working threads
(:func:`captcha_tasks.core.threads.counted_as_ours`)."""

from __future__ import annotations

import pytest

from captcha_tasks.core.threads import counted_as_ours

pytestmark = pytest.mark.unit


def test_alone_every_slot_held_counts_but_the_finished() -> None:
    # a submit still on its way counts: alone, it must not pass for another client
    ours = counted_as_ours(["a", "b", "c"], ["a", "c"], {"a"}, {"b"}, another_shows=False)
    assert ours == ["a", "c"]


def test_alone_a_slot_taken_while_the_provider_counted_counts() -> None:
    # "d" was taken after the slots were read and before the provider counted: its
    # captcha may be in the count, and alone on the key it is ours (a CI run saw it
    # taken for another client's thread, and one of ours left idle)
    assert counted_as_ours(["a"], ["a", "d"], {"a"}, set(), another_shows=False) == ["a", "d"]


def test_with_another_client_a_submit_not_yet_answered_is_not_ours() -> None:
    # "c" holds a slot, but its in.php may not have reached the provider when it counted:
    # counting it hands one of the other client's threads to us (a CI run saw the
    # provider queue three submits that way)
    assert counted_as_ours(
        ["a", "b", "c"], ["a", "b", "c"], {"a", "b"}, set(), another_shows=True
    ) == ["a", "b"]


def test_with_another_client_the_finished_are_left_out_too() -> None:
    assert counted_as_ours(["a", "b"], ["a", "b"], {"a", "b"}, {"a"}, another_shows=True) == ["b"]


def test_a_solve_on_the_board_but_not_held_before_is_not_ours() -> None:
    # taken after held_before was read: the Lua counts only slots held both then and now
    assert counted_as_ours(["a"], ["a", "z"], {"a", "z"}, set(), another_shows=True) == ["a"]
