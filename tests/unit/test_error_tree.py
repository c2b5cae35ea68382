"""One error tree: every exception class the shipped code defines derives from `CkptvaultError`
(ckptvault/errors.py), so an entry point that catches it catches everything ckptvault raises on purpose.

Read from the source, like tests/unit/test_architecture.py: each class's bases are resolved through
its module's imports (relative ones too, and the re-exports of a package's `__init__`) to the class
they name, in the shipped packages or outside them. A class is an exception when a base is: a shipped
exception, or an outside class that is a `BaseException` (imported to tell; a module that is not
installed, torch in a slim environment, is judged by the base's name ending in Error or Exception).
"""

from __future__ import annotations

import ast
import builtins
import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.unit.test_architecture import ROOT, SHIPPED, module_name

TREE_ROOT = "ckptvault.errors.CkptvaultError"

# Exception classes kept outside the tree on purpose, each with why.
OUTSIDE: dict[str, str] = {
    "ckptvault.catalog.layout._Vanished": (
        "the catalog's private retry signal (a listed object deleted by a compaction: list again), raised "
        "and caught inside ckptvault/catalog/; not a failure with a message for the operator, so an entry "
        "point's `except CkptvaultError` must not print it as one should one ever escape"
    ),
    "ckptvault_cli.warm.server._Become": (
        "a forked child leaving the warm process's loop to run its command (a BaseException, so no "
        "`except Exception` on the way stops it); raised and caught inside"
        " ckptvault_cli/warm/server.py, never a failure"
    ),
}


@dataclass(frozen=True)
class ClassDef:
    module: str
    name: str
    bases: tuple[str, ...]  # as written (dotted), resolved against `module` on demand
    where: str  # path:line, for the message


class Tree:
    """The classes and import aliases of every module under `root`'s shipped packages."""

    def __init__(self, root: Path, tops: tuple[str, ...] = SHIPPED) -> None:
        self.classes: dict[str, ClassDef] = {}
        self.local: dict[str, set[str]] = {}
        self.aliases: dict[str, dict[str, str]] = {}
        for top in tops:
            for path in sorted((root / top).rglob("*.py")):
                self._read(path, root)

    def _read(self, path: Path, root: Path) -> None:
        me = module_name(path, root)
        tree = ast.parse(path.read_text(), filename=str(path))
        package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
        aliases = self.aliases.setdefault(me, {})
        local = self.local.setdefault(me, set())
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(tree):  # a lazy import inside a function binds a name too
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:  # `import a.b` binds `a`
                        head = alias.name.split(".")[0]
                        aliases[head] = head
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.ClassDef):
                bases = tuple(d for d in (_dotted(b) for b in node.bases) if d)
                local.add(node.name)
                self.classes[f"{me}.{node.name}"] = ClassDef(me, node.name, bases, f"{rel}:{node.lineno}")

    def resolve(self, module: str, dotted: str) -> str:
        """The full name of what `dotted`, written in `module`, names."""
        head, _, rest = dotted.partition(".")
        if not rest and head in self.local.get(module, ()):
            return f"{module}.{head}"
        if head in self.aliases.get(module, {}):
            full = self.aliases[module][head] + (f".{rest}" if rest else "")
        else:
            full = f"builtins.{dotted}"
        return self.canonical(full)

    def canonical(self, full: str, hops: int = 0) -> str:
        """`full` with every re-export followed to the module that defines it."""
        if full in self.classes or hops > 20:
            return full
        module, _, name = full.rpartition(".")
        target = self.aliases.get(module, {}).get(name)
        if target is not None and target != full:
            return self.canonical(target, hops + 1)
        return full

    def derives(self, full: str, ancestor: str) -> bool:
        if full == ancestor:
            return True
        cls = self.classes.get(full)
        return cls is not None and any(self.derives(self.resolve(cls.module, b), ancestor) for b in cls.bases)

    def is_exception(self, full: str) -> bool:
        cls = self.classes.get(full)
        if cls is not None:
            return any(self.is_exception(self.resolve(cls.module, b)) for b in cls.bases)
        module, _, name = full.rpartition(".")
        if module in self.aliases:  # a shipped module without such a class: not one of ours to judge
            return False
        return _outside_is_exception(module, name)


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        head = _dotted(expr.value)
        return f"{head}.{expr.attr}" if head else None
    if isinstance(expr, ast.Subscript):  # Generic[T], Protocol[T]
        return _dotted(expr.value)
    return None


def _outside_is_exception(module: str, name: str) -> bool:
    if module == "builtins":
        obj = getattr(builtins, name, None)
    else:
        try:
            obj = importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
        except ImportError:
            return name.endswith(("Error", "Exception"))
        except AttributeError:
            return False
    return isinstance(obj, type) and issubclass(obj, BaseException)


def outside_the_tree(root: Path, allowed: Mapping[str, str] = OUTSIDE) -> list[str]:
    """Each exception class under `root` not derived from CkptvaultError and not in `allowed`, and each
    `allowed` entry that is no longer such a class (a stale exemption)."""
    tree = Tree(root)
    found: list[str] = []
    outside: set[str] = set()
    for full, cls in sorted(tree.classes.items()):
        if full == TREE_ROOT or not tree.is_exception(full) or tree.derives(full, TREE_ROOT):
            continue
        outside.add(full)
        if full not in allowed:
            found.append(f"{cls.where} {cls.name}({', '.join(cls.bases)}): an exception outside CkptvaultError")
    found += [f"{name}: allowed outside the tree, but no such exception is" for name in sorted(set(allowed) - outside)]
    return found


def exceptions_in(root: Path) -> Iterator[str]:
    tree = Tree(root)
    return (full for full in sorted(tree.classes) if tree.is_exception(full))


def test_every_exception_of_the_shipped_code_derives_from_ckptvault_error() -> None:
    assert outside_the_tree(ROOT) == []


def test_the_walk_finds_the_exceptions_it_should() -> None:
    """Against a walk that finds nothing: classes known to be exceptions, each kind of base among them."""
    found = set(exceptions_in(ROOT))
    assert {
        "ckptvault.errors.InvalidArgumentError",  # (CkptvaultError, ValueError)
        "ckptvault.store.errors.NotFoundError",  # through StoreError
        "ckptvault.restore.drill.DrillFailed",  # through AlreadyAlerted, from another module
        "ckptvault_cli.preflight.UsageError",
        "ckptvault.catalog.layout._Vanished",
    } <= found
    assert "ckptvault.store.port.TransferConfig" not in found
    assert "ckptvault.store.s3.S3Store" not in found


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_check_catches_an_exception_outside_the_tree_however_its_base_is_written(tmp_path: Path) -> None:
    """The checker itself, on a tree of its own: each way a base can be written, in and out of the tree."""
    for init in ("ckptvault", "ckptvault_cli", "ckptvault_prefect", "ckptvault/store", "ckptvault_prefect/flows"):
        _write(tmp_path, f"{init}/__init__.py", "")
    _write(tmp_path, "ckptvault/errors.py", "class CkptvaultError(Exception):\n    pass\n")
    _write(
        tmp_path,
        "ckptvault/store/errors.py",
        "from ckptvault.errors import CkptvaultError\n\nclass StoreError(CkptvaultError):\n    pass\n",
    )
    _write(tmp_path, "ckptvault/store/__init__.py", "from ckptvault.store.errors import StoreError\n")
    _write(
        tmp_path,
        "ckptvault/good.py",
        "import botocore.exceptions\n"
        "from ckptvault import store\n"
        "from .errors import CkptvaultError as Root\n"
        "class Good(Root, ValueError):\n    pass\n"
        "class ViaPackage(store.StoreError):\n    pass\n"
        "class Grandchild(ViaPackage):\n    pass\n"
        "class Mixed(botocore.exceptions.ClientError, Good):\n    pass\n"
        "class NotAnError(dict):\n    pass\n",
    )
    _write(
        tmp_path,
        "ckptvault_prefect/flows/bad.py",
        "import botocore.exceptions as bx\n"
        "from prefect_dask.task_runners import DaskTaskRunner\n"
        "class Bad(RuntimeError):\n    pass\n"
        "class Child(Bad):\n    pass\n"
        "class Remote(bx.ClientError):\n    pass\n"
        "class Runner(DaskTaskRunner):\n    pass\n"
        "def f():\n    from not_installed_anywhere import SomeError\n"
        "    class Lazy(SomeError):\n        pass\n"
        "    class Inner(KeyError):\n        pass\n",
    )
    _write(tmp_path, "ckptvault_cli/usage.py", "class UsageError(Exception):\n    pass\n")
    _write(tmp_path, "ckptvault_cli/kept.py", "class _Signal(Exception):\n    pass\n")

    got = outside_the_tree(tmp_path, {"ckptvault_cli.kept._Signal": "why", "ckptvault.gone._Old": "why"})
    assert got == [
        "ckptvault_cli/usage.py:1 UsageError(Exception): an exception outside CkptvaultError",
        "ckptvault_prefect/flows/bad.py:3 Bad(RuntimeError): an exception outside CkptvaultError",
        "ckptvault_prefect/flows/bad.py:5 Child(Bad): an exception outside CkptvaultError",
        "ckptvault_prefect/flows/bad.py:15 Inner(KeyError): an exception outside CkptvaultError",
        "ckptvault_prefect/flows/bad.py:13 Lazy(SomeError): an exception outside CkptvaultError",
        "ckptvault_prefect/flows/bad.py:7 Remote(bx.ClientError): an exception outside CkptvaultError",
        "ckptvault.gone._Old: allowed outside the tree, but no such exception is",
    ]
