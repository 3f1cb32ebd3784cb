"""No module of the package reaches into another module's private names.

A name that starts with one underscore belongs to the module that defines it. Importing it
elsewhere (``from .board import _Pending``), or reading it through an imported module
(``board._Pending``), couples two modules through something neither promises to keep.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from parsing import parse

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "captcha_tasks"


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_of(path: Path) -> tuple[str, bool]:
    """The dotted name of a file under ROOT, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def absolute(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def crossings(source: str, current: str, is_package: bool = False) -> Iterator[str]:
    """Each private name of another package module that ``source`` imports or reads."""
    tree = parse(source)
    modules: dict[str, str] = {}  # a local name -> the package module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else PACKAGE
        elif isinstance(node, ast.ImportFrom):
            source_module = absolute(node, current, is_package)
            if source_module.split(".")[0] != PACKAGE or source_module == current:
                continue
            for alias in node.names:
                if private(alias.name):
                    yield f"line {node.lineno}: from {source_module} import {alias.name}"
                elif is_module(f"{source_module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{source_module}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and modules[node.value.id] != current
            and private(node.attr)
        ):
            yield f"line {node.lineno}: {node.value.id}.{node.attr}"


def sources() -> list[Path]:
    return sorted((ROOT / PACKAGE).rglob("*.py"))


def test_the_package_imports_no_private_name_across_modules() -> None:
    found = []
    for path in sources():
        current, is_package = module_of(path)
        found += [f"{current}: {c}" for c in crossings(path.read_text(), current, is_package)]
    assert sources(), "no module found: the test looks in the wrong place"
    assert not found, "private names used outside their module:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "from .board import _Pending\n",
        "from captcha_tasks.state.board import _Pending\n",
        "from . import board\nx = board._Pending\n",
        "from . import keys\nkeys._prefix()\n",
        "import captcha_tasks.state.board as b\nb._Pending\n",
    ],
)
def test_the_check_finds_a_crossing(source: str) -> None:
    assert list(crossings(source, "captcha_tasks.state.limiter"))


@pytest.mark.parametrize(
    "source",
    [
        "from .board import Board\n",
        "from .connections import redis_client as _connect\n",
        "from redbeat import RedBeatScheduler as _R\n",
        "import os\nos._exit(1)\n",
        "from . import board\nboard.__name__\n",
    ],
)
def test_the_check_lets_public_names_through(source: str) -> None:
    assert not list(crossings(source, "captcha_tasks.state.limiter"))
