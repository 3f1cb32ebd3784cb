"""The bridge's feedback side: ``KAFKA_FEEDBACK_TOPIC`` in, ``report()`` out.

    consume ──► parse ──► the result it names ──► report() ──► finished ──► commit
                 │          (its fields, or the one          (the report task is queued in
                 ▼           published for its task_id)       Redis, as report() returns)
             dead letter ◄── not readable, no such result, a provider not configured

* A feedback message reaches the provider that solved its captcha, on that provider's own
  report method, and counts for the site's acceptance: it takes the path of
  ``captcha_tasks.report``.
* **Offsets**: a message is finished once its report task is queued in Redis (or its dead
  letter acknowledged), and the bridge commits only finished messages: a crash before
  then delivers it again.
* **Copies**: a captcha's report is recorded once (for ``KAFKA_RESULT_TTL``); a
  redelivered or repeated message on the same captcha is skipped and counted
  (``feedback_repeated``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ..errors import BadMessage, ValidationError
from ..worker.tasks import report
from .claims import ClaimStore
from .messages import Feedback, Source, dead_letter, parse_feedback
from .offsets import OffsetTracker, Pending

log = logging.getLogger(__name__)

#: ``publish(source, value, pending, letter)``: send the dead letter of the message at
#: ``source``, and finish ``pending`` once the brokers acknowledged it.
Publish = Callable[[Source, bytes | None, Pending, dict[str, Any]], None]


def result_of(feedback: Feedback, published: str | None) -> dict[str, Any]:
    """The result ``report()`` is given for ``feedback``: the fields the message carries,
    else the result published for its ``task_id`` (``published``, JSON or None).  Raises
    :class:`BadMessage` when there is no solved result to report on."""
    if feedback.result is not None:
        return dict(feedback.result)
    if published is None:
        raise BadMessage(
            f"no result of task {feedback.task_id} is kept (unknown, not answered yet, or "
            "older than KAFKA_RESULT_TTL): name it by its captcha_id, provider, method, site",
            "ERROR_NO_SUCH_CAPCHA_ID",
        )
    result = json.loads(published)
    if result.get("status") != "solved" or not result.get("captcha_id"):
        raise BadMessage(
            f"task {feedback.task_id} failed: it has no token to report on",
            "ERROR_NO_SUCH_CAPCHA_ID",
        )
    return {k: result[k] for k in ("captcha_id", "provider", "method", "site") if k in result}


class FeedbackReader:
    """What the bridge does with the messages of the feedback topic."""

    def __init__(self, topic: str, claims: ClaimStore, publish: Publish, primary: str) -> None:
        self.topic = topic
        #: The provider a result that names none was solved by.
        self.primary = primary
        self.claims = claims
        self.publish = publish
        self.tracker = OffsetTracker()
        self.assigned: set[int] = set()

    def handle(self, number: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Record one feedback message (or dead-letter it)."""
        source = Source(self.topic, number, offset, key)
        pending = self.tracker.track(number, offset)
        feedback: Feedback | None = None
        try:
            feedback = parse_feedback(value)
            result = result_of(feedback, self._published(feedback))
            self._report(result, feedback)
        except ValidationError as exc:  # a BadMessage, or what report() refused
            task_id = feedback.task_id if feedback else None
            log.warning("feedback %s[%d]@%d refused: %s", self.topic, number, offset, exc.message)
            letter = dead_letter(exc.message, exc.code, source, value, task_id=task_id)
            self.claims.count("feedback_dead_letters")
            self.publish(source, value, pending, letter)
            return
        self.tracker.finish(pending)

    def _published(self, feedback: Feedback) -> str | None:
        if feedback.result is not None or feedback.task_id is None:
            return None
        return self.claims.published(feedback.task_id)

    def _report(self, result: dict[str, Any], feedback: Feedback) -> None:
        provider, captcha_id = str(result.get("provider") or self.primary), result["captcha_id"]
        if self.claims.feedback_recorded(provider, captcha_id):
            self.claims.count("feedback_repeated")
            return
        # A provider no longer configured is refused here (ValidationError): a dead letter.
        report(result, good=feedback.good, score=feedback.score)
        # After the report is queued: a crash in between reports it again, never not at all.
        self.claims.record_feedback(provider, captcha_id)
        self.claims.count("feedback_good" if feedback.good else "feedback_bad")
