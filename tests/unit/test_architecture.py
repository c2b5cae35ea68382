"""The import rules of the layers, read from the source: a forbidden arrow fails here, not in review.

Layers point down only: deployments -> flows -> runtime -> tasks -> ckptvault (the first four in ckptvault_prefect).
Inside the library, third-party dependencies stay in the one place that owns them, so that the rest
imports (and its unit tests run) without them, and so that swapping one (another S3 client, another
validator) touches one module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("ckptvault", "ckptvault_cli", "ckptvault_prefect")


@dataclass(frozen=True)
class Rule:
    """Modules whose dotted name starts with one of `importers` must not import anything starting with
    one of `imported`, unless the importer's file lies under one of `allowed_in` (repo-relative)."""

    name: str
    importers: tuple[str, ...]
    imported: tuple[str, ...]
    allowed_in: tuple[str, ...] = ()


RULES = (
    Rule("the library knows nothing of Prefect", ("ckptvault.",), ("prefect", "prefect_dask")),
    Rule(
        "the library does not import the layers above it",
        ("ckptvault.",),
        ("ckptvault_prefect", "ckptvault_cli"),
    ),
    Rule(
        "tasks do not import flows or deployments",
        ("ckptvault_prefect.tasks.",),
        ("ckptvault_prefect.flows", "ckptvault_prefect.deployments"),
    ),
    Rule("flows do not import deployments", ("ckptvault_prefect.flows.",), ("ckptvault_prefect.deployments",)),
    Rule("tasks do not import the runtime", ("ckptvault_prefect.tasks.",), ("ckptvault_prefect.runtime",)),
    Rule(
        "the runtime does not import flows or deployments",
        ("ckptvault_prefect.runtime.",),
        ("ckptvault_prefect.flows", "ckptvault_prefect.deployments"),
    ),
    Rule("formats do not import the store", ("ckptvault.formats",), ("ckptvault.store",)),
    Rule("the store does not import formats", ("ckptvault.store",), ("ckptvault.formats",)),
    Rule(
        "boto3 only in ckptvault/store/",
        SHIPPED,
        ("boto3", "botocore", "s3transfer"),
        ("ckptvault/store/",),
    ),
    Rule("pyarrow only in the catalog", SHIPPED, ("pyarrow",), ("ckptvault/catalog/", "ckptvault/catalog.py")),
    Rule(
        "great_expectations only in the quality module",
        SHIPPED,
        ("great_expectations",),
        ("ckptvault/ingest/quality.py",),
    ),
    Rule("slack_sdk only in the alert channels", SHIPPED, ("slack_sdk",), ("ckptvault/alerts/channels.py",)),
    Rule(
        "training frameworks only in the drill's load checks",
        ("ckptvault.",),
        ("torch", "jax", "orbax", "deepspeed", "megatron", "transformers", "lightning"),
        ("ckptvault/restore/pickle_check.py", "ckptvault/restore/tensor_load.py"),
    ),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """Every module this file imports, at any depth (inside functions and TYPE_CHECKING blocks too:
    a lazy import is still a dependency), relative imports resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from ckptvault import store` imports ckptvault.store
                yield node.lineno, f"{target}.{alias.name}"


def _matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p.rstrip(".") or name.startswith(p if p.endswith(".") else p + ".") for p in prefixes)


def violations(root: Path, rules: tuple[Rule, ...] = RULES) -> list[str]:
    found: list[str] = []
    for top in SHIPPED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            me = module_name(path, root)
            for rule in rules:
                if not _matches(me, rule.importers) or rel.startswith(rule.allowed_in):
                    continue
                for line, target in imports_of(path, root):
                    if _matches(target, rule.imported):
                        found.append(f"{rel}:{line} imports {target}: {rule.name}")
    return sorted(set(found))


def test_the_shipped_code_keeps_every_import_rule() -> None:
    assert violations(ROOT) == []


def test_the_rules_see_every_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: a violation written each way an import can be written is caught."""
    for top in (*SHIPPED, "ckptvault_prefect/tasks", "ckptvault_prefect/flows"):
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    (tmp_path / "ckptvault" / "formats").mkdir()
    (tmp_path / "ckptvault" / "formats" / "__init__.py").write_text("")
    (tmp_path / "ckptvault" / "lazy.py").write_text("def f():\n    import prefect\n")
    (tmp_path / "ckptvault" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ckptvault_prefect.flows.ingest import x\n"
    )
    (tmp_path / "ckptvault" / "formats" / "rel.py").write_text("from ..store import s3\n")
    (tmp_path / "ckptvault" / "formats" / "pkg.py").write_text("from ckptvault import store\n")
    (tmp_path / "ckptvault" / "arrow.py").write_text("import pyarrow.parquet as pq\n")
    up = tmp_path / "ckptvault_prefect" / "tasks" / "up.py"
    up.write_text("from ckptvault_prefect.flows import ingest\n")
    (tmp_path / "ckptvault_prefect" / "flows" / "s3.py").write_text("import boto3\n")
    (tmp_path / "ckptvault_cli" / "ok.py").write_text("import prefect\nfrom ckptvault import catalog\n")

    got = violations(tmp_path)
    assert set(got) == {
        "ckptvault/arrow.py:1 imports pyarrow.parquet: pyarrow only in the catalog",
        "ckptvault/formats/pkg.py:1 imports ckptvault.store: formats do not import the store",
        "ckptvault/formats/rel.py:1 imports ckptvault.store: formats do not import the store",
        "ckptvault/formats/rel.py:1 imports ckptvault.store.s3: formats do not import the store",
        "ckptvault/lazy.py:2 imports prefect: the library knows nothing of Prefect",
        "ckptvault/typed.py:3 imports ckptvault_prefect.flows.ingest: the library does not import the layers above it",
        "ckptvault/typed.py:3 imports ckptvault_prefect.flows.ingest.x: "
        "the library does not import the layers above it",
        "ckptvault_prefect/flows/s3.py:1 imports boto3: boto3 only in ckptvault/store/",
        "ckptvault_prefect/tasks/up.py:1 imports ckptvault_prefect.flows: tasks do not import flows or deployments",
        "ckptvault_prefect/tasks/up.py:1 imports ckptvault_prefect.flows.ingest: "
        "tasks do not import flows or deployments",
    }


@pytest.mark.parametrize("name", ["prefect", "prefect.flows", "prefect_dask"])
def test_a_prefix_matches_whole_names_only(name: str) -> None:
    assert _matches(name, ("prefect", "prefect_dask"))
    assert not _matches("prefectish", ("prefect",))


def test_the_runtime_sits_between_flows_and_tasks(tmp_path: Path) -> None:
    """The Prefect layer's runtime (task runners, hooks, the submitter): flows and the command line
    import it, it imports tasks, and never the other way."""
    for top in (*SHIPPED, *(f"ckptvault_prefect/{p}" for p in ("tasks", "runtime", "flows", "deployments"))):
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    layer = tmp_path / "ckptvault_prefect"
    (layer / "runtime" / "hooks.py").write_text("from ckptvault_prefect.tasks import notify\n")
    (layer / "runtime" / "up.py").write_text("from ckptvault_prefect.flows.ingest import ingest\n")
    (layer / "runtime" / "top.py").write_text("def f():\n    from ..deployments import serve\n")
    (layer / "tasks" / "down.py").write_text("from ckptvault_prefect.runtime import scale\n")
    (layer / "flows" / "ingest.py").write_text("from ckptvault_prefect.runtime.hooks import HOOKS\n")
    (tmp_path / "ckptvault_cli" / "running.py").write_text("from ckptvault_prefect.runtime.hooks import alert_failed\n")

    assert set(violations(tmp_path)) == {
        "ckptvault_prefect/runtime/top.py:2 imports ckptvault_prefect.deployments: "
        "the runtime does not import flows or deployments",
        "ckptvault_prefect/runtime/top.py:2 imports ckptvault_prefect.deployments.serve: "
        "the runtime does not import flows or deployments",
        "ckptvault_prefect/runtime/up.py:1 imports ckptvault_prefect.flows.ingest: "
        "the runtime does not import flows or deployments",
        "ckptvault_prefect/runtime/up.py:1 imports ckptvault_prefect.flows.ingest.ingest: "
        "the runtime does not import flows or deployments",
        "ckptvault_prefect/tasks/down.py:1 imports ckptvault_prefect.runtime: tasks do not import the runtime",
        "ckptvault_prefect/tasks/down.py:1 imports ckptvault_prefect.runtime.scale: tasks do not import the runtime",
    }
