"""The npm package ``captcha-tasks`` (``clients/node``): its version is the Python
package's, and its tarball ships the Python package's Lua scripts byte for byte (copied
in by its ``prepack``), its code and types, and nothing else."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
from npm_cache import missing_node
from system_parts import missing

from captcha_tasks.state.lua import LIBRARY, ROOT

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "clients" / "node"


@pytest.mark.unit
def test_npm_version_is_the_python_version() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package = json.loads((PACKAGE / "package.json").read_text())
    lock = json.loads((PACKAGE / "package-lock.json").read_text())
    assert package["version"] == pyproject["project"]["version"]
    assert lock["version"] == package["version"], "package-lock.json: run npm install"
    assert package["name"] == lock["name"] == "captcha-tasks"


def _pack(tmp_path: Path) -> tuple[list[str], Path]:
    """``npm pack`` of a copy of the package laid out as in the repository (its prepack
    reads ``../../captcha_tasks/state/lua``): the dry run's file list, and the tarball."""
    copy = tmp_path / "repo"
    shutil.copytree(
        PACKAGE,
        copy / "clients" / "node",
        ignore=shutil.ignore_patterns("node_modules", "lua", "*.tgz"),
    )
    shutil.copytree(
        ROOT,
        copy / "captcha_tasks" / "state" / "lua",
        ignore=shutil.ignore_patterns("*.py", "__pycache__"),
    )
    npm = shutil.which("npm") or "npm"
    folder = copy / "clients" / "node"
    dry = subprocess.run(
        [npm, "pack", "--dry-run", "--json"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    listed = sorted(entry["path"] for entry in json.loads(dry.stdout)[0]["files"])
    out = tmp_path / "out"
    out.mkdir()
    real = subprocess.run(
        [npm, "pack", "--pack-destination", str(out)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert real.returncode == 0, real.stderr[-3000:]
    assert not (folder / "lua").exists(), "postpack removes the copy"
    return listed, next(out.glob("*.tgz"))


@pytest.mark.system
def test_npm_pack_ships_the_python_lua_and_nothing_else(tmp_path: Path) -> None:
    problem = missing_node()
    if problem:
        missing("Node.js", problem)
    listed, tarball = _pack(tmp_path)
    lua = sorted(f"lua/{path.relative_to(ROOT).as_posix()}" for path in ROOT.glob("*/*.lua"))
    assert [p for p in listed if p.startswith("lua/")] == lua
    top = {p.split("/")[0] for p in listed}
    assert top == {"README.md", "index.d.ts", "index.js", "lib", "lua", "package.json"}
    with tarfile.open(tarball) as tar:
        for name in lua:
            member = tar.extractfile(f"package/{name}")
            assert member is not None, name
            shipped = member.read().decode()
            assert shipped == LIBRARY.text(name.removeprefix("lua/")), f"{name} differs"
