"""The generated reference pages (docs/gen_reference.py): every config key and every CLI subcommand and
flag has a doc line, and the pages committed under docs/reference/ are what the generator writes now.

Committed rather than generated only at build time, on purpose: the pages are readable in the repository
without building the site, `ckptvault`'s unknown-key error points at docs/reference/config.md, and a
changed key or flag shows up in review as a changed page. The price is that they can go stale, which
test_the_committed_pages_are_up_to_date catches (and `make docs`, which runs the generator with --check).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_reference"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_every_config_key_has_a_description(gen: ModuleType) -> None:
    keys = gen.all_keys()
    missing = [k.path for k in keys if not k.description]
    assert not missing, f"config keys with no description= in ckptvault/config.py: {missing}"
    # Nested sections are walked too: a key of each depth is among them.
    paths = {k.path for k in keys}
    assert {"sha256", "store.bucket", "sources.node_pattern", "policy.keep_best.metric", "policy.tiers.tier"} <= paths


def test_every_section_has_a_docstring(gen: ModuleType) -> None:
    missing = [s.model.__name__ for s in gen.sections() if not (s.model.__doc__ or "").strip()]
    assert not missing, f"config models with no docstring (the section's text on the page): {missing}"


def test_every_cli_subcommand_and_flag_has_help(gen: ModuleType) -> None:
    cmds = gen.commands()
    names = {c.name for c in cmds}
    assert {"ckptvault", "ckptvault ingest", "ckptvault restore", "ckptvault catalog rebuild"} <= names
    no_help = [c.name for c in cmds if not c.help.strip()]
    assert not no_help, f"subcommands with no help= in ckptvault_cli/parser.py: {no_help}"
    flags = [(c.name, gen._arg_name(a), a) for c in cmds for a in gen.arguments(c)]
    assert any(name == "--dest DEST" for _, name, _ in flags)
    no_doc = [f"{c} {n}" for c, n, a in flags if not (a.help or "").strip() or a.help == argparse.SUPPRESS]
    assert not no_doc, f"arguments with no help= in ckptvault_cli/parser.py: {no_doc}"


def test_the_checks_catch_a_key_and_a_flag_without_a_doc_line(gen: ModuleType) -> None:
    """The two tests above are not vacuous: an undocumented key or flag is found."""
    from pydantic import BaseModel, Field

    class Bare(BaseModel):
        documented: int = Field(default=1, description="has one")
        bare: int = 2

    section = gen.Section("bare", Bare, False)
    assert [k.path for k in gen.keys(section) if not k.description] == ["bare.bare"]

    p = argparse.ArgumentParser(prog="x", description="x")
    sub = p.add_subparsers()
    s = sub.add_parser("y", help="")
    s.add_argument("--flag")
    cmds = gen.commands(p)
    assert [c.name for c in cmds if not c.help] == ["x y"]
    assert [gen._arg_name(a) for c in cmds for a in gen.arguments(c) if not a.help] == ["--flag FLAG"]


def test_every_model_validator_and_field_validator_is_shown_failing(gen: ModuleType) -> None:
    """The page shows each rule's error: a rule across keys needs an example in CROSS_KEY, a key's own
    validator one in VALIDATOR_SAMPLES (or to only normalise its value)."""
    for section in gen.sections():
        decorators = section.model.__pydantic_decorators__
        n_model = len(decorators.model_validators)
        assert len(gen.CROSS_KEY.get(section.path, [])) >= n_model, f"[{section.path}]: a model validator unshown"
        prefix = f"{section.path}." if section.path else ""
        for v in decorators.field_validators.values():
            for field in v.info.fields:
                key = prefix + field
                assert key in gen.VALIDATOR_SAMPLES or key in gen.NORMALISING_VALIDATORS, key


def test_the_config_page_shows_real_errors(gen: ModuleType) -> None:
    page = gen.config_page()
    assert "`store.part_size_mb: Input should be greater than or equal to 5 (got 4).`" in page
    assert "buffer_mb = 32 cannot hold one part of part_size_mb = 64" in page
    assert "store.buckt: unknown key; did you mean bucket?" in page
    for key in gen.all_keys():
        assert f"### `{key.path}`" in page


def test_the_committed_pages_are_up_to_date(gen: ModuleType) -> None:
    for path, render in gen.PAGES.items():
        rel = path.relative_to(ROOT)
        assert path.exists(), f"{rel} is missing: run `python docs/gen_reference.py`"
        assert path.read_text(encoding="utf-8") == render(), (
            f"{rel} is out of date with the code: run `python docs/gen_reference.py` and commit it"
        )


def test_the_flows_table_replaces_only_what_is_between_its_markers(gen: ModuleType) -> None:
    text = f"before\n{gen.FLOWS_START}\n| an old table |\n{gen.FLOWS_END}\nafter\n"
    out = gen.with_flows(text, "docs/")
    assert out.startswith(f"before\n{gen.FLOWS_START}\n\n| flow | when | what it does |\n")
    assert out.endswith(f"|\n\n{gen.FLOWS_END}\nafter\n") and "an old table" not in out
    assert "[Replicas](docs/replicas.md)" in out
    assert gen.with_flows(out, "docs/") == out  # a second run changes nothing
    for broken in ("no markers\n", f"{gen.FLOWS_END}\n{gen.FLOWS_START}\n", f"{gen.FLOWS_START}\n" * 2 + gen.FLOWS_END):
        with pytest.raises(ValueError, match="want one"):
            gen.with_flows(broken, "")


def test_the_readme_and_the_home_page_are_generated_pages(gen: ModuleType) -> None:
    """Both in PAGES, so `--check` and test_the_committed_pages_are_up_to_date cover their tables."""
    assert {gen.README, gen.HOME_PAGE} <= set(gen.PAGES)
    assert "| `scrub` | daily at 04:30 UTC |" in gen.readme()
    assert "| `replicate` | hourly |" in gen.home_page()
