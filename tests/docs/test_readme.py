"""The README is the front page: short, with the compliance note and the two commands, and
every link it gives leads to a page (and heading) that exists.  The manual is the site."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The front page's budget (issue 24): what it is, the two commands, one example, a map.
MAX_BYTES = 15_000
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_a_front_page_not_the_manual() -> None:
    size = len(README.encode("utf-8"))
    assert size <= MAX_BYTES, f"README.md is {size} bytes; move detail into docs/"


def test_the_readme_keeps_the_compliance_note_and_the_two_commands() -> None:
    assert "**Compliance.** Process only data and pages you are authorised to process" in README
    commands = re.findall(r"^(\./scripts/\w+)", README, re.M)
    assert commands[:2] == ["./scripts/quickstart", "./scripts/test"]


def _local_links() -> list[str]:
    return [t for t in LINK.findall(README) if not re.match(r"[a-z]+:", t)]


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives a page's headings (lower case, punctuation dropped, '-')."""
    ids = set()
    for title in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\s-]", "", title.strip().lower())
        ids.add(re.sub(r"[\s]+", "-", slug))
    return ids


@pytest.mark.parametrize("target", _local_links())
def test_every_link_of_the_readme_leads_somewhere(target: str) -> None:
    path, _, anchor = target.partition("#")
    page = ROOT / path
    assert page.exists(), f"README links to {path}, which does not exist"
    if anchor:
        assert anchor in _anchors(page), f"{path} has no heading #{anchor}"


def test_the_readme_links_every_guide() -> None:
    guides = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs" / "guides").glob("*.md")}
    linked = {t.partition("#")[0] for t in _local_links()}
    assert guides <= linked, sorted(guides - linked)


def _sentence_linking(target: str) -> str:
    for sentence in re.split(r"(?<=\.)\s", README):
        if f"]({target})" in sentence:
            return " ".join(sentence.split())
    raise AssertionError(f"the README does not link {target}")


def test_the_link_to_getting_started_says_what_that_page_covers() -> None:
    """Its lead-in names each section of the page (it once promised a real account and
    Docker Compose, which the page does not cover)."""
    lead_in = _sentence_linking("docs/getting-started.md").lower()
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    for heading in re.findall(r"^## (.+)$", page, re.M):
        assert heading.lower() in lead_in, f"the README's link to Getting started omits {heading!r}"
    for promise in ("docker compose", "real account"):
        if promise in lead_in:
            assert promise in page.lower(), f"Getting started does not cover {promise!r}"
