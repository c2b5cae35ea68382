"""Headless Chromium for the browser tests (the Prefect UI in tests/deployments, the docs site in tests/docs): Debian's
chromium + chromium-driver through Selenium, no download. Outside CI a missing browser skips the test
(with the reason); with CI=true (.ci/run installs both) it fails, through helpers.missing_tool."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers import missing_tool

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1100",
)


def browser_missing() -> str | None:
    """Why no browser test can run here (None: it can)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        return f"{' and '.join(missing)} not found: apt-get install chromium chromium-driver (.ci/run does)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[dev]'"
    return None


@contextmanager
def chromium(profile_parent: Path) -> Iterator[Any]:
    """A headless Chromium WebDriver with its own profile under `profile_parent`; quit on exit."""
    reason = browser_missing()
    if reason:
        missing_tool(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in CHROME_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-', dir=profile_parent)}")
    # The console (failed requests, errors) for a failing test's message: browser_console(driver)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Selenium Manager must not try to download anything: the driver is given.
    os.environ.setdefault("SE_OFFLINE", "true")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def browser_console(driver: Any) -> str:
    """The browser console's warnings and errors so far (failed requests among them), a line each."""
    try:
        entries = driver.get_log("browser")
    except Exception as e:  # a diagnostic must not hide the failure it explains
        return f"(the console could not be read: {e})"
    return "\n".join(f"{e.get('level')} {e.get('message')}" for e in entries if e.get("level") != "INFO")
