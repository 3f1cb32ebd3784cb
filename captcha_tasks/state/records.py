"""A solve's record: which captcha each attempt has at the provider, whether the solve is
over, the right (the *claim*) to call ``in.php`` for its current attempt, and whether its
caller revoked it.

The record makes a redelivered or duplicated message harmless: admission looks at it
before a submit, registration writes the captcha id of the attempt into it before the
claim is given back, and the completion marks it ``done`` exactly once.  A revoked solve
is never submitted again, and its answer, if one comes, is discarded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from .db import Db
from .keys import Keys

T = TypeVar("T")

#: Seconds a revocation is remembered (longer than any solve lives).
REVOKED_TTL_S = 24 * 3600


def record_keys(keys: Keys, solve_id: str) -> dict[str, str]:
    """The keys of ``lib/record.lua`` for one solve (see :mod:`.lua`)."""
    return {
        "record": keys.submission(solve_id),
        "claim": keys.submit_claim(solve_id),
        "revoked": keys.revoked(solve_id),
    }


class Records:
    """Revocations, as callers ask for them."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def revoke(self, solve_ids: Iterable[str]) -> None:
        """Remember that these solves are revoked: one not yet submitted never is, and the
        answer of one at the provider is discarded."""
        pipe = self.db.pipeline()
        for solve_id in solve_ids:
            pipe.set(self.db.keys.revoked(solve_id), "1", ex=REVOKED_TTL_S)
        self._guarded(pipe.execute)

    def revoked(self, solve_id: str) -> bool:
        key, r = self.db.keys.revoked(solve_id), self.db.redis
        return bool(self._guarded(lambda: r.exists(key)))

    def traceless(self, solve_ids: Sequence[str]) -> list[str]:
        """The solves of which Redis holds no trace: no message noted as on its way (the
        limiter's ``requested``), no claim, no record, not parked or owed a message.  Such
        a solve's message was lost (with a master, say) before any worker started it."""
        k = self.db.keys
        pipe = self.db.pipeline()
        for solve_id in solve_ids:
            pipe.exists(k.submission(solve_id), k.submit_claim(solve_id))
            pipe.zscore(k.requested(), solve_id)
            pipe.hexists(k.waiting(), solve_id)
        found = self._guarded(pipe.execute)
        return [
            solve_id
            for n, solve_id in enumerate(solve_ids)
            if not found[3 * n] and found[3 * n + 1] is None and not found[3 * n + 2]
        ]

    def _guarded(self, call: Callable[[], T]) -> T:
        return self.db.guard(call, "solve records are unavailable")
