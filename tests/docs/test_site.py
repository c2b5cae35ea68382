"""The docs site as a reader gets it: built from docs/ with `mkdocs build --strict` (mkdocs.yml), opened in
headless Chromium two ways: served over HTTP, and from disk (file://, as the README says: `make docs`, then
open site/index.html). A page renders (its heading, the navigation, a generated reference page), the
navigation leads to pages and not to directory listings, and the search works: a query typed into the search
box lists the pages that hold it.

The site is built into a temporary directory for every run rather than reusing site/: a site/ left by an
earlier `make docs` may predate the pages under test, and the build takes a few seconds. Chromium:
tests/browser.py (skipped outside CI when it is missing, failed with CI=true).
"""

from __future__ import annotations

import functools
import os
import re
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


def _search(driver: Any, query: str) -> list[str]:
    """Types `query` into the search box of the open page; the links of the results the theme lists."""
    from selenium.webdriver.common.by import By

    # The box is in every page's header, and shown once the theme's search has started: not shown, no search.
    def shown_box() -> Any:
        boxes = driver.find_elements(By.CSS_SELECTOR, "input.md-search__input")
        return next((e for e in boxes if e.is_displayed()), None)

    box = _wait("the search box, shown", shown_box)
    box.click()
    box.send_keys(query)

    def results() -> list[str] | None:
        links = [
            a.get_attribute("href") or ""
            for a in driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item a.md-search-result__link")
        ]
        return links or None

    links: list[str] = _wait(f"search results for {query!r}", results)
    return links


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

    browser.get(site_url + "/reference/config.html")
    _wait("the configuration reference", lambda: "Configuration reference" in _text(browser, ".md-content h1"))
    keys = _text(browser, ".md-content h3")
    assert "store.part_size_mb" in keys and "sources.node_pattern" in keys
    assert "Input should be greater than or equal to 5 (got 4)" in _text(browser, ".md-content table")


@pytest.mark.parametrize(
    ("query", "page"),
    [
        ("superseded", "/concepts.html"),  # a word of a page moved out of the README
        ("commit_success", "/frameworks/orbax.html"),  # a framework's commit marker
    ],
)
def test_search_lists_the_pages_that_hold_a_word(browser: Any, site_url: str, query: str, page: str) -> None:
    browser.get(site_url + "/")
    links = _search(browser, query)
    assert page in {urllib.parse.urlsplit(link).path for link in links}, (query, links)
    meta = _text(browser, ".md-search-result__meta")
    assert "matching document" in meta, meta

    # A result leads to its page.
    target = next(link for link in links if urllib.parse.urlsplit(link).path == page)
    browser.get(target)
    _wait(f"{page} after following the result", lambda: bool(_text(browser, ".md-content h1")))
    assert query.split("_")[0] in _text(browser, ".md-content").lower()


# --- opened from disk ------------------------------------------------------------------------------------

# Each followed from the page before it, by its link in the navigation: into a folder, from one folder to
# another, and back up, so that links relative to a page in a folder are exercised both ways. The label in
# the navigation, the file it must open, the page's heading.
FROM_DISK_NAV = [
    ("Frameworks", "frameworks/index.html", "Frameworks"),
    ("Command line", "reference/cli.html", "Command-line reference"),
    ("Concepts", "concepts.html", "Concepts"),
]


def _assert_a_page(driver: Any, url: str, label: str, heading: str) -> None:
    """The browser shows the site's page at `url`: its title and heading, not a directory listing (what a
    link to `page/` opens from disk) or Chromium's page for a missing file."""
    assert driver.current_url == url, (driver.current_url, url)
    assert not driver.title.startswith("Index of"), f"{url}: a directory listing"
    assert driver.title == (f"{label} - ckptvault" if label else "ckptvault"), (url, driver.title)
    _wait(f"{url}'s heading", lambda: heading in _text(driver, ".md-content h1"))


def _outside_requests(driver: Any) -> list[str]:
    names: list[str] = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [n for n in names if not n.startswith("file:")]


def test_every_link_between_pages_names_a_file(built_site: Path) -> None:
    """Opened from disk, a link names the file it opens: a link to a directory (`concepts/`) shows that
    directory's listing there, and one to a missing file shows nothing. 404.html is left out: its links are
    absolute, for a server, as mkdocs writes it."""
    bad = []
    pages = [p for p in built_site.rglob("*.html") if p.name != "404.html"]
    assert len(pages) > 30, pages  # every page of the navigation, not an empty or partial build
    for page in pages:
        for link in re.findall(r'(?:href|src)="([^"]*)"', page.read_text(encoding="utf-8")):
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or parts.netloc or not parts.path:  # another site, or an anchor on this page
                continue
            target = (page.parent / urllib.parse.unquote(parts.path)).resolve()
            if not target.is_file():
                bad.append(f"{page.relative_to(built_site)}: {link}")
    assert not bad, "links to no file:\n" + "\n".join(bad[:40])


def test_from_disk_the_navigation_opens_pages(browser: Any, built_site: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    home = (built_site / "index.html").as_uri()
    browser.get(home)
    _assert_a_page(browser, home, "", "ckptvault")
    header_height = browser.execute_script("return document.querySelector('.md-header').offsetHeight")
    assert 30 < header_height < 200, header_height  # the stylesheet loaded from disk too
    browser.save_screenshot(str(tmp_path / "from-disk-home.png"))

    for label, path, heading in FROM_DISK_NAV:
        links = [
            a
            for a in browser.find_elements(By.CSS_SELECTOR, ".md-sidebar--primary a.md-nav__link")
            if a.text.strip() == label and a.is_displayed()
        ]
        assert links, f"no {label!r} in the navigation of {browser.current_url}"
        # to the middle of the sidebar first: at its top the sidebar's sticky title would take the click
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", links[0])
        links[0].click()
        _assert_a_page(browser, (built_site / path).as_uri(), label, heading)
    browser.save_screenshot(str(tmp_path / "from-disk-concepts.png"))
    assert (tmp_path / "from-disk-concepts.png").stat().st_size > 10_000
    assert not _outside_requests(browser)


def _file_of(url: str) -> str:
    """The page a link opens, without the search's `?h=` highlight or an anchor."""
    return urllib.parse.urlsplit(url)._replace(query="", fragment="").geturl()


def test_from_disk_search_lists_pages_and_a_result_opens(browser: Any, built_site: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get((built_site / "index.html").as_uri())
    links = _search(browser, "superseded")
    concepts = (built_site / "concepts.html").as_uri()
    assert concepts in {_file_of(link) for link in links}, links
    assert "matching document" in _text(browser, ".md-search-result__meta")
    browser.save_screenshot(str(tmp_path / "from-disk-search.png"))
    # The search ran here, with no network: the worker's shim and the index are files of the site.
    assert not _outside_requests(browser), _outside_requests(browser)

    # A result, clicked, opens its page.
    first = next(
        a
        for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item a.md-search-result__link")
        if _file_of(a.get_attribute("href") or "") == concepts
    )
    first.click()
    _wait("concepts.html from a search result", lambda: _file_of(browser.current_url) == concepts)
    _assert_a_page(browser, browser.current_url, "Concepts", "Concepts")
    assert "superseded" in _text(browser, ".md-content").lower()
