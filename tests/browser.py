"""A headless Chromium driven by Selenium, for the tests that look at a page as a person
would (Flower's task list, the documentation site)."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from system_parts import missing


def chromium() -> Any:
    """A new headless browser; the caller quits it.  Without Chromium and its driver the
    test skips (fails under CI)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (binary and driver_path):
        missing("headless browser", "apt-get install -y chromium chromium-driver")

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--window-size=1600,1000",
        f"--user-data-dir={tempfile.mkdtemp(prefix='ct-chromium-')}",
    ):  # fmt: skip
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager must not try to download one.
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
