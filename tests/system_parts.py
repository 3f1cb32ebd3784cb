"""Tests that need a system part the machine may lack (a browser, Java, Node.js).

Where it is missing such a test is skipped with the reason, except on CI (``CI`` set),
where that is a failure: the suite must never silently stop testing something.
"""

from __future__ import annotations

import os
import resource
from typing import NoReturn

import pytest


def missing(part: str, problem: str) -> NoReturn:
    """Skip (or, on CI, fail) the current test: ``part`` cannot run because of ``problem``."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the {part} tests, but: {problem}")
    pytest.skip(f"no {part} here: {problem}")


def ensure_open_files(needed: int) -> None:
    """Raise this process's soft limit of open files to ``needed`` (the server holds every
    connection in this process), or fail saying what is missing."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.fail(f"this test needs {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
