"""Which working directories a warm process must not run a command from (ckptvault_cli/warm/fresh.py):
those where Prefect, imported there, would read settings the warm process never saw."""

from __future__ import annotations

from pathlib import Path

from ckptvault_cli.warm import fresh as warm_fresh


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


def test_the_stamp_is_the_same_while_nothing_changes() -> None:
    assert warm_fresh.stamp() == warm_fresh.stamp()
