"""What a warm process may still run: code and settings unchanged since its imports, and a working
directory whose Prefect settings files would not have changed them (ckptvault_cli/warm/server.py)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import os
import sys
from collections.abc import Sequence

# Prefect reads these from the working directory when it is imported: a command run from a directory that
# has one must import Prefect there, so it runs cold.
PREFECT_CWD_FILES = (".env", "prefect.toml")
PACKAGES = ("ckptvault", "ckptvault_cli", "ckptvault_prefect")


def loaded_extensions() -> tuple[str, ...]:
    """The files of the compiled extension modules this process has loaded, wherever they lie. Taken
    once, when the warm process is ready (`stamp`'s `extensions`): the process loads more later (its spare
    gate child's set-up), and those it did not have at its imports are not what it runs."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = {f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)}
    return tuple(sorted(f for f in found if f.endswith(suffixes)))


def package_roots() -> list[str]:
    roots: list[str] = []
    for name in PACKAGES:
        mod = sys.modules.get(name) or importlib.import_module(name)
        roots.extend(getattr(mod, "__path__", []))
    return roots


def watched(extensions: Sequence[str] = (), roots: Sequence[str] | None = None) -> list[str]:
    """Every file whose change would make a command behave otherwise than what this process imported:
    - every file of ckptvault's packages but their bytecode caches: the .py files, any compiled extension,
      the package data a command reads (ckptvault/data/prices.toml, the deployments' prefect.yaml);
    - `extensions`, the compiled extensions loaded (`loaded_extensions`): one rebuilt in place (an
      editable install of a dependency) changes no directory read below;
    - the site-packages directories (pip adding, replacing or removing a package changes them), the
      interpreter, the Prefect profile and logging files.
    Not the other sys.path entries: a working directory there changes whenever a file is made in it.
    Not the bytecode caches: a cold command of another Python writes its own beside ours, and a cache is
    stale only when its .py file changed, which counts already.
    `roots` given (a test's own tree): those instead of ckptvault's packages, and no Prefect files."""
    found: list[str] = []
    for root in package_roots() if roots is None else roots:
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found.extend(os.path.join(dirpath, f) for f in sorted(files))
    packages = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    return [*found, *extensions, *packages, sys.executable, *(_prefect_files() if roots is None else [])]


def stamp(extensions: Sequence[str] = (), roots: Sequence[str] | None = None) -> str:
    """Changes when any `watched` file does: its modification time, size or inode (a file replaced
    by another keeps neither), or a file is added or removed."""
    h = hashlib.sha256()
    for path in watched(extensions, roots):
        try:
            st = os.stat(path or ".")
            h.update(f"{path}\0{st.st_mtime_ns}\0{st.st_size}\0{st.st_ino}\n".encode("utf-8", "surrogateescape"))
        except OSError:
            h.update(f"{path}\0-\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _prefect_files() -> list[str]:
    from prefect.settings import PREFECT_LOGGING_SETTINGS_PATH, PREFECT_PROFILES_PATH

    return [str(PREFECT_PROFILES_PATH.value()), str(PREFECT_LOGGING_SETTINGS_PATH.value())]


def prefect_settings_in(cwd: str) -> bool:
    """`cwd` has a file Prefect would read its settings from at import: `.env`, `prefect.toml`, or a
    pyproject.toml with a [tool.prefect] table."""
    if any(os.path.exists(os.path.join(cwd, f)) for f in PREFECT_CWD_FILES):
        return True
    try:
        with open(os.path.join(cwd, "pyproject.toml"), "rb") as f:
            return b"[tool.prefect" in f.read()
    except OSError:
        return False
