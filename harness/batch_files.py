"""Input files for ``captcha-tasks batch`` in tests and benchmarks."""

from __future__ import annotations

import json
from pathlib import Path


def write_tasks(path: Path, count: int, pageurl: str) -> Path:
    """``count`` Turnstile tasks for ``captcha-tasks batch``, each with a site key of its own."""
    lines = (
        json.dumps({"method": "turnstile", "sitekey": f"k{i}", "pageurl": pageurl}) + "\n"
        for i in range(count)
    )
    path.write_text("".join(lines))
    return path
