"""The demo's shared config and the simulated trainer `make up` runs (ckptvault_cli/demo.py, trainer.py), on
a temporary directory: the config both write and keep, the steps a rerun continues from, the trainer's saves
committed by their format's rule and pruned to the newest few, and the formats ckptvault discovers in them."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from ckptvault.config import load_config


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("DEMO_DIR", str(tmp_path / "demo"))
    monkeypatch.setenv("STATE_ROOT", str(tmp_path / "state"))
    import ckptvault_cli.demo as module

    return importlib.reload(module)  # DEMO and STATE_ROOT are read at import


def test_the_shared_config_has_every_run_one_prefix_and_is_kept_once_the_user_owns_it(demo: ModuleType) -> None:
    from ckptvault_cli import trainer

    path: Path = demo.write_config("http://127.0.0.1:9", "seaweedfs")
    cfg = load_config(str(path))
    assert cfg.store.prefix == "demo" and cfg.store.deletes == "tier-only"
    runs = {s.run for s in cfg.sources}
    assert runs == {r[0] for r in demo.RUNS} | {r.run for r in trainer.RUNS}
    assert all(Path(s.path).is_dir() for s in cfg.sources)
    # rewritten while the marker is there (a new endpoint)...
    demo.write_config("http://127.0.0.1:10", "seaweedfs")
    assert 'endpoint_url = "http://127.0.0.1:10"' in path.read_text()
    # ...and left alone once the user took it over
    mine = path.read_text().split("\n", 1)[1]
    path.write_text(mine)
    demo.write_config("http://127.0.0.1:11", "seaweedfs")
    assert path.read_text() == mine


def test_a_rerun_goes_on_past_the_last_demos_steps(demo: ModuleType) -> None:
    steps = [100, 200, 300]
    assert demo._steps(steps, 0) == steps
    assert demo._steps(steps, 1) == [400, 500, 600]
    assert demo._steps([1000, 2000], 2) == [5000, 6000]


def test_seed_writes_the_demos_checkpoints_once(demo: ModuleType) -> None:
    demo.write_config("http://127.0.0.1:9", "seaweedfs")
    assert demo.seed() == 0
    hot: Path = demo.DEMO / "hot"
    assert sorted(p.name for p in (hot / "llama-8b-hf").iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-100",
        "checkpoint-200",
        "checkpoint-300",
    ]
    assert (hot / "gpt-ds" / "latest").read_text().strip() == "global_step2000"
    before = {p: p.stat().st_mtime_ns for p in hot.rglob("*") if p.is_file()}
    demo.seed()
    assert {p: p.stat().st_mtime_ns for p in hot.rglob("*") if p.is_file()} == before


def test_the_trainer_saves_commits_and_keeps_the_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from ckptvault.ingest.discovery import discover
    from ckptvault_cli import trainer

    monkeypatch.setenv("CKPTVAULT_HOOK_SIGNAL", "off")  # the hook's channel is tested in test_hooks.py
    for _ in range(4):
        for live in trainer.RUNS:
            trainer.save(tmp_path, live, 2**16, keep=3)
    assert trainer.saved_steps(tmp_path / "live-hf", "hf") == [200, 300, 400]
    assert trainer.saved_steps(tmp_path / "live-ds", "deepspeed") == [200, 300, 400]
    assert (tmp_path / "live-ds" / "latest").read_text().strip() == "global_step400"
    # a restarted trainer goes on from the newest save on disk
    assert trainer.save(tmp_path, trainer.RUNS[0], 2**16, keep=3) == 500
    for live in trainer.RUNS:  # ingest's own discovery finds each save finished, by its format's commit rule
        found = discover(live.run, tmp_path / live.run, "auto", 0.0, time.time() + 60).found
        assert {f.format for f in found} == {live.fmt}
        assert [f.step for f in found if f.ready] == trainer.saved_steps(tmp_path / live.run, live.fmt)
