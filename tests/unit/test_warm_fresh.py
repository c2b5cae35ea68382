"""What a warm process may still run (ckptvault_cli/warm/fresh.py): not from working directories where
Prefect, imported there, would read settings the warm process never saw, and not once a file that changes
what a command does (code, a compiled extension, package data) changed since its imports.
tests/integration/test_warm_stale.py shows the warm process refusing then, and the command running cold."""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

import pytest

from ckptvault_cli.warm import fresh as warm_fresh

ROOT = Path(__file__).resolve().parents[2]


def test_a_directory_with_prefect_settings_files_is_refused(tmp_path: Path) -> None:
    assert not warm_fresh.prefect_settings_in(str(tmp_path))
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "trainer"\n')
    assert not warm_fresh.prefect_settings_in(str(tmp_path))  # a project, but no Prefect table
    (tmp_path / "pyproject.toml").write_text('[tool.prefect]\napi.url = "http://h/api"\n')
    assert warm_fresh.prefect_settings_in(str(tmp_path))
    for name in warm_fresh.PREFECT_CWD_FILES:
        d = tmp_path / name.strip(".")
        d.mkdir()
        (d / name).write_text("")
        assert warm_fresh.prefect_settings_in(str(d)), name
    assert not warm_fresh.prefect_settings_in(str(tmp_path / "missing"))


def _tree(root: Path) -> dict[str, Path]:
    """A package as ckptvault's are: code, a compiled extension, package data, and a bytecode cache."""
    files = {
        "code": root / "pkg" / "mod.py",
        "extension": root / "pkg" / f"_native{importlib.machinery.EXTENSION_SUFFIXES[0]}",
        "data": root / "pkg" / "data" / "prices.toml",
        "bytecode": root / "pkg" / "__pycache__" / "mod.cpython-311.pyc",
    }
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x = 1\n")
    return files


@pytest.mark.parametrize("kind", ["code", "extension", "data"])
def test_the_stamp_changes_with_any_file_that_changes_behaviour(tmp_path: Path, kind: str) -> None:
    files = _tree(tmp_path)
    roots = [str(tmp_path / "pkg")]
    before = warm_fresh.stamp(roots=roots)
    assert warm_fresh.stamp(roots=roots) == before  # nothing changed: the same
    path = files[kind]
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched (an edit, a rebuild)
    assert warm_fresh.stamp(roots=roots) != before, kind
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert warm_fresh.stamp(roots=roots) == before
    path.write_bytes(b"x = 22\n")  # rewritten, its old modification time put back (cp -p, an unpacked archive)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert warm_fresh.stamp(roots=roots) != before, kind
    path.unlink()
    assert warm_fresh.stamp(roots=roots) != before, kind


def test_a_file_added_changes_the_stamp_and_bytecode_does_not(tmp_path: Path) -> None:
    files = _tree(tmp_path)
    roots = [str(tmp_path / "pkg")]
    before = warm_fresh.stamp(roots=roots)
    # a cold command of another Python writing its own cache: no reason to refuse
    (files["bytecode"].parent / "mod.cpython-312.pyc").write_bytes(b"")
    files["bytecode"].write_bytes(b"other")
    assert warm_fresh.stamp(roots=roots) == before
    (tmp_path / "pkg" / "new.py").write_text("")
    assert warm_fresh.stamp(roots=roots) != before


def test_a_loaded_compiled_extension_outside_the_packages_counts(tmp_path: Path) -> None:
    import pyarrow.lib

    loaded = warm_fresh.loaded_extensions()
    assert pyarrow.lib.__file__ in loaded  # a dependency's extension, where it was loaded from
    ext = tmp_path / f"dep{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    ext.write_bytes(b"\x7fELF")
    (tmp_path / "pkg").mkdir()
    roots = [str(tmp_path / "pkg")]
    before = warm_fresh.stamp([str(ext)], roots)
    os.utime(ext, ns=(0, ext.stat().st_mtime_ns + 1_000_000_000))  # rebuilt in place: no directory changes
    assert warm_fresh.stamp([str(ext)], roots) != before


def test_ckptvaults_own_stamp_covers_its_package_data() -> None:
    watched = warm_fresh.watched()
    for rel in (
        "ckptvault/data/prices.toml",
        "ckptvault_prefect/deployments/prefect.yaml",
        "ckptvault_cli/warm/fresh.py",
    ):
        assert str(ROOT / rel) in watched, rel
    assert not [w for w in watched if "__pycache__" in w]
