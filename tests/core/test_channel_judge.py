"""The callback channel's judgement (captcha_tasks.core.channel): what the answers heard
say of a provider's callbacks, as plain values."""

from __future__ import annotations

import pytest

from captcha_tasks.core import channel as ch
from captcha_tasks.core.channel import DEGRADED, DOWN, UP, Channel

pytestmark = pytest.mark.unit


def judged(state: str = UP, share: float = 1.0, **figures: int) -> str:
    """The state the channel is in after judging it."""
    switch = ch.judge_channel(Channel(state, share, **figures))
    return state if switch is None else switch.to


def test_callbacks_that_stop_put_the_channel_down_from_any_state() -> None:
    stopped = ch.CHANNEL_STOPPED
    for state in (UP, DEGRADED):
        assert judged(state, 0.9, misses=stopped - 1) == state
        assert judged(state, 0.9, misses=stopped) == DOWN
    assert ch.judge_channel(Channel(DOWN, 0.0, misses=stopped + 5)) is None


def test_a_down_channel_comes_back_degraded_when_callbacks_arrive_in_a_row() -> None:
    assert judged(DOWN, 0.3, hits=ch.CHANNEL_BACK - 1) == DOWN
    back = ch.judge_channel(Channel(DOWN, 0.3, hits=ch.CHANNEL_BACK))
    # the share it had (of the time it was down) is not held against it
    assert back == ch.Switch(DEGRADED, ch.CHANNEL_BACK_SHARE)
    assert judged(DEGRADED, ch.CHANNEL_BACK_SHARE) == DEGRADED


def test_the_share_of_answers_by_callback_moves_the_channel_with_a_band_between() -> None:
    leave, enter, settle = ch.CHANNEL_LEAVE_UP, ch.CHANNEL_ENTER_UP, ch.CHANNEL_SETTLE
    assert judged(UP, leave) == UP
    assert judged(UP, leave - 0.01) == DEGRADED
    assert judged(DEGRADED, enter - 0.01, since=settle) == DEGRADED  # the band: it stays
    assert judged(UP, enter - 0.01) == UP
    assert judged(DEGRADED, enter, since=settle - 1) == DEGRADED  # not settled yet
    assert judged(DEGRADED, enter, since=settle) == UP
