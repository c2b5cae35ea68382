"""The browser the Prefect UI tests click through (tests/browser.py: Debian's Chromium through Selenium)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import chromium


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path) as driver:  # skipped outside CI without Chromium, failed in CI
        yield driver
