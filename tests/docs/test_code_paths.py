"""Every code path the docs name exists: a reader who follows `ckptvault/restore/steps.py` or
`ckptvault.store.port.ObjectStore` from README.md, docs/, bench/README.md or a folder's README must find
it, so a module moved or a function renamed fails here, not in a reader's editor.

What counts as a code path, in every Markdown file the repository ships as its documentation:
- a repository path (`ckptvault/store/s3.py`, `tests/unit/`, `infra/k8s/worker.yaml`, globs too), resolved
  against the repository's root or the doc's own folder (a README cites its neighbours so);
- a backticked `.py` path with a folder (`store/s3.py`, `tasks/restore.py`): a file under the doc's
  folder, the root or one of the three shipped packages (docs/ARCHITECTURE.md writes library paths so);
- a backticked dotted name of the shipped packages (`ckptvault.store.open_store`,
  `ckptvault_prefect.flows.ingest.ingest`): a module, or a name one defines or imports. A dotted name the
  code spells as a string (an event such as `ckptvault.checkpoint.saved`, a metadata key such as
  `ckptvault.covers`) is a name of the format, not a code path, and counts as existing.
tests/docs/test_operations_paths.py checks the Kubernetes and Terraform docs' other names.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("ckptvault", "ckptvault_cli", "ckptvault_prefect")
TOPS = (*SHIPPED, "infra", "docs", "tests", "bench", "deployments", "flows", "tasks", "examples", ".ci")
# A repository path in running text: not the tail of a longer path, URL or ${VAR}/..., nor an absolute path.
REPO_PATH = re.compile(rf"(?<![\w$./<>:@-])((?:{'|'.join(re.escape(t) for t in TOPS)})/[\w.*/-]*)")
RELATIVE_PY = re.compile(r"`([\w-]+(?:/[\w-]+)*/[\w-]+\.py)(?::\w+)?`")
DOTTED = re.compile(rf"`((?:{'|'.join(SHIPPED)})(?:\.\w+)+)")
# Paths the docs name that are on purpose not in the repository, with why.
NOT_PATHS: dict[str, str] = {
    "infra/terraform/backend.tf": "the reader's copy of backend.tf.example (docs/OPERATIONS.md says to make it)",
    "megatron/training/checkpointing.py": "Megatron-LM's own source, whose commit rule docs/reliability.md cites",
}
# Dotted names the docs cite that are neither code nor a string the code writes, with why.
NOT_CODE: dict[str, str] = {
    "ckptvault.digest": "the file an image build writes its digest to (docs/OPERATIONS.md)",
    "ckptvault.io": "the domain of the node label ckptvault.io/node (infra/k8s/README.md)",
}


def documents() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found += sorted(p for top in TOPS if top != "docs" for p in (ROOT / top).rglob("README.md"))
    return [p for p in found if ".venv" not in p.parts and "node_modules" not in p.parts]


def _path_exists(text: str, doc: Path, bases: tuple[Path, ...]) -> bool:
    text = text.rstrip(".,:;)")
    if not text or text in NOT_PATHS:
        return True
    for base in (doc.parent, *bases):
        if "*" in text:
            if any(base.glob(text.rstrip("/"))):
                return True
        elif (base / text).exists():
            return True
    return False


@cache
def _defined(path: Path) -> frozenset[str]:
    """The names a module defines or imports at any depth (a class's methods too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _module_strings(tree: ast.Module) -> set[str]:
    """A module's string literals, and its module-level constants built from others by an f-string
    (`VERIFIED = f"{CHECKPOINT}.verified"`), as the code writes them."""
    found = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    found |= {
        n.value.decode(errors="replace")
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, bytes)
    }
    known: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            known[node.targets[0].id] = value.value
        elif isinstance(value, ast.JoinedStr):
            parts = []
            for part in value.values:
                if isinstance(part, ast.Constant):
                    parts.append(str(part.value))
                elif (
                    isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.value.id in known
                ):
                    parts.append(known[part.value.id])
                else:
                    break
            else:
                known[node.targets[0].id] = "".join(parts)
                found.add(known[node.targets[0].id])
    return found


@cache
def _string_constants() -> frozenset[str]:
    """Every `ckptvault...` name the shipped code writes as a string: the event names, keys and labels."""
    found: set[str] = set()
    for top in SHIPPED:
        for path in (ROOT / top).rglob("*.py"):
            for value in _module_strings(ast.parse(path.read_text(), filename=str(path))):
                found.update(re.findall(r"ckptvault[\w.]*\w", value))
    return frozenset(found)


def dotted_exists(name: str) -> bool:
    if name in NOT_CODE:
        return True
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ROOT.joinpath(*parts[:i])
        source = module / "__init__.py" if module.is_dir() else module.with_suffix(".py")
        if source.is_file():
            rest = parts[i:]
            if not rest or rest[0] in _defined(source):
                return True
            break
    strings = _string_constants()
    return name in strings or any(s.startswith(name + ".") for s in strings)


def missing(doc: Path) -> list[str]:
    text = doc.read_text()
    rel = doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else doc.name
    found: list[str] = []
    for m in REPO_PATH.finditer(text):
        if not _path_exists(m[1], doc, (ROOT,)):
            found.append(f"{rel}: {m[1]}")
    shipped = tuple(ROOT / top for top in SHIPPED)
    for m in RELATIVE_PY.finditer(text):
        if not _path_exists(m[1], doc, (ROOT, *shipped)):
            found.append(f"{rel}: `{m[1]}`")
    for m in DOTTED.finditer(text):
        if not dotted_exists(m[1]):
            found.append(f"{rel}: `{m[1]}`")
    return found


@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_code_path_a_doc_names_exists(doc: Path) -> None:
    found = missing(doc)
    assert not found, "named in the docs but not in the code (rename it there, or say it is gone):\n" + "\n".join(found)


def test_the_docs_list_covers_the_readmes_and_docs() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in documents()}
    assert {"README.md", "docs/ARCHITECTURE.md", "bench/README.md", "infra/k8s/README.md"} <= names


def test_a_moved_module_or_a_renamed_function_is_caught(tmp_path: Path) -> None:
    """The checker itself: a path, a library-relative path and a dotted name that do not exist are
    reported; ones that do (and an event name the code writes) are not."""
    doc = tmp_path / "planted.md"
    doc.write_text(
        "See ckptvault/store/port.py and `store/s3.py`, `ckptvault.store.open_store`, "
        "`ckptvault.checkpoint.saved`.\n"
        "Gone: ckptvault/store/nowhere.py, `store/nowhere.py`, `ckptvault.store.no_such_function`, "
        "`ckptvault.no_such_module.x`.\n"
    )
    assert missing(doc) == [
        "planted.md: ckptvault/store/nowhere.py",
        "planted.md: `store/nowhere.py`",
        "planted.md: `ckptvault.store.no_such_function`",
        "planted.md: `ckptvault.no_such_module.x`",
    ]


@pytest.mark.parametrize("folder", ["flows", "tasks", "deployments"])
def test_each_project_folder_readme_names_every_module_it_holds(folder: str) -> None:
    """flows/, tasks/ and deployments/ re-export the shipped code; each README's table lists every module
    there (a module added or removed without its line fails), and the paths check above proves the rest."""
    readme = (ROOT / folder / "README.md").read_text()
    held = {p.name for p in (ROOT / folder).iterdir() if p.suffix in (".py", ".yaml") and p.name != "__init__.py"}
    listed = set(re.findall(r"^\| `([\w.]+)` \|", readme, re.M))
    assert listed == held


def test_the_architecture_layout_has_one_line_per_package() -> None:
    """docs/ARCHITECTURE.md's Layout: each package of the three shipped ones on a line of its own under
    its parent, and no line for a package that is gone."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text[text.index("## Layout") :]
    block = block[block.index("```\n") + 4 :]
    block = block[: block.index("```")]
    listed: set[str] = set()
    top = ""
    for line in block.splitlines():
        if m := re.match(r"^(ckptvault\w*)/\s", line):
            top = m[1]
            listed.add(top)
        elif (m := re.match(r"^  ([a-z_]+)/\s", line)) and top:
            listed.add(f"{top}/{m[1]}")
        elif not line.startswith(" "):
            top = ""
    packages = {*SHIPPED} | {  # a top-level one may be a namespace package (ckptvault_cli has no __init__)
        p.parent.relative_to(ROOT).as_posix() for t in SHIPPED for p in (ROOT / t).glob("*/__init__.py")
    }
    assert listed == packages
