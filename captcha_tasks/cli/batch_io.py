"""Batch files for ``captcha-tasks batch``: CSV or JSONL in, JSONL or CSV out.

Input rows carry ``method``, ``sitekey``, ``pageurl`` and optional extra API parameters, and
may name their ``tenant`` and ``lane`` (a row's own wins over ``--tenant`` / ``--lane``).
The whole input is checked before anything is submitted, so a bad line costs nothing;
rows are then read again lazily, so a 100,000-row file is never held in memory.
Output is appended and flushed one line per result, so a crash loses nothing written.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import ValidationError
from ..settings import Settings
from ..worker.callsite import normalize_solve_args

#: The columns of a CSV output, in order (the ones added later at the end, so a script
#: that reads them by position keeps working).  A JSONL line has the same fields, and a
#: failure's ``message``.
OUTPUT_FIELDS = (
    "index",
    "status",
    "token",
    "error",
    "elapsed_s",
    "source",
    "user_agent",
    "provider",
    "captcha_id",
    "method",
    "solved_at",
    "expires_at",
    "site",
)


@dataclass(frozen=True)
class BadLine:
    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def _is_csv(path: Path) -> bool:
    return path.suffix.lower() == ".csv"


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
    """Yield ``(line number, row or BadLine)`` for every data line of the file."""
    with open(path, newline="", encoding="utf-8") as fh:
        yield from (_csv_rows(fh) if _is_csv(path) else _jsonl_rows(fh))


def _csv_rows(fh: IO[str]) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
    reader = csv.DictReader(fh)
    header = reader.fieldnames or []
    for row in reader:
        line = reader.line_num
        if None in row or any(v is None for v in row.values()):
            yield line, BadLine(line, f"expected {len(header)} columns")
            continue
        yield line, {k.strip(): v.strip() for k, v in row.items() if k and v and v.strip()}


def _jsonl_rows(fh: IO[str]) -> Iterator[tuple[int, dict[str, Any] | BadLine]]:
    for line, text in enumerate(fh, start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            yield line, BadLine(line, f"invalid JSON ({exc.msg})")
            continue
        if not isinstance(row, dict):
            yield line, BadLine(line, "expected a JSON object")
            continue
        yield line, row


def check_input(
    path: Path, settings: Settings, route: dict[str, str] | None = None
) -> tuple[int, list[BadLine]]:
    """Validate every row (as ``solve`` will, with the ``route`` defaults a row may
    override, against ``settings``' tenants); returns the row count and every bad line."""
    disguised = _csv_named_otherwise(path)
    if disguised is not None:
        return 0, [disguised]
    count, bad = 0, []
    for line, row in read_rows(path):
        count += 1
        if isinstance(row, BadLine):
            bad.append(row)
            continue
        try:
            normalize_solve_args((), {**(route or {}), **_solve_args(row)}, settings)
        except (ValidationError, TypeError) as exc:
            bad.append(BadLine(line, str(exc)))
    return count, bad


def _csv_named_otherwise(path: Path) -> BadLine | None:
    """A CSV file under another name (``tasks.txt``) is read as JSON lines, so every line
    would be "invalid JSON": say once what it is instead."""
    if _is_csv(path):
        return None
    with open(path, encoding="utf-8") as fh:
        first = next((text for text in fh if text.strip()), "")
    if first.lstrip().startswith("{") or "," not in first or "method" not in first:
        return None
    return BadLine(
        1,
        f"this looks like a CSV header, but {path.name} is read as JSON lines: the format is "
        "chosen by the file name, so rename it to .csv (JSON lines: any other name)",
    )


def _solve_args(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "index"}


def tasks(
    path: Path, skip: set[int], route: dict[str, str] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, solve kwargs)`` for every row whose index is not in ``skip``; ``route``
    (``tenant``, ``lane``) fills in what a row does not name."""
    index = -1
    for _line, row in read_rows(path):
        index += 1
        if index in skip or isinstance(row, BadLine):
            continue
        yield index, {**(route or {}), **_solve_args(row)}


def solved_indexes(path: Path) -> set[int]:
    """Indexes that have a ``solved`` line in a previous output (JSONL or CSV)."""
    if not path.exists():
        return set()
    with open(path, newline="", encoding="utf-8") as fh:
        rows: Iterator[Any] = (
            csv.DictReader(fh) if _is_csv(path) else (_loads(t) for t in fh if t.strip())
        )
        return {int(r["index"]) for r in rows if r and r.get("status") == "solved"}


def _loads(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None  # a line cut short by a crash: that index simply runs again
    return value if isinstance(value, dict) else None


class ResultWriter:
    """Appends one line per result (JSONL, or CSV by extension) and flushes it."""

    def __init__(self, target: Path | None, stdout: IO[str]) -> None:
        self.path = target
        self._fields: tuple[str, ...] = OUTPUT_FIELDS
        if target is None:
            self._fh, self._csv = stdout, False
        else:
            new = not target.exists() or target.stat().st_size == 0
            self._csv = _is_csv(target)
            # Appending to an output of an earlier version: its columns, not ours.
            self._fields = OUTPUT_FIELDS if new or not self._csv else _header(target)
            self._fh = open(target, "a", newline="", encoding="utf-8")  # noqa: SIM115
        self._writer = csv.DictWriter(self._fh, self._fields) if self._csv else None
        if self._writer is not None and new:
            self._writer.writeheader()

    def write(self, outcome: dict[str, Any]) -> None:
        row = output_row(outcome)
        if self._writer is not None:
            self._writer.writerow({k: _cell(row.get(k)) for k in self._fields})
        else:
            self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self.path is not None:
            self._fh.close()


def output_row(outcome: dict[str, Any]) -> dict[str, Any]:
    """One output line of a batch result: the outcome's shape, with its ``index``."""
    row: dict[str, Any] = {"index": outcome["index"], "status": outcome["status"]}
    row["method"] = outcome.get("method")
    if outcome["status"] == "solved":
        row["token"] = outcome["token"]
        if outcome.get("user_agent"):
            row["user_agent"] = outcome["user_agent"]
        # Tokens live minutes (reCAPTCHA about 120 s): when it was solved and how long it
        # may still be used.
        row["solved_at"] = outcome.get("solved_at")
        row["expires_at"] = outcome.get("expires_at")
        # The site the router sent it for: with provider and captcha_id, what report() needs.
        row["site"] = outcome.get("site")
    else:
        row["error"] = outcome["error"]
        row["message"] = outcome.get("message")
    row["elapsed_s"] = outcome.get("elapsed_s")
    row["source"] = outcome.get("source")
    # The pair names the captcha (two providers may issue the same id): for reports.
    row["provider"] = outcome.get("provider")
    row["captcha_id"] = outcome.get("captcha_id")
    return row


def _header(path: Path) -> tuple[str, ...]:
    with open(path, newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh), None)
    return tuple(header) if header else OUTPUT_FIELDS


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, dict | list) else value
