"""The map of the package (docs/reference/internals.md, "The package") names every module
and subpackage there is, so that a reader never meets code the map does not mention."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "captcha_tasks"
PAGE = (ROOT / "docs" / "reference" / "internals.md").read_text(encoding="utf-8")


def the_map() -> str:
    section = PAGE.split("## The package\n", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```\n(.*?)```", section, re.S)
    return block


def modules() -> dict[str, set[str]]:
    """Each package folder (``""`` for the top) and the names of its modules and
    subpackages."""
    found: dict[str, set[str]] = {}
    for folder in [PACKAGE, *sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists())]:
        names = {
            p.stem
            for p in folder.iterdir()
            if (p.suffix == ".py" and not p.stem.startswith("__"))
            or (p.is_dir() and (p / "__init__.py").exists())
        }
        found["" if folder == PACKAGE else folder.name] = names
    return found


def test_the_map_names_every_module() -> None:
    words = set(re.findall(r"[a-z_]+", the_map()))
    missing = sorted(
        f"{where}/{name}" if where else name
        for where, names in modules().items()
        for name in names
        if name not in words
    )
    assert not missing, f"the package map leaves out {missing}"


def test_the_map_names_every_subpackage_as_a_folder() -> None:
    block = the_map()
    for where in modules():
        if where:
            assert f"{where}/" in block, where


def test_at_most_twenty_top_level_modules() -> None:
    """A reader takes in the package's top at a glance (issue 29): a package counts as one,
    ``__init__`` not at all."""
    top = modules()[""]
    assert len(top) <= 20, sorted(top)
