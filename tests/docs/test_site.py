"""The docs site as a reader gets it: built from docs/ with `mkdocs build --strict` (mkdocs.yml), served
over HTTP, opened in headless Chromium. A page renders (its heading, the navigation, a generated
reference page), and the search works: a query typed into the search box lists the pages that hold it.

The site is built into a temporary directory for every run rather than reusing site/: a site/ left by an
earlier `make docs` may predate the pages under test, and the build takes a few seconds. Chromium:
tests/browser.py (skipped outside CI when it is missing, failed with CI=true).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.browser import chromium
from tests.deployments.local_prefect import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert (out / "index.html").is_file() and (out / "search" / "search_index.json").is_file()
    return out


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the signature is http.server's
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(built_site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free port
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path) as driver:
        yield driver


def _wait(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException

    def tolerant() -> Any:
        try:
            return check()
        except StaleElementReferenceException:  # the theme re-rendered the element under us: not yet
            return None

    return wait_for(what, tolerant, timeout, interval=0.2)


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, css))


def test_the_front_page_and_a_generated_reference_page_render(browser: Any, site_url: str) -> None:
    browser.get(site_url + "/")
    assert "ckptvault" in browser.title
    _wait("the front page's heading", lambda: "ckptvault" in _text(browser, ".md-content h1"))
    body = _text(browser, ".md-content")
    assert "Where to start" in body and "A checkpoint without its manifest does not exist" in body
    nav = _text(browser, ".md-nav")
    for entry in ("Quickstart", "Concepts", "Frameworks", "Reliability"):
        assert entry in nav, f"{entry!r} not in the navigation: {nav[:500]}"
    # The stylesheet applied: the theme's header is laid out, not an unstyled list.
    header_height = browser.execute_script("return document.querySelector('.md-header').offsetHeight")
    assert 30 < header_height < 200, header_height

    browser.get(site_url + "/reference/config/")
    _wait("the configuration reference", lambda: "Configuration reference" in _text(browser, ".md-content h1"))
    keys = _text(browser, ".md-content h3")
    assert "store.part_size_mb" in keys and "sources.node_pattern" in keys
    assert "Input should be greater than or equal to 5 (got 4)" in _text(browser, ".md-content table")


@pytest.mark.parametrize(
    ("query", "page"),
    [
        ("superseded", "/concepts/"),  # a word of a page moved out of the README
        ("commit_success", "/frameworks/orbax/"),  # a framework's commit marker
    ],
)
def test_search_lists_the_pages_that_hold_a_word(browser: Any, site_url: str, query: str, page: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(site_url + "/")
    box = _wait(
        "the search box",
        lambda: next(iter(browser.find_elements(By.CSS_SELECTOR, "input.md-search__input")), None),
    )
    box.click()
    box.send_keys(query)

    def results() -> list[str] | None:
        links = [
            a.get_attribute("href") or ""
            for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item a.md-search-result__link")
        ]
        return links or None

    links = _wait(f"search results for {query!r}", results)
    assert page in {urllib.parse.urlsplit(link).path for link in links}, (query, links)
    meta = _text(browser, ".md-search-result__meta")
    assert "matching document" in meta, meta

    # A result leads to its page.
    target = next(link for link in links if urllib.parse.urlsplit(link).path == page)
    browser.get(target)
    _wait(f"{page} after following the result", lambda: bool(_text(browser, ".md-content h1")))
    assert query.split("_")[0] in _text(browser, ".md-content").lower()
