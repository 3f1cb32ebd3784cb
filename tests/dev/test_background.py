"""Run in the background as ``./scripts/test &`` or ``nohup ./scripts/test &`` (SIGINT
ignored, as a non-interactive shell starts a background job), the tests that stop a process
with Ctrl-C still pass, and leave no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
#: The test that stops ``captcha-tasks batch`` with SIGINT (it starts two workers).
CTRL_C_TEST = "tests/app/test_batch.py::test_ctrl_c_keeps_lines_and_prints_how_to_resume"


def processes_with(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (every one the run started inherits it)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue  # exited while we looked, or not ours to read
    return found


def test_ctrl_c_tests_pass_with_sigint_ignored_and_leak_nothing(
    tmp_path: Path, output_dir: Path
) -> None:
    marker = f"CT_BACKGROUND_RUN={os.getpid()}-{tmp_path.name}"
    name, _, value = marker.partition("=")
    kept = output_dir / "background-run"  # kept with the run's other logs
    env = {**os.environ, "TEST_OUTPUT_DIR": str(kept), name: value}
    # `trap "" INT` is what a shell does to a background job: SIGINT ignored, inherited.
    script = 'trap "" INT; exec "$0" -m pytest -q -p no:cacheprovider "$1"'
    done = subprocess.run(
        ["bash", "-c", script, sys.executable, CTRL_C_TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    kept.mkdir(parents=True, exist_ok=True)
    (kept / "pytest.out").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    assert done.returncode == 0, f"all of it in {kept / 'pytest.out'}:\n" + done.stdout[-4000:]
    assert "1 passed" in done.stdout
    assert processes_with(marker) == []
