"""A solve's record: which captcha each attempt has at the provider, whether the solve is
over, and the right (the *claim*) to call ``in.php`` for its current attempt.

The record makes a redelivered or duplicated message harmless: admission looks at it
before a submit, registration writes the captcha id of the attempt into it before the
claim is given back, and the completion marks it ``done`` exactly once.
"""

from __future__ import annotations

from ..keys import Keys
from .lua import Lib

#: Lua: the solve's record (``K.record``: hash attempt, captcha_id, done) and its submit
#: claim (``K.claim``: string with a TTL, the id of the message holding it).
RECORD = Lib(
    name="RECORD",
    keys=("record", "claim"),
    source="""
-- True when the solve is over, or this attempt (or a later one) was submitted already.
local function record_passed(K, attempt)
  local record = redis.call('HMGET', K.record, 'done', 'attempt')
  if record[1] then return true end
  return record[2] ~= false and tonumber(record[2]) >= attempt
end
-- The attempt's captcha is at the provider: remember it, and give the claim back.
local function record_submitted(K, attempt, captcha_id, ttl_s)
  redis.call('HSET', K.record, 'attempt', attempt, 'captcha_id', captcha_id)
  redis.call('EXPIRE', K.record, ttl_s)
  redis.call('DEL', K.claim)
end
-- End the solve, once: false when it had ended already.
local function record_close(K, ttl_s)
  if redis.call('HSETNX', K.record, 'done', '1') == 0 then return false end
  redis.call('EXPIRE', K.record, ttl_s)
  redis.call('DEL', K.claim)
  return true
end
""",
)


def record_keys(keys: Keys, solve_id: str) -> dict[str, str]:
    """The keys of :data:`RECORD` for one solve."""
    return {"record": keys.submission(solve_id), "claim": keys.submit_claim(solve_id)}
