"""The benchmark pages (``docs/benchmarks.md`` and ``docs/benchmarks/``): every image they
reference exists and is a plot the scripts write (SVG or PNG), every page shows at least one,
no plot in ``docs/benchmarks/img`` is left unshown, and no page names an internal issue number.
Reads the Markdown; builds nothing."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = [DOCS / "benchmarks.md", *sorted((DOCS / "benchmarks").glob("*.md"))]
IMAGES = DOCS / "benchmarks" / "img"
#: ![alt](path "title") and <img src="path">
REFERENCE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)|<img\s[^>]*src=[\"']([^\"']+)")


def images_of(page: Path) -> list[Path]:
    found = REFERENCE.findall(page.read_text(encoding="utf-8"))
    return [(page.parent / (md or html)).resolve() for md, html in found]


def test_the_pattern_finds_both_ways_of_showing_an_image() -> None:
    text = '![a plot](img/a.svg "title")\n<img alt="b" src="img/b.png">\n[a link](a.md)'
    assert [md or html for md, html in REFERENCE.findall(text)] == ["img/a.svg", "img/b.png"]


#: Pages of scripts that do not draw yet (their plots come with the scripts' --plot).
PLOTS_TO_COME: set[str] = set()


@pytest.mark.parametrize("page", PAGES[1:], ids=lambda p: p.name)
def test_each_benchmark_page_shows_a_plot(page: Path) -> None:
    if page.name in PLOTS_TO_COME:
        assert not images_of(page), f"{page.name} has its plot: take it off PLOTS_TO_COME"
        return
    assert images_of(page), f"{page.relative_to(DOCS)} shows no plot"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_image_a_benchmark_page_references_exists(page: Path) -> None:
    for image in images_of(page):
        assert image.is_file(), f"{page.relative_to(DOCS)} shows {image.name}, which is missing"
        assert image.suffix in (".svg", ".png"), image.name
        if image.suffix == ".svg":  # valid XML, with its text as text
            root = ET.parse(image).getroot()
            assert root.tag == "{http://www.w3.org/2000/svg}svg", image.name
            assert root.find(".//{http://www.w3.org/2000/svg}text") is not None, image.name
        else:
            assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image.name


def test_every_plot_in_the_image_folder_is_on_a_page() -> None:
    shown = {image for page in PAGES for image in images_of(page)}
    unshown = sorted(p.name for p in IMAGES.iterdir() if p.resolve() not in shown)
    assert not unshown, f"plots no page shows: {unshown}"


#: An internal issue number ("issue 23's runs", "Issue #20"): the pages are for readers
#: who never saw the tracker.
ISSUE_NUMBER = re.compile(r"\bissues?\s+#?\d+", re.I)


def test_the_issue_pattern_finds_internal_numbers() -> None:
    assert ISSUE_NUMBER.search("runs issue 23's measured runs")
    assert ISSUE_NUMBER.search("Issue #20's runs")
    assert not ISSUE_NUMBER.search("an issue with 20 threads; tissue 3")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_benchmark_page_names_an_internal_issue_number(page: Path) -> None:
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found = ISSUE_NUMBER.search(line)
        assert found is None, f"{page.relative_to(DOCS)}:{number} names {found.group(0)!r}"
