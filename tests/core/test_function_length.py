"""No function of the package (``captcha_tasks/``) is over 60 lines, and no module of the
worker over 400 (issue 29): a reader sees each function whole, and each part of the adapter
reads as one concern.  A click command's options count as its decorators: a long list of
them is a module-level list (``serving.options.option_group``).

Measured with ``ast`` from a function's first decorator to its last line, docstring and
comments included; a nested function or a method counts on its own, and inside its
outer one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from parsing import parse

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60
MODULE_LIMIT = 400


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int]]:
    """Each function of ``source`` longer than ``limit`` lines, with its length."""
    found = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - first + 1
            if length > limit:
                found.append((node.name, length))
    return found


def test_no_function_of_the_package_is_over_60_lines() -> None:
    files = sorted((ROOT / "captcha_tasks").rglob("*.py"))
    assert len(files) > 100, len(files)
    found = {
        f"{path.relative_to(ROOT)}:{name}": length
        for path in files
        for name, length in long_functions(path.read_text(encoding="utf-8"))
    }
    assert found == {}


def test_no_module_of_the_worker_is_over_400_lines() -> None:
    sizes = {
        p.name: len(p.read_text(encoding="utf-8").splitlines())
        for p in sorted((ROOT / "captcha_tasks" / "worker").glob("*.py"))
    }
    assert "adapter.py" in sizes
    assert {name: n for name, n in sizes.items() if n > MODULE_LIMIT} == {}


def _function(name: str, lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}() -> None:\n{body}"


def test_the_measure_finds_what_is_too_long_and_leaves_what_fits() -> None:
    fits = _function("fits", LIMIT)
    assert long_functions(fits) == []
    assert long_functions(_function("over", LIMIT + 1)) == [("over", LIMIT + 1)]
    # decorators count: they are part of what the reader has to take in
    assert long_functions("@decorated\n" + fits) == [("fits", LIMIT + 1)]
    # a method, and a function nested in a short one
    method = "class Runner:\n" + _function("method", LIMIT + 5, indent="    ")
    assert long_functions(method) == [("method", LIMIT + 5)]
    nested = "def outer() -> None:\n" + _function("inner", LIMIT + 1, indent="    ")
    assert dict(long_functions(nested)) == {"outer": LIMIT + 2, "inner": LIMIT + 1}
