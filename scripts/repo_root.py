"""Puts the repository's root on ``sys.path``: the benchmark scripts import the test
harness (``harness/``, which the wheel leaves out) from there.  Import it before
``harness``: ``import repo_root  # noqa: F401``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
