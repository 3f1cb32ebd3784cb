"""Which of our slots a provider's count of working threads includes.

A provider that sells threads (CaptchaAI) answers ``threadsinfo`` with the threads working
on the key, ours and any other client's.  The threads beyond ours are the other client's,
and the limiter leaves them alone.  Counting a slot as ours that the provider did not
count hands one of the other client's threads to us, and the provider then queues (or
refuses) a submit: so while another client shows, a slot counts as ours only when the
provider surely counted it.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

__all__ = ["counted_as_ours"]


def counted_as_ours(
    held_before: Iterable[str],
    held_after: Iterable[str],
    at_provider_before: Collection[str],
    finished: Collection[str],
    another_shows: bool,
) -> list[str]:
    """The slots (solve ids) to count as ours in a provider's count of working threads.

    ``held_before`` / ``held_after``: the slots we held before the provider was asked and
    after it answered; ``at_provider_before``: the solves whose ``in.php`` the provider had
    answered before it was asked (on the board); ``finished``: the solves the provider had
    finished when it counted; ``another_shows``: the count exceeds our slots, or another
    client was seen before.

    Alone on the key, every slot held before or after the count counts: the count cannot
    exceed ours, and neither a submit still on its way nor one that started while the
    provider counted may pass for another client (a CI run saw a submit made during the
    count leave one of our threads idle as "another client's").  While another client
    shows, a slot whose submit had not been answered before the count may not have
    reached the provider when it counted: it is left out, so the other client's threads
    are over- and never undercounted (the next check corrects an overcount)."""
    if not another_shows:
        held = dict.fromkeys([*held_before, *held_after])
        return [slot for slot in held if slot not in finished]
    return [slot for slot in held_before if slot not in finished and slot in at_provider_before]
