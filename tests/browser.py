"""Dagster's UI in a real browser: Debian's Chromium, headless, driven by Selenium.

No browser is downloaded: ``make test`` installs Debian's ``chromium`` and
``chromium-driver`` when they are missing, and Selenium is pointed at them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

#: Where the tests leave their screenshots when set (the docs' come from there).
SCREENSHOTS_ENV = "BACKLOG_DAGSTER_SCREENSHOTS"
#: The flags this machine's closed network needs (no background connections).
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1500,1000",
)


@contextmanager
def chromium(user_data: Path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium with a fresh profile under ``user_data``."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail("Debian's chromium and chromium-driver are needed: `make test` installs them")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never fetch a browser or driver
    options = webdriver.ChromeOptions()
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={user_data}")
    options.binary_location = browser
    session = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield session
    finally:
        session.quit()


def page_showing(
    browser: webdriver.Chrome,
    url: str,
    expected: list[str],
    timeout: float = 90,
    reload_every: float = 3,
) -> str:
    """Open ``url`` and wait until its text holds every string of ``expected``; the text.

    Dagster's first-visit dialog is skipped. The page is reloaded every
    ``reload_every`` s, as a reader would, so that observations that arrive meanwhile
    show.
    """
    browser.get(url)
    deadline, reload_at = time.monotonic() + timeout, time.monotonic() + reload_every
    text = ""
    while time.monotonic() < deadline:
        skip_first_visit_dialog(browser)
        text = browser.find_element(By.TAG_NAME, "body").text
        if all(e in text for e in expected):
            return text
        if time.monotonic() >= reload_at:
            browser.refresh()
            reload_at = time.monotonic() + reload_every
        time.sleep(0.5)
    missing = [e for e in expected if e not in text]
    raise AssertionError(f"{url} did not show {missing} within {timeout:g} s; it showed:\n{text}")


def skip_first_visit_dialog(browser: webdriver.Chrome, wait_s: float = 0) -> None:
    """Close Dagster's first-visit dialog ("Join the Dagster community") if it is up, or
    comes up within ``wait_s`` (it opens a moment after a page has loaded)."""
    deadline = time.monotonic() + wait_s
    while True:
        buttons = browser.find_elements(By.XPATH, "//button[normalize-space()='Skip']")
        for button in buttons:
            with suppress(WebDriverException):
                button.click()
        if buttons or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    if buttons:
        time.sleep(0.5)  # its closing animation


def screenshot(
    browser: webdriver.Chrome, folder: Path, name: str, scroll_to: str | None = None
) -> Path:
    """Save what the browser shows as ``<name>.png`` (in ``$BACKLOG_DAGSTER_SCREENSHOTS``
    when set, else in ``folder``), first scrolled to the heading ``scroll_to``, without
    Dagster's first-visit dialog over it."""
    skip_first_visit_dialog(browser, wait_s=3)
    if scroll_to is not None:
        heading = browser.find_element(By.XPATH, f"//*[normalize-space()='{scroll_to}']")
        browser.execute_script("arguments[0].scrollIntoView();", heading)
        time.sleep(0.5)
    target = Path(os.environ.get(SCREENSHOTS_ENV, folder))
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.png"
    assert browser.save_screenshot(str(path)), f"no screenshot taken of {browser.current_url}"
    return path
