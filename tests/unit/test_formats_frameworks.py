"""Layouts on files written with torch.save as the frameworks write them (not synthetic bytes): DeepSpeed's
custom save tags, ordered by the global_steps its model states record."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from ckptvault.formats import deepspeed as ds
from ckptvault.formats import detect_layout, get_layout
from ckptvault.ingest.discovery import discover


def _model_states(d: Path, global_steps: int, **extra: Any) -> None:
    """What DeepSpeedEngine._save_checkpoint writes (deepspeed/runtime/engine.py _common_checkpoint_state):
    a module state dict, bookkeeping ints, and the config object that makes weights_only refuse it."""
    d.mkdir(parents=True, exist_ok=True)
    state = {
        "module": {"0.weight": torch.randn(8, 4), "0.bias": torch.zeros(8)},
        "buffer_names": [],
        "optimizer": None,
        "lr_scheduler": {"last_epoch": global_steps + 100, "global_steps": global_steps + 7},  # a nested decoy
        "skipped_steps": 0,
        "global_steps": global_steps,
        "global_samples": global_steps * 8,
        "ds_config": argparse.Namespace(train_batch_size=8),
        **extra,
    }
    torch.save(state, d / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"state": {}}}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")


def _candidates(root: Path) -> list[tuple[str, int, bool]]:
    return [(c.path.name, c.step, c.complete) for c in get_layout("deepspeed").candidates(root)]


def test_recorded_step_is_the_top_level_global_steps_read_by_opcodes(tmp_path: Path) -> None:
    # a one-item nested dict is pickled with SETITEM, not SETITEMS: it must not be taken for the top level
    _model_states(tmp_path / "t", 1234, client={"global_steps": 5})
    assert ds.recorded_step(tmp_path / "t") == 1234
    big = 2**40 + 3  # LONG1, not BININT
    _model_states(tmp_path / "big", big)
    assert ds.recorded_step(tmp_path / "big") == big


def test_recorded_step_of_unreadable_model_states_is_none(tmp_path: Path) -> None:
    _model_states(tmp_path / "t", 10)
    f = tmp_path / "t" / "mp_rank_00_model_states.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # killed mid-write: no zip end record
    assert ds.recorded_step(tmp_path / "t") is None
    d = tmp_path / "no-steps"
    d.mkdir()
    torch.save({"module": {}}, d / "mp_rank_00_model_states.pt")
    assert ds.recorded_step(d) is None
    assert ds.recorded_step(tmp_path / "absent") is None


def test_custom_tags_are_found_through_latest_and_ordered_by_global_steps(tmp_path: Path) -> None:
    for tag, step in (("warmup-done", 200), ("epoch3-loss0.25", 400), ("final", 600)):
        _model_states(tmp_path / tag, step)
    (tmp_path / "logs").mkdir()  # not a tag: no rank files
    (tmp_path / "logs" / "events.txt").write_text("x")
    assert _candidates(tmp_path) == [
        ("warmup-done", 200, False),
        ("epoch3-loss0.25", 400, False),
        ("final", 600, False),
    ]
    (tmp_path / "latest").write_text("final")
    assert detect_layout(tmp_path).name == "deepspeed"
    assert _candidates(tmp_path) == [("warmup-done", 200, True), ("epoch3-loss0.25", 400, True), ("final", 600, True)]
    found = discover("r", tmp_path, "auto", 0, time.time() + 1)
    assert [(f.step, f.ready, f.path.name) for f in found.found] == [
        (200, True, "warmup-done"), (400, True, "epoch3-loss0.25"), (600, True, "final"),
    ]  # fmt: skip
    assert get_layout("deepspeed").pointer_file(600, "final") == ("latest", "final")


def test_a_custom_tag_newer_than_latest_is_still_being_saved(tmp_path: Path) -> None:
    _model_states(tmp_path / "a", 2)
    (tmp_path / "latest").write_text("a")
    _model_states(tmp_path / "b", 4)  # written, `latest` not rewritten yet
    (c,) = [c for c in get_layout("deepspeed").candidates(tmp_path) if c.path.name == "b"]
    assert (c.step, c.complete) == (4, False)
    assert "'latest' names a (step 2); b (step 4) is still being saved" in c.reason
    # and global_step<N> directories are ordered against a custom tag by its recorded step
    _model_states(tmp_path / "global_step1", 1)
    _model_states(tmp_path / "global_step3", 3)
    assert _candidates(tmp_path) == [
        ("global_step1", 1, True),
        ("a", 2, True),
        ("global_step3", 3, False),
        ("b", 4, False),
    ]


def test_latest_naming_a_tag_whose_model_states_do_not_read(tmp_path: Path) -> None:
    _model_states(tmp_path / "global_step2", 2)
    _model_states(tmp_path / "run7", 4)
    f = tmp_path / "run7" / "mp_rank_00_model_states.pt"
    f.write_bytes(f.read_bytes()[:100])
    (tmp_path / "latest").write_text("run7")
    by_name = {c.path.name: c for c in get_layout("deepspeed").candidates(tmp_path)}
    assert (by_name["run7"].step, by_name["run7"].complete) == (7, False)  # the digits of its name, until it reads
    assert "does not read yet" in by_name["run7"].reason and "global_steps is unknown" in by_name["run7"].reason
    assert not by_name["global_step2"].complete and "cannot be ordered" in by_name["global_step2"].reason
    # a tag not named by latest whose model states do not read is no candidate at all (no step to give it)
    (tmp_path / "latest").write_text("global_step2")
    assert _candidates(tmp_path) == [("global_step2", 2, True)]


def test_a_custom_tag_still_needs_every_rank_file(tmp_path: Path) -> None:
    _model_states(tmp_path / "final", 6)
    torch.save({}, tmp_path / "final" / "zero_pp_rank_2_mp_rank_00_optim_states.pt")  # ranks 0 and 2, not 1
    (tmp_path / "latest").write_text("final")
    (c,) = get_layout("deepspeed").candidates(tmp_path)
    assert not c.complete and "zero_pp_rank_1_mp_rank_00_optim_states.pt" in c.reason
