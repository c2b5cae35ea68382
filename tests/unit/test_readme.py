"""README.md is the front page (what it is, the two commands, an example, links into docs/), at most 150
lines; everything else lives in the docs site, whose own links `mkdocs build --strict` checks. This
checks what mkdocs does not see: the README's links, and that every docs page is reachable from it or
from the site's navigation."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_a_front_page_of_at_most_150_lines() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    for command in ("make demo", "make test", "make docs"):
        assert command in text, command


def test_every_relative_link_of_the_readme_resolves() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if "://" not in t]
    assert targets, "the README links no docs page"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links files that do not exist: {missing}"


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert "reference/config.md" in pages and "FORMAT.md" in pages
    missing = [p for p in pages if f": {p}\n" not in nav and f"- {p}\n" not in nav]
    assert not missing, f"docs pages not in mkdocs.yml's nav: {missing}"
