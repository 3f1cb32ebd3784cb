"""``ast.parse`` for the tests that read the package's source.

CPython 3.11 keeps the AST constructor's recursion depth in state every thread shares:
another thread building an AST at the same moment (a background thread of an earlier test
formatting a traceback: 3.11's tracebacks parse the failing line for their carets) makes a
parse fail with ``SystemError: AST constructor recursion depth mismatch`` (CPython issues
gh-106905 and gh-95185).  Parsing is pure, so such a parse is repeated; any other error,
or the same one three times, is raised.
"""

from __future__ import annotations

import ast

#: The interpreter's message for the shared-state race (and only that one is repeated).
RACE = "AST constructor recursion depth mismatch"


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source)``, repeated when another thread's AST building disturbed it."""
    for attempt in range(3):
        try:
            return ast.parse(source, filename)
        except SystemError as exc:
            if RACE not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")
