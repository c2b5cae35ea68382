"""The library imports no Prefect, proved at run time: every module of ckptvault/ imported in one fresh
interpreter, and after each import neither `prefect`, a `prefect.*` module nor `prefect_dask` is loaded.

test_architecture.py reads the source and catches an import written in ckptvault/; this catches what
the source does not show: a dependency, or one of ours it drags in, that loads Prefect itself. The
first module after whose import Prefect is loaded is the one named, so a failure says where to look.

Two modules import a training framework at their top, as their hook classes subclass its callbacks:
they need the `frameworks` extra, which `make venv` installs. Without it they fail here by name
rather than being skipped: a module this test cannot import is a module it has not proved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[2]
PREFECT = ("prefect", "prefect_dask")
# module -> the extra (pyproject.toml) whose package it imports at its top
NEEDS_EXTRA = {"ckptvault.hooks.hf": "frameworks", "ckptvault.hooks.lightning": "frameworks"}

# Run in a child: this test process has long since imported Prefect (conftest, other tests).
CHILD = """
import importlib, json, sys
from pathlib import Path

root, package, banned = Path(sys.argv[1]), sys.argv[2], tuple(sys.argv[3].split(","))
names = sorted(
    ".".join(p.relative_to(root).with_suffix("").parts[: -1 if p.name == "__init__.py" else None])
    for p in (root / package).rglob("*.py")
)
failed, pulled_in_by, loaded = {}, None, []
for name in names:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in banned)
    if loaded:
        pulled_in_by = name
        break
print(json.dumps({"modules": names, "failed": failed, "pulled_in_by": pulled_in_by, "loaded": loaded[:5]}))
"""


class Walk(TypedDict):
    modules: list[str]  # every module found, in import order
    failed: dict[str, str]  # module -> why it could not be imported
    pulled_in_by: str | None  # the first module after whose import Prefect was loaded
    loaded: list[str]  # the Prefect modules loaded then (the first five)


def import_each(root: Path, package: str) -> Walk:
    """Import every module of `package` (under `root`) in order in a fresh interpreter, stopping at the
    first after which Prefect is loaded."""
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", CHILD, str(root), package, ",".join(PREFECT)],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: Walk = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_no_module_of_the_library_loads_prefect() -> None:
    result = import_each(ROOT, "ckptvault")
    assert result["pulled_in_by"] is None, f"importing {result['pulled_in_by']} loads {result['loaded']}"
    failed = result["failed"]
    assert not failed, "\n".join(
        f"{name} cannot be imported ({why})"
        + (f"; it needs the {NEEDS_EXTRA[name]} extra: `make venv`" if name in NEEDS_EXTRA else "")
        for name, why in failed.items()
    )
    modules = result["modules"]
    # the walk found the library, not an empty folder: its root, the hooks and the deepest packages
    assert {"ckptvault", "ckptvault.hooks.signal", *NEEDS_EXTRA} <= set(modules)
    assert len(modules) > 100


def test_the_module_that_loads_prefect_is_named(tmp_path: Path) -> None:
    """A planted library whose third module imports a stand-in `prefect`: the walk stops there and names it."""
    (tmp_path / "prefect").mkdir()
    (tmp_path / "prefect" / "__init__.py").write_text("")
    (tmp_path / "prefect" / "events.py").write_text("")
    lib = tmp_path / "lib"
    (lib / "sub").mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "a.py").write_text("import json\n")
    (lib / "sub" / "__init__.py").write_text("")
    (lib / "sub" / "b.py").write_text("def later():\n    import prefect\n")  # lazily: not at import
    (lib / "sub" / "c.py").write_text("from prefect.events import *\n")
    (lib / "z.py").write_text("")
    result = import_each(tmp_path, "lib")
    assert result["modules"] == ["lib", "lib.a", "lib.sub", "lib.sub.b", "lib.sub.c", "lib.z"]
    assert result["pulled_in_by"] == "lib.sub.c"
    assert result["loaded"] == ["prefect", "prefect.events"]
    assert result["failed"] == {}
