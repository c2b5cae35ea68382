"""The import rules of the layers, read from the source: a forbidden arrow fails here, not in review.

Layers point down only: deployments -> flows -> runtime -> tasks -> ckptvault (the first four in ckptvault_prefect).
Inside the library, third-party dependencies stay in the one place that owns them, so that the rest
imports (and its unit tests run) without them, and so that swapping one (another S3 client, another
validator) touches one module.

The library itself has three floors:
- the wings, `ingest`, `replication`, `restore` and `tiering`: each does one job and imports no other wing, so a
  change inside one cannot break another and each can be read (and unit-tested) on its own;
- `alerts`, a service below the wings, not a wing: ingest's pass raises alerts and every flow sends
  them, and it reads only the catalog, the store and the price table (ckptvault/pricing.py), so it
  imports no wing either;
- the foundations every wing may import: the packages `checkpoint`, `catalog`, `clock`, `codec`, `command`, `history`,
  `formats`, `objectlock`, `observe`, `store` and `transfer`, and the five root modules (config, errors,
  checksum, pricing, humanize). They import neither a wing nor alerts. A record two wings share (a local
  file, a node placement, a manifest read back from the store) lives in the package of its concept.
The root holds those five modules and no other: a new module goes into the package of its concept, so
the root never again becomes the easiest place to share code.
Between the packages (and the root modules) every arrow points one way: no package imports one that
imports it back, directly or through others, counting every import (inside functions and under
TYPE_CHECKING too); `test_no_package_imports_one_that_imports_it_back`.
And no import cycle among the modules of the three shipped packages, every import counted there too
(`test_the_shipped_code_has_no_import_cycle`; `module_edges` says what an edge is).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("ckptvault", "ckptvault_cli", "ckptvault_prefect")
WINGS = ("ckptvault.ingest", "ckptvault.replication", "ckptvault.restore", "ckptvault.tiering")
# The foundations by name: a module added to ckptvault/ fails `test_the_root_holds_only_its_foundations`.
ROOT_MODULES = ("checksum", "config", "errors", "humanize", "pricing")
PACKAGES = (
    *("catalog", "checkpoint", "clock", "codec", "command"),
    *("formats", "history", "objectlock", "observe", "store", "transfer"),
)
FOUNDATIONS = tuple(f"ckptvault.{name}" for name in (*PACKAGES, *ROOT_MODULES))


@dataclass(frozen=True)
class Rule:
    """Modules whose dotted name starts with one of `importers` must not import anything starting with
    one of `imported`, unless the importer's file lies under one of `allowed_in` (repo-relative)."""

    name: str
    importers: tuple[str, ...]
    imported: tuple[str, ...]
    allowed_in: tuple[str, ...] = ()


RULES = (
    # no exemption, not even a lazy import: the hooks in the training process POST their one event with the
    # standard library; test_no_prefect_in_library.py imports every module to prove it at run time too
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
    # the command line's parser imports it to print `serve --help`, before any command has chosen to load Prefect
    Rule(
        "the list of flows imports no Prefect",
        ("ckptvault_prefect.deployments.flow_list",),
        ("prefect", "prefect_dask", *(f"ckptvault_prefect.{p}" for p in ("tasks", "runtime", "flows"))),
    ),
    # the warm process and serve's warm start read it before they import what it names
    Rule(
        "the preload list imports nothing",
        ("ckptvault_prefect.runtime.preload",),
        ("prefect", "ckptvault", "ckptvault_cli", "ckptvault_prefect"),
    ),
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
    Rule("pyarrow only in the catalog", SHIPPED, ("pyarrow",), ("ckptvault/catalog/",)),
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
        ("ckptvault/restore/pickle_check.py", "ckptvault/restore/tensor_load.py", "ckptvault/hooks/"),
    ),
    Rule("hooks only signal: no wing, not alerts", ("ckptvault.hooks",), (*WINGS, "ckptvault.alerts")),
    *(Rule(f"{w.rpartition('.')[2]} imports no other wing", (w,), tuple(o for o in WINGS if o != w)) for w in WINGS),
    Rule("alerts, below the wings, imports none of them", ("ckptvault.alerts",), WINGS),
    Rule("the foundations import no wing and not alerts", FOUNDATIONS, (*WINGS, "ckptvault.alerts")),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _from_target(node: ast.ImportFrom, path: Path, root: Path) -> str:
    """The module a `from ... import` reads from, a relative one resolved against the file's package."""
    if not node.level:
        return node.module or ""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """Every module this file imports, at any depth (inside functions and TYPE_CHECKING blocks too:
    a lazy import is still a dependency), relative imports resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, path, root)
            yield node.lineno, target
            for alias in node.names:  # `from ckptvault import store` imports ckptvault.store
                yield node.lineno, f"{target}.{alias.name}"


def module_edges(root: Path, tops: tuple[str, ...] = SHIPPED) -> dict[str, set[str]]:
    """The modules of the packages `tops` each one imports (itself left out), across the packages too:
    what an import cycle is made of. Every import counts, as in `imports_of`: one inside a function runs
    when it is called, and one under `if TYPE_CHECKING:` is still a module that names this one's caller
    (a helper typed with the class that calls it is the two modules tangled, whether or not an import
    order can break on it). Unlike `imports_of`, `import P.m` is an edge to P.m; `from P import m` is an
    edge to P.m when that is a module, else (a name defined in P) to P. Python imports a module's parent
    packages first however it is named, so that edge is implicit and never counted: a submodule writing
    `from ckptvault.formats import _fs` while formats/__init__.py imports that submodule is no cycle; one
    taking a name that formats/__init__.py defines is."""
    paths = sorted(p for top in tops for p in (root / top).rglob("*.py"))
    modules = {module_name(p, root) for p in paths}

    def owner(name: str) -> str:  # the module a dotted name is, or is defined in ("" outside `tops`)
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {}
    for path in paths:
        me = module_name(path, root)
        out: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _from_target(node, path, root)
                out.update(sub if (sub := f"{base}.{alias.name}") in modules else owner(base) for alias in node.names)
        edges[me] = out - {me, ""}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


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
    found = violations(ROOT)
    assert not found, "\n".join(found)


def test_the_shipped_code_has_no_import_cycle() -> None:
    found = cycles(module_edges(ROOT))
    assert not found, "import cycles (each the modules of one):\n" + "\n".join(" <-> ".join(c) for c in found)


def unit_of(name: str) -> str:
    """The unit an arrow is counted between: a top-level package's subpackage or root module
    (ckptvault.store.s3 -> ckptvault.store, ckptvault_cli.commands.ls -> ckptvault_cli.commands)."""
    return ".".join(name.split(".")[:2])


def unit_edges(root: Path, tops: tuple[str, ...] = SHIPPED) -> dict[str, set[tuple[str, str]]]:
    """For each unit, the units it imports, each with one `file:line` that does: every import counts,
    inside functions and under TYPE_CHECKING too (an arrow a reader follows is an arrow)."""
    units = {unit_of(module_name(p, root)) for top in tops for p in (root / top).rglob("*.py")} - set(tops)
    edges: dict[str, set[tuple[str, str]]] = {u: set() for u in units}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            me = unit_of(module_name(path, root))
            if me not in units:  # the top package's own __init__
                continue
            for line, target in imports_of(path, root):
                if (to := unit_of(target)) in units and to != me:
                    edges[me].add((to, f"{path.relative_to(root).as_posix()}:{line}"))
    return edges


def upward_arrows(root: Path, tops: tuple[str, ...] = SHIPPED) -> list[str]:
    """Every arrow between two units that import each other, directly or through others: one of the
    two points up."""
    edges = unit_edges(root, tops)
    tangles = cycles({u: {to for to, _ in out} for u, out in edges.items()})
    return sorted(
        f"{where} ({u} -> {to}): {' <-> '.join(c)}" for c in tangles for u in c for to, where in edges[u] if to in c
    )


def test_the_root_holds_only_its_foundations() -> None:
    """A module added to ckptvault/ belongs in the package of its concept (or a new one), not at the root."""
    assert sorted(p.stem for p in (ROOT / "ckptvault").glob("*.py") if p.stem != "__init__") == sorted(ROOT_MODULES)
    packages = sorted(p.parent.name for p in (ROOT / "ckptvault").glob("*/__init__.py"))
    wings_and_services = [w.rpartition(".")[2] for w in WINGS] + ["alerts", "hooks"]
    assert sorted(packages) == sorted((*PACKAGES, *wings_and_services))


def test_no_package_imports_one_that_imports_it_back() -> None:
    found = upward_arrows(ROOT)
    assert not found, "arrows between units that import each other:\n" + "\n".join(found)


def test_the_arrow_check_counts_a_lazy_or_typing_import_back(tmp_path: Path) -> None:
    """The checker itself: a package importing another that imports it back (lazily, for typing only,
    or through a third) is found; arrows that all point one way are not."""
    _tree(
        tmp_path,
        {
            "ckptvault/__init__.py": "",
            "ckptvault/errors.py": "",
            "ckptvault/config.py": "from ckptvault.errors import E\nfrom ckptvault.checkpoint import names\n",
            "ckptvault/checkpoint/names.py": "from ckptvault import errors\n",
            # catalog -> listing's package and back, lazily
            "ckptvault/catalog/table_view.py": "def f():\n    from ckptvault.observe.listing import g\n",
            "ckptvault/observe/listing.py": "from ckptvault.catalog.table_view import f\n",
            # through a third, the way back only for typing
            "ckptvault/store/s3.py": "from ckptvault.codec import frames\n",
            "ckptvault/codec/frames.py": "from ckptvault.clock.timing import phase\n",
            "ckptvault/clock/timing.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ckptvault.store.s3 import S3Store\n",
        },
    )
    assert upward_arrows(tmp_path, ("ckptvault",)) == [
        "ckptvault/catalog/table_view.py:2 (ckptvault.catalog -> ckptvault.observe): "
        "ckptvault.catalog <-> ckptvault.observe",
        "ckptvault/clock/timing.py:3 (ckptvault.clock -> ckptvault.store): "
        "ckptvault.clock <-> ckptvault.codec <-> ckptvault.store",
        "ckptvault/codec/frames.py:1 (ckptvault.codec -> ckptvault.clock): "
        "ckptvault.clock <-> ckptvault.codec <-> ckptvault.store",
        "ckptvault/observe/listing.py:1 (ckptvault.observe -> ckptvault.catalog): "
        "ckptvault.catalog <-> ckptvault.observe",
        "ckptvault/store/s3.py:1 (ckptvault.store -> ckptvault.codec): "
        "ckptvault.clock <-> ckptvault.codec <-> ckptvault.store",
    ]


def test_every_allowed_place_exists() -> None:
    """An exemption for a file or folder that is gone is stale: it would silently allow a newcomer."""
    assert [(r.name, a) for r in RULES for a in r.allowed_in if not (ROOT / a).exists()] == []


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


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        for parent in reversed(path.relative_to(root).parents[:-1]):
            if not (root / parent / "__init__.py").exists():
                (root / parent).mkdir(exist_ok=True)
                (root / parent / "__init__.py").write_text("")
        path.write_text(text)


def test_the_wing_rules_catch_an_arrow_between_wings_or_up_from_below(tmp_path: Path) -> None:
    """The wing rules themselves: every forbidden arrow, written each way an import can be written."""
    for top in SHIPPED:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    _tree(
        tmp_path,
        {
            "ckptvault/ingest/ingest_pass.py": "from ckptvault.restore.plan import load_manifest\n",
            "ckptvault/restore/nodes.py": "def f():\n    from ..ingest import nodes\n",
            "ckptvault/tiering/apply.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    import ckptvault.restore\n",
            "ckptvault/alerts/watch_inputs.py": "from ckptvault.tiering import cost\n",
            "ckptvault/catalog/events.py": "from ckptvault.restore.drill import DrillResult\n",
            "ckptvault/catalog/fold.py": "from ckptvault.alerts import kinds\n",
            # allowed: a wing on the foundations and on alerts, a foundation on another, a wing on itself
            "ckptvault/ingest/steps.py": "from ckptvault import alerts, config\n"
            "from ckptvault.transfer import placement\nfrom ckptvault.catalog import events\nfrom . import discovery\n",
            "ckptvault/catalog/saves.py": "from ckptvault.checkpoint.local_files import LocalFile\n"
            "from ckptvault.catalog import Event\n",
        },
    )
    got = violations(tmp_path)
    assert set(got) == {
        "ckptvault/alerts/watch_inputs.py:1 imports ckptvault.tiering: alerts, below the wings, imports none of them",
        "ckptvault/alerts/watch_inputs.py:1 imports ckptvault.tiering.cost: "
        "alerts, below the wings, imports none of them",
        "ckptvault/catalog/fold.py:1 imports ckptvault.alerts: the foundations import no wing and not alerts",
        "ckptvault/catalog/fold.py:1 imports ckptvault.alerts.kinds: the foundations import no wing and not alerts",
        "ckptvault/catalog/events.py:1 imports ckptvault.restore.drill: the foundations import no wing and not alerts",
        "ckptvault/catalog/events.py:1 imports ckptvault.restore.drill.DrillResult: "
        "the foundations import no wing and not alerts",
        "ckptvault/ingest/ingest_pass.py:1 imports ckptvault.restore.plan: ingest imports no other wing",
        "ckptvault/ingest/ingest_pass.py:1 imports ckptvault.restore.plan.load_manifest: ingest imports no other wing",
        "ckptvault/restore/nodes.py:2 imports ckptvault.ingest: restore imports no other wing",
        "ckptvault/restore/nodes.py:2 imports ckptvault.ingest.nodes: restore imports no other wing",
        "ckptvault/tiering/apply.py:3 imports ckptvault.restore: tiering imports no other wing",
    }


def test_the_cycle_check_catches_a_cycle_and_not_a_package_naming_its_submodule(tmp_path: Path) -> None:
    """A genuine cycle (two modules, or a submodule taking a name its package defines) is found; a
    package facade importing its submodules, which import each other through the package, is not one."""
    _tree(
        tmp_path,
        {
            "ckptvault/__init__.py": "",
            # the facade: no cycle
            "ckptvault/formats/__init__.py": "from ckptvault.formats import dcp\nfrom ckptvault.formats._fs import x\n",
            "ckptvault/formats/_fs.py": "x = 1\n",
            "ckptvault/formats/dcp.py": "from ckptvault.formats import _fs\n",
            # a genuine cycle through a lazy import
            "ckptvault/restore/loadcheck.py": "def f():\n    from ckptvault.restore.safetensors_check import g\n",
            "ckptvault/restore/safetensors_check.py": "from ckptvault.restore.loadcheck import FileCheck\n",
            # a submodule taking a name the package defines, while the package imports it
            "ckptvault/store/__init__.py": "from ckptvault.store.s3 import S3Store\nclass StoreError(Exception): ...\n",
            "ckptvault/store/s3.py": "from . import StoreError\n",
        },
    )
    assert cycles(module_edges(tmp_path)) == [
        ["ckptvault.restore.loadcheck", "ckptvault.restore.safetensors_check"],
        ["ckptvault.store", "ckptvault.store.s3"],
    ]


def test_the_cycle_check_counts_an_import_for_typing_only(tmp_path: Path) -> None:
    """A module imported back only under TYPE_CHECKING (either spelling) closes a cycle, within a package
    or across the shipped ones; helpers typed with a class declared below the module that calls them
    (the catalog's reader, the memory store's protocol) close none."""
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    "
    _tree(
        tmp_path,
        {
            "ckptvault/__init__.py": "",
            # a helper typed with the Catalog that calls it
            "ckptvault/catalog/__init__.py": "from ckptvault.catalog.eventlog import Catalog\n",
            "ckptvault/catalog/eventlog.py": "from ckptvault.catalog import compaction, stats\n"
            "from ckptvault.catalog.reading import CatalogReader\nclass Catalog(CatalogReader): ...\n",
            "ckptvault/catalog/stats.py": typing_only + "from ckptvault.catalog.eventlog import Catalog\n",
            # one typed with the reader below both: no cycle
            "ckptvault/catalog/reading.py": "class CatalogReader: ...\n",
            "ckptvault/catalog/compaction.py": typing_only + "from ckptvault.catalog.reading import CatalogReader\n",
            # typing.TYPE_CHECKING spelled out: a helper typed with the store that imports it, and one
            # typed with a protocol below both
            "ckptvault/store/memory.py": "from ckptvault.store import memory_split, memory_transfer\n",
            "ckptvault/store/memory_split.py": "import typing\nif typing.TYPE_CHECKING:\n"
            "    from ckptvault.store.memory import MemoryStore\n",
            "ckptvault/store/memory_transfer.py": "import typing\nif typing.TYPE_CHECKING:\n"
            "    from ckptvault.store.memory_bucket import MemoryBucket\n",
            "ckptvault/store/memory_bucket.py": "class MemoryBucket: ...\n",
            # across two shipped packages: a lazy import one way, one for typing the other
            "ckptvault_cli/output.py": "def emit_json():\n    from ckptvault_prefect.runtime import events\n",
            "ckptvault_prefect/runtime/events.py": typing_only + "from ckptvault_cli.output import emit_json\n",
        },
    )
    assert cycles(module_edges(tmp_path)) == [
        ["ckptvault.catalog.eventlog", "ckptvault.catalog.stats"],
        ["ckptvault.store.memory", "ckptvault.store.memory_split"],
        ["ckptvault_cli.output", "ckptvault_prefect.runtime.events"],
    ]
