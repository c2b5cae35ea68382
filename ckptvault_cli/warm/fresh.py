"""What a warm process may still run: code and settings unchanged since its imports, and a working
directory whose Prefect settings files would not have changed them (ckptvault_cli/warm/server.py)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys

# Prefect reads these from the working directory when it is imported: a command run from a directory that
# has one must import Prefect there, so it runs cold.
PREFECT_CWD_FILES = (".env", "prefect.toml")


def stamp() -> tuple[int, ...]:
    """Changes when code or settings a command would read differ from what this process imported: every
    .py file of ckptvault's packages, the site-packages directories (pip replacing a package changes
    them), the interpreter, the Prefect profile and logging files. Not the other sys.path entries: a
    working directory there changes whenever a file is made in it."""
    found: list[int] = []
    roots: list[str] = []
    for name in ("ckptvault", "ckptvault_cli", "ckptvault_prefect"):
        mod = sys.modules.get(name) or importlib.import_module(name)
        roots.extend(getattr(mod, "__path__", []))
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for f in files:
                if f.endswith(".py"):
                    with contextlib.suppress(OSError):
                        found.append(os.stat(os.path.join(dirpath, f)).st_mtime_ns)
    packages = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    for p in [*packages, sys.executable, *_prefect_files()]:
        try:
            found.append(os.stat(p or ".").st_mtime_ns)
        except OSError:
            found.append(0)
    return (len(found), sum(found) % (1 << 62), max(found, default=0))


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
