"""What the API can say about one captcha, as values: its answer, or "not ready yet".

The API client (:mod:`captcha_tasks.providers.inphp`) turns replies into these; the steps
(:mod:`.steps`) decide on them.  "Not ready yet" is the value :data:`NOT_READY`, never an
exception shared with failures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .. import errors


class NotReady(enum.Enum):
    """The type of :data:`NOT_READY` (an enum of one value, so type checkers can tell it
    from an answer)."""

    NOT_READY = "CAPCHA_NOT_READY"

    def __repr__(self) -> str:
        return "NOT_READY"


#: The answer is not ready yet: poll again later.
NOT_READY = NotReady.NOT_READY

Token = str | dict[str, Any] | list[Any]


@dataclass(frozen=True)
class Answer:
    """A solved captcha's answer as the API sent it (``result``, else ``request``), the
    user agent the API says it must be used with (None when it names none), and what it
    cost where the API says (the JSON family's ``cost``)."""

    value: Token
    user_agent: str | None = None
    cost: float | None = None


#: What a poll or a callback read about a captcha: its answer, not ready, or the error
#: the API answered for it.
Reading = Answer | NotReady | errors.CaptchaTasksError
