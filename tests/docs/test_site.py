"""The documentation site: ``mkdocs build --strict`` passes, the generated reference names
every setting, command, error code and public import path the code has, and a reader in a
real browser follows the navigation and finds a setting with the site's search."""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from browser import chromium

from captcha_tasks import errors, public, schemas
from captcha_tasks.cli import COMMANDS
from captcha_tasks.settings import ENVIRONMENT_VARIABLES, documented

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
#: Material and properdocs (which a plugin imports) print banners about MkDocs' future on
#: every build; each is muted by its own variable (mkdocs.yml names both), not by ``-q``.
QUIET = {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # No -q: it lowers mkdocs' log level below WARNING, so --strict counts none and passes.
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, **QUIET},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "WARNING" not in output, output[-3000:]
    assert "Documentation built in" in output, output[-3000:]
    return out


def page(site: Path, path: str) -> str:
    return unescape((site / path / "index.html").read_text(encoding="utf-8"))


def text_of(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def test_the_site_names_every_environment_variable_the_settings_read(site: Path) -> None:
    reference = text_of(page(site, "reference/settings"))
    index = (site / "search" / "search_index.json").read_text(encoding="utf-8")
    for var in sorted(ENVIRONMENT_VARIABLES):
        assert var in reference, var
        assert var in index, f"{var} is not in the search index"


def test_each_setting_shows_its_default_meaning_and_python_path(site: Path) -> None:
    html = page(site, "reference/settings")
    for doc in documented():
        assert doc.meaning, f"{doc.variable} has no meaning in its field's metadata"
        row = re.search(
            rf"<td><code>{doc.variable}</code></td>\s*<td>(.*?)</td>\s*<td>(.*?)</td>"
            r"\s*<td>(.*?)</td>",
            html,
            re.S,
        )
        assert row is not None, doc.variable
        default, meaning = text_of(row.group(1)), text_of(row.group(2))
        assert text_of(row.group(3)).startswith(f"settings.{doc.path}: "), doc.variable
        assert meaning.split()[:3] == doc.meaning.replace("``", "").split()[:3], doc.variable
        if isinstance(doc.default, int | float) and not isinstance(doc.default, bool):
            assert default == f"{doc.default:g}", (doc.variable, default)


def test_every_error_code_is_in_the_reference(site: Path) -> None:
    reference = text_of(page(site, "reference/errors"))
    for code, cls in errors.codes().items():
        assert code in reference, code
        assert cls.__name__ in reference, cls.__name__


def test_every_schema_is_in_the_reference(site: Path) -> None:
    reference = page(site, "reference/schemas")
    for name in schemas.names():
        assert schemas.load(name)["$id"] in reference, name


def test_every_command_is_in_the_cli_reference(site: Path) -> None:
    reference = text_of(page(site, "reference/cli"))
    for name in COMMANDS:
        assert f"captcha-tasks {name}" in reference, name
    assert "captcha-tasks pool status" in reference  # sub-commands of groups too


def test_the_api_page_lists_exactly_the_public_import_paths(site: Path) -> None:
    api = page(site, "reference/api")
    tables, rest = api.split('id="removed"', 1)
    removed = rest.split('id="reference"', 1)[0]
    row = r"<tr>\s*<td><code>(captcha_tasks[\w.]*)</code>"
    assert sorted(re.findall(row, tables)) == sorted(public.paths())
    assert sorted(re.findall(row, removed)) == sorted(public.REMOVED)


# -- a reader in a real browser ---------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()


def test_a_reader_follows_the_navigation_and_searches_for_a_setting(
    served: str, browser: Any, output_dir: Path
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    browser.get(served)
    assert browser.find_element(By.TAG_NAME, "h1").text == "captcha-tasks"

    # The navigation: Home -> Getting started -> Reference / Settings.
    browser.find_element(By.LINK_TEXT, "Getting started").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "h1").text == "Getting started")
    nav = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary")
    nav.find_element(By.XPATH, ".//a[normalize-space()='Error codes']").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "h1").text == "Error codes")
    assert "ERROR_WRONG_USER_KEY" in browser.page_source

    # The search: type a variable's name, open the first result, land on its row.
    variable = "CAPTCHAAI_SOLVE_TIMEOUT"
    box = wait.until(seen.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.click()  # the header's search field (a wide window shows it)
    box.send_keys(variable)

    def open_the_first_result(driver: Any) -> bool:
        # The list is drawn again as the search answers each keystroke: a result found a
        # moment ago may be gone (stale); the wait looks again until the whole query's
        # first result (the settings page) takes the key.
        try:
            first = driver.find_element(By.CSS_SELECTOR, ".md-search-result__item a")
            if not first.is_displayed() or "/reference/settings/" not in (
                first.get_attribute("href") or ""
            ):
                return False
            driver.save_screenshot(str(output_dir / "docs-search.png"))
            first.send_keys(Keys.ENTER)
            return True
        except StaleElementReferenceException:
            return False

    wait.until(open_the_first_result)
    wait.until(lambda d: "/reference/settings/" in d.current_url)
    # (the search highlights the words it found: the variable's cell holds more than text)
    row = browser.find_element(By.XPATH, f"//tr[td[1][normalize-space()='{variable}']]")
    assert "deadline" in row.text
    assert "300" in row.text  # its default, in seconds
