"""luacheck passes on every ``.lua`` file of the package, and on every script as Redis runs
it (its fragments included: a fragment it calls but does not include is an undefined
name there); and no script takes more than 12 keys.  On CI a missing luacheck fails."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from system_parts import missing

from captcha_tasks.state.lua import LIBRARY, ROOT

pytestmark = pytest.mark.redis

REPO = ROOT.parents[2]
#: The most keys any script may take (issue 29): a script needing more is split.
MOST_KEYS = 12


def luacheck() -> str:
    found = shutil.which("luacheck")
    if found is None:
        missing("luacheck", "the luacheck command is not on PATH (Debian: apt install lua-check)")
    return found


def test_luacheck_passes_on_every_lua_file() -> None:
    files = sorted(str(p.relative_to(REPO)) for p in ROOT.rglob("*.lua"))
    assert len(files) > 40
    done = subprocess.run(
        [luacheck(), "--formatter", "plain", "--codes", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_luacheck_passes_on_every_script_as_redis_runs_it() -> None:
    problems = []
    for name in LIBRARY.names():
        # A file name no files[...] entry of .luacheckrc matches: only Redis's globals hold.
        done = subprocess.run(
            [
                luacheck(),
                "--formatter",
                "plain",
                "--codes",
                "--filename",
                f"assembled/{name}.lua",
                "-",
            ],
            cwd=REPO,
            input=LIBRARY.source(name),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            problems.append(done.stdout + done.stderr)
    assert not problems, "\n".join(problems)


def test_luacheck_reports_what_it_should(tmp_path: Path) -> None:
    """The check can fail: a script calling a fragment it did not include."""
    script = "local K = {\n  a = KEYS[1],\n}\nreturn slots.drop(K.a)\n"
    done = subprocess.run(
        [luacheck(), "--formatter", "plain", "--filename", "assembled/x.lua", "-"],
        cwd=REPO,
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "undefined variable 'slots'" in done.stdout


def test_no_script_takes_more_than_12_keys() -> None:
    counts = {name: LIBRARY.script(name).key_count for name in LIBRARY.names()}
    over = {name: n for name, n in counts.items() if n > MOST_KEYS}
    assert not over, over
    assert max(counts.values()) == MOST_KEYS  # the count is read: some scripts are at it


def test_every_lua_file_is_in_the_wheel() -> None:
    """package-data names them all (tests/dev/test_packaging.py builds the wheel)."""
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"state/lua/*/*.lua"' in pyproject
    assert all(p.parent.parent == ROOT for p in ROOT.rglob("*.lua"))


def test_a_few_lines_of_javascript_assemble_the_same_scripts() -> None:
    """The format is one a second language loads without Python: Node.js assembles every
    script (tests/state/lua_assemble.js) to the SHA1 Python prints, and reads the same
    keys in the same order from its file."""
    node = shutil.which("node")
    if node is None:
        missing("Node.js", "the node command is not on PATH")
    done = subprocess.run(
        [node, str(Path(__file__).with_name("lua_assemble.js")), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assembled = {}
    for line in done.stdout.splitlines():
        sha, name, keys = line.split("  ")
        assembled[name] = (sha, keys)
    expected = {}
    for name in LIBRARY.names():
        script = LIBRARY.script(name)
        keys = [k.name if k.size is None else f"{k.name}*{k.size}" for k in script.keys]
        expected[name] = (script.sha, ",".join(keys))
    assert assembled == expected
