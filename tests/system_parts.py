"""Tests that need a system part the machine may lack (a browser, Java, Node.js).

Where it is missing such a test is skipped with the reason, except on CI (``CI`` set),
where that is a failure: the suite must never silently stop testing something.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(part: str, problem: str) -> NoReturn:
    """Skip (or, on CI, fail) the current test: ``part`` cannot run because of ``problem``."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the {part} tests, but: {problem}")
    pytest.skip(f"no {part} here: {problem}")
