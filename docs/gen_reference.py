"""The reference pages, written from the code at every ``mkdocs build`` (mkdocs-gen-files),
so they cannot drift from it: settings from the fields of ``captcha_tasks.settings.Settings``
and its concerns (``documented()``: each field's environment variable, default, type and
meaning are in its metadata), error
codes from ``captcha_tasks.errors``, the JSON Schemas from ``captcha_tasks.schemas`` and the
public import paths from ``captcha_tasks.public``, where they are listed (and pinned by
tests/core/test_public_api.py)."""

from __future__ import annotations

import json
from typing import Any

import mkdocs_gen_files

import captcha_tasks
from captcha_tasks import errors, public, schemas
from captcha_tasks.settings import SettingDoc, concerns, documented


def markdown(text: str) -> str:
    """Docstrings and settings' meanings use reStructuredText literals; the site, Markdown."""
    return text.replace("``", "`")


def shown(default: Any) -> str:
    if default is None:
        return "unset"
    if default in ("", (), {}):
        return "—"
    if isinstance(default, bool):
        return "`1`" if default else "`0`"
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    if isinstance(default, dict):
        return f"`{json.dumps(default)}`"
    return f"`{default}`"


def _row(doc: SettingDoc) -> str:
    # Python-Markdown's tables split no cell at a "|" inside backticks (`str | None`).
    python = f"`settings.{doc.path}`: `{doc.type}`"
    return f"| `{doc.variable}` | {shown(doc.default)} | {markdown(doc.meaning)} | {python} |"


def _concern(cls: type) -> str:
    about = markdown(" ".join((cls.__doc__ or "").split()))  # names its attribute
    return f"- `captcha_tasks.settings.{cls.__name__}`: {about}"


def settings_page() -> str:
    # One table under the page's title, no heading per concern: the search finds a
    # variable's row on this page first (a section per concern ranked other pages above).
    rows = "\n".join(_row(doc) for doc in documented())
    kinds = "\n".join(_concern(cls) for _, cls in concerns())
    return f"""# Settings reference

Every environment variable captcha-tasks reads, with its default and meaning, generated from
the fields of `captcha_tasks.settings.Settings` when this site was built. How settings are
read and checked: [Settings](../operations/settings.md).

In Python the settings are one frozen object made of one frozen object per concern (the last
column says where each setting is; `settings` is an app's, `app.settings()`):

{kinds}

| variable | default | meaning | in Python |
|---|---|---|---|
{rows}

Flower reads its own `FLOWER_BASIC_AUTH` (`user:password[,user2:password2]`); captcha-tasks
refuses to start Flower without credentials unless `CAPTCHAAI_FLOWER_NO_AUTH=1`.
"""


def _tree_lines(cls: type[errors.CaptchaTasksError], depth: int = 0) -> list[str]:
    lines = [f"{'    ' * depth}{cls.__name__} ({cls.default_code})"]
    for sub in cls.__subclasses__():
        if sub.__module__ == errors.__name__:
            lines += _tree_lines(sub, depth + 1)
    return lines


def _doc(cls: type) -> str:
    return markdown(" ".join((cls.__doc__ or "").split()))


def errors_page() -> str:
    codes = errors.codes()
    classes = sorted({cls for cls in codes.values()}, key=lambda c: _tree_order().index(c))
    sections = []
    for cls in classes:
        own = [code for code, c in codes.items() if c is cls]
        hints = [f"`{code}`: {errors.HINTS[code]}." for code in own if code in errors.HINTS]
        parent = cls.__mro__[1].__name__
        sections.append(
            f"### {cls.__name__}\n\n"
            f"`captcha_tasks.errors.{cls.__name__}`, a `{parent}`. "
            f"Codes: {', '.join(f'`{c}`' for c in own)}.\n\n{_doc(cls)}\n\n"
            + "".join(f"- {hint}\n" for hint in hints)
        )
    table = "\n".join(
        f"| `{code}` | [`{cls.__name__}`](#{cls.__name__.lower()}) | {_kind(cls)} |"
        for code, cls in sorted(codes.items())
    )
    tree = "\n".join(_tree_lines(errors.CaptchaTasksError))
    return f"""# Error codes

Every exception captcha-tasks raises carries `code` (the API's error code, or one of ours)
and `captcha_id` when one is known; a failed outcome has the same code in `error`. Generated
from `captcha_tasks/errors.py` when this site was built.

```
{tree}
```

## Every code

| code | exception | what happens |
|---|---|---|
{table}

## What to do, by exception

{"".join(sections)}"""


def _tree_order() -> list[type[errors.CaptchaTasksError]]:
    order: list[type[errors.CaptchaTasksError]] = []

    def walk(cls: type[errors.CaptchaTasksError]) -> None:
        order.append(cls)
        for sub in cls.__subclasses__():
            walk(sub)

    walk(errors.CaptchaTasksError)
    return order


def _kind(cls: type) -> str:
    for family, what in (
        (errors.ConfigurationError, "fix the environment"),
        (errors.ValidationError, "fix the call; nothing queued"),
        (errors.RetryableError, "retried for you"),
        (errors.ResubmitError, "a new captcha is submitted for you"),
        (errors.FatalError, "fails at once"),
        (errors.GaveUpError, "a budget ran out"),
    ):
        if issubclass(cls, family):
            return what
    return "the root of every error"


def schemas_page() -> str:
    parts = []
    for name in schemas.names():
        schema = schemas.load(name)
        about = schema.get("description") or schema.get("title") or ""
        parts.append(
            f"## {name}\n\n`captcha_tasks/schemas/{name}.schema.json`, `$id` "
            f"`{schema['$id']}`. {about}\n\n```json\n{json.dumps(schema, indent=2)}\n```\n"
        )
    return f"""# JSON Schemas

The contract is plain JSON, written down as JSON Schema (2020-12). The files ship inside the
package (`captcha_tasks/schemas/`, read with `captcha_tasks.schemas.load(name)`), refer to
each other by their `$id`, and are checked by the tests against real messages from real
runs. Clients in other languages validate against the same files.

{chr(10).join(parts)}"""


def api_page() -> str:
    sources = captcha_tasks._SOURCES  # where each top-level name is defined
    top = []
    for name in captcha_tasks.__all__:
        module, attribute = sources[name]
        target = "captcha_tasks" + module + (f".{attribute}" if attribute else "")
        top.append((f"captcha_tasks.{name}", target))
    table = "\n".join(f"| `{path}` | `{target}` |" for path, target in top)
    deeper = "\n".join(f"| `{path}` | {what} |" for path, what in public.DOCUMENTED.items())
    removed = "\n".join(f"| `{old}` | `{new}` |" for old, new in public.REMOVED.items())
    blocks = "\n".join(f"::: {target}\n    options:\n      heading_level: 3\n" for _, target in top)
    blocks += "\n".join(
        f"::: {path}\n    options:\n      heading_level: 3\n" for path in public.DOCUMENTED
    )
    return f"""# Python API

These are the public import paths, listed in `captcha_tasks.public`: a removal or rename of
any of them is a breaking change (the test suite pins them). Anything else is internal and
may change between versions.

## From the top level

`from captcha_tasks import solve, stream, ...`:

| import path | defined in |
|---|---|
{table}

## From their modules

| import path | for |
|---|---|
{deeper}

## Removed

Paths that 0.1.0 deprecated (each worked there with a `DeprecationWarning`) and 0.2.0
removed, with what to use instead.

| old path | use instead |
|---|---|
{removed}

## Reference

{blocks}
"""


PAGES = {
    "reference/settings.md": settings_page,
    "reference/errors.md": errors_page,
    "reference/schemas.md": schemas_page,
    "reference/api.md": api_page,
}

for path, page in PAGES.items():
    with mkdocs_gen_files.open(path, "w") as out:
        out.write(page())
