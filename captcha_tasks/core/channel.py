"""A provider's callback channel as values: how its callbacks are doing, and when its
state switches.

Every answer of a captcha that asked for a callback is *heard*, with the way it came
(:class:`Heard`):

* ``callback``: its callback brought it;
* ``poll``: a poll found it first (its callback was lost, or is late);
* ``late``: its callback came after a poll had found the answer (late, not lost).

What the answers say (:class:`Channel`: the recent share that came by callback, the
answers by poll and by callback in a row, the answers since the state last switched) is
kept in Redis (:mod:`captcha_tasks.state.channel`), shared by every worker and receiver;
which state that is, ``up``, ``degraded`` or ``down``, is decided here
(:func:`judge_channel`), and the steps poll by it (:mod:`.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The channel's states: callbacks are waited for (``up``), polls start early because many
#: are lost (``degraded``), or captchas are polled as if callbacks were off (``down``).
UP, DEGRADED, DOWN = "up", "degraded", "down"
STATES = (UP, DEGRADED, DOWN)

#: How far one answer moves the channel's share of answers that came by callback.
CHANNEL_WEIGHT = 0.1
#: Below this share an ``up`` channel is ``degraded``; at this one a degraded one is up
#: again, once it has heard :data:`CHANNEL_SETTLE` answers since it switched.
CHANNEL_LEAVE_UP = 0.85
CHANNEL_ENTER_UP = 0.95
CHANNEL_SETTLE = 20
#: Answers in a row that polls found, no callback between: callbacks stopped (``down``).
CHANNEL_STOPPED = 8
#: Callbacks in a row that bring a ``down`` channel back (``degraded``, starting at
#: :data:`CHANNEL_BACK_SHARE`: short of up, until the callbacks prove themselves).
CHANNEL_BACK = 5
CHANNEL_BACK_SHARE = 0.9

By = Literal["callback", "poll", "late"]


@dataclass(frozen=True)
class Heard:
    """An answer of captcha ``captcha_id`` (which asked for a callback) came ``by`` this
    way, ``late_s`` seconds after it was (likely) ready; ``overdue``: after its callback
    was due."""

    by: By
    captcha_id: str
    late_s: float = 0.0
    overdue: bool = False


@dataclass(frozen=True)
class Channel:
    """What recent answers say of the provider's callbacks (see the module docstring)."""

    state: str = UP
    #: Recent share of answers that came by callback (1.0 before any was heard).
    share: float = 1.0
    #: Answers in a row that a poll found / that a callback brought.
    misses: int = 0
    hits: int = 0
    #: Answers heard since the state last switched.
    since: int = 0


@dataclass(frozen=True)
class Switch:
    """Switch the callback channel to state ``to`` (its share starting at ``share``)."""

    to: str
    share: float | None = None


def judge_channel(channel: Channel) -> Switch | None:
    """What the answers heard say of the provider's callbacks: the state to switch to, or
    None to stay.

    * :data:`CHANNEL_STOPPED` answers in a row found by polls: callbacks stopped
      (``down``), whatever the state;
    * ``down`` stays down until :data:`CHANNEL_BACK` callbacks in a row came (``degraded``);
    * otherwise the share of answers by callback decides, with a band between
      :data:`CHANNEL_LEAVE_UP` and :data:`CHANNEL_ENTER_UP` where the state stays, so a
      steady loss does not flap it.
    """
    state = channel.state
    if channel.misses >= CHANNEL_STOPPED:
        return None if state == DOWN else Switch(DOWN)
    if state == DOWN:
        return Switch(DEGRADED, CHANNEL_BACK_SHARE) if channel.hits >= CHANNEL_BACK else None
    if channel.share < CHANNEL_LEAVE_UP:
        return None if state == DEGRADED else Switch(DEGRADED)
    settled = state == UP or channel.since >= CHANNEL_SETTLE
    if channel.share >= CHANNEL_ENTER_UP and settled:
        return None if state == UP else Switch(UP)
    return None
