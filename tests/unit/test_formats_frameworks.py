"""Layouts on files written with torch.save as the frameworks write them (not synthetic bytes): DeepSpeed's
custom save tags, ordered by the global_steps its model states record; Megatron-LM's legacy
iter_<N>/mp_rank_XX[_PPP]/model_optim_rng.pt, judged by its tracker and drilled without executing it."""

from __future__ import annotations

import argparse
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptvault.formats import deepspeed as ds
from ckptvault.formats import detect_layout, get_layout
from ckptvault.ingest.discovery import discover
from ckptvault.ingest.structure import check_structure
from ckptvault.restore import loadcheck


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


# --- Megatron-LM legacy (ckpt_format torch) ---------------------------------------------------------------

TRACKER = "latest_checkpointed_iteration.txt"


def _legacy_iteration(root: Path, iteration: int, ranks: list[str], tracker: bool = True) -> Path:
    """As megatron/training/checkpointing.py save_checkpoint (ckpt_format "torch") writes one iteration:
    generate_state_dict's keys, torch.save into iter_<N:07d>/<rank dir>/model_optim_rng.pt, then (after the
    barrier) the tracker. args is the argparse.Namespace of the run, rng_state holds Python's and NumPy's
    RNG states: both are why torch.load(weights_only=True) refuses the file."""
    d = root / f"iter_{iteration:07d}"
    for rank in ranks:
        g = torch.Generator().manual_seed(iteration)
        state = {
            "args": argparse.Namespace(num_layers=2, hidden_size=16, tensor_model_parallel_size=len(ranks)),
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "model": {"language_model.encoder.weight": torch.randn(16, 16, generator=g)},
            "optimizer": {"optimizer": {"state": {0: {"exp_avg": torch.zeros(16, 16)}}, "param_groups": []}},
            "opt_param_scheduler": {"num_steps": iteration},
            "rng_state": [{
                "random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                "torch_rng_state": torch.get_rng_state(), "rng_tracker_states": {},
            }],
            "num_floating_point_operations_so_far": 0,
        }  # fmt: skip
        (d / rank).mkdir(parents=True)
        torch.save(state, d / rank / "model_optim_rng.pt")
    if tracker:
        (root / TRACKER).write_text(str(iteration))
    return d


def _megatron(root: Path) -> list[tuple[str, int, bool]]:
    return [(c.path.name, c.step, c.complete) for c in get_layout("megatron").candidates(root)]


def test_megatron_legacy_is_found_by_its_tracker(tmp_path: Path) -> None:
    _legacy_iteration(tmp_path, 10, ["mp_rank_00"])
    assert detect_layout(tmp_path).name == "megatron"
    d = _legacy_iteration(tmp_path, 20, ["mp_rank_00"], tracker=False)  # saved, tracker not rewritten yet
    (c10, c20) = get_layout("megatron").candidates(tmp_path)
    assert (c10.step, c10.complete, c20.step, c20.complete) == (10, True, 20, False)
    assert c20.reason == f"{TRACKER} names iteration 10; 20 is still being saved"
    (tmp_path / TRACKER).write_text("20")
    found = discover("r", tmp_path, "auto", 0, time.time() + 1)
    assert found.problems == []
    assert [(f.step, f.ready, [x.rel for x in f.files]) for f in found.found] == [
        (10, True, ["mp_rank_00/model_optim_rng.pt"]), (20, True, ["mp_rank_00/model_optim_rng.pt"]),
    ]  # fmt: skip
    assert check_structure("megatron", d, found.found[1].files) == []
    assert get_layout("megatron").pointer_file(20, d.name) == (TRACKER, "20")


def test_megatron_legacy_with_pipeline_parallel_needs_every_rank(tmp_path: Path) -> None:
    grid = ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000", "mp_rank_01_001"]  # TP 2 x PP 2
    d = _legacy_iteration(tmp_path, 30, grid)
    assert _megatron(tmp_path) == [("iter_0000030", 30, True)]
    # a later iteration moved the tracker on, but a rank of this one never finished (a crashed save)
    _legacy_iteration(tmp_path, 40, grid)
    shutil.rmtree(d / "mp_rank_01_000")
    (c30, c40) = get_layout("megatron").candidates(tmp_path)
    assert not c30.complete and "mp_rank_01_000/ missing" in c30.reason, c30.reason
    assert c40.complete
    (d / "mp_rank_01_000").mkdir()  # created, file never written
    (c30, _) = get_layout("megatron").candidates(tmp_path)
    assert not c30.complete and "mp_rank_01_000/model_optim_rng.pt missing" in c30.reason, c30.reason


def test_megatron_legacy_drill_reads_its_pickle_without_running_it(tmp_path: Path) -> None:
    """weights_only=True refuses model_optim_rng.pt (argparse.Namespace, NumPy's RNG state): a healthy
    file must pass by its pickle opcodes, a torn one must fail."""
    d = _legacy_iteration(tmp_path, 10, ["mp_rank_00", "mp_rank_01"])
    # torch's weights_only allowlist is process-wide, and importing megatron.core adds argparse.Namespace
    # to it (megatron/core/safe_globals.py): after the framework tests in the same session, torch.load
    # would simply succeed. This test is about the refusal path, so it runs with torch's own list.
    import torch.serialization

    saved = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        _check_legacy_drill(d)
    finally:
        torch.serialization.add_safe_globals(saved)


def _check_legacy_drill(d: Path) -> None:
    report = loadcheck.check(d)
    assert report.problems == [] and report.not_run == []
    lines = report.descriptions()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith("mp_rank_0")
        assert "torch.load(weights_only=True): it refuses argparse.Namespace" in line, line
        assert "pickle opcodes were read, not executed: names argparse.Namespace, numpy." in line, line
    f = d / "mp_rank_01" / "model_optim_rng.pt"
    data = f.read_bytes()
    f.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])  # one flipped byte in the pickle
    (bad,) = loadcheck.check(d).problems
    assert bad.startswith("mp_rank_01/model_optim_rng.pt: "), bad


# --- Lightning: the monitored score, read by opcodes ----------------------------------------------------


def _lightning_ckpt(path: Path, callbacks: dict[str, Any], **top: Any) -> Path:
    """The keys CheckpointConnector.dump_checkpoint writes, with ModelCheckpoint.state_dict() under callbacks."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "epoch": 1, "global_step": 40, "pytorch-lightning_version": "2.6.6",
        "state_dict": {"net.0.weight": torch.randn(4, 4), "net.0.bias": torch.zeros(4)},
        "loops": {"fit_loop": {"epoch_progress": {"total": {"completed": 1}}}},
        "callbacks": callbacks, "optimizer_states": [{"state": {}, "param_groups": []}], "lr_schedulers": [],
        **top,
    }  # fmt: skip
    torch.save(state, path)
    return path


def _checkpoint_state(monitor: str | None, current: Any, best: Any) -> dict[str, Any]:
    return {
        "monitor": monitor, "best_model_score": best, "best_model_path": "/x/epoch=0-step=20.ckpt",
        "current_score": current, "dirpath": "/x", "best_k_models": {"/x/epoch=0-step=20.ckpt": best},
        "kth_best_model_path": "", "kth_value": current, "last_model_path": "",
    }  # fmt: skip


def test_lightning_metrics_are_the_monitored_scores(tmp_path: Path) -> None:
    from ckptvault.formats import read_metrics

    key = "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0}"
    other = "ModelCheckpoint{'monitor': 'train_loss', 'mode': 'min'}"
    f = _lightning_ckpt(
        tmp_path / "epoch=1-step=40.ckpt",
        {key: _checkpoint_state("val_loss", torch.tensor(0.25), torch.tensor(0.125)),
         other: _checkpoint_state("train_loss", torch.tensor(0.5, dtype=torch.float64), torch.tensor([0.375])),
         "EarlyStopping{'monitor': 'val_loss'}": {"wait_count": 0, "best_score": torch.tensor(9.0)}},
    )  # fmt: skip
    assert read_metrics("lightning", f) == {
        "global_step": 40.0, "epoch": 1.0,
        "val_loss": 0.25, "eval_loss": 0.25, "best_val_loss": 0.125,
        "train_loss": 0.5, "loss": 0.5, "best_train_loss": 0.375,
    }  # fmt: skip
    # bf16 and half scores (mixed precision) are read too; a NaN is stored as inf by Lightning and stays inf
    g = _lightning_ckpt(
        tmp_path / "b.ckpt",
        {key: _checkpoint_state("val_loss", torch.tensor(float("inf")), torch.tensor(0.5, dtype=torch.bfloat16))},
    )
    assert read_metrics("lightning", g) == {
        "global_step": 40.0, "epoch": 1.0, "val_loss": float("inf"), "eval_loss": float("inf"), "best_val_loss": 0.5,
    }  # fmt: skip


def test_lightning_without_a_monitor_or_unreadable_records_no_loss(tmp_path: Path) -> None:
    from ckptvault.formats import read_metrics

    f = _lightning_ckpt(tmp_path / "a.ckpt", {"ModelCheckpoint{'monitor': None}": _checkpoint_state(None, None, None)})
    assert read_metrics("lightning", f) == {"global_step": 40.0, "epoch": 1.0}
    a_tensor_not_a_score = _checkpoint_state("val_loss", torch.tensor([1.0, 2.0]), None)
    g = _lightning_ckpt(tmp_path / "b.ckpt", {"ModelCheckpoint{'monitor': 'val_loss'}": a_tensor_not_a_score})
    assert read_metrics("lightning", g) == {"global_step": 40.0, "epoch": 1.0}
    torn = tmp_path / "c.ckpt"
    torn.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert read_metrics("lightning", torn) == {}
    # nothing in the pickle runs: a checkpoint whose pickle would execute code is read, not run
    evil = tmp_path / "evil.ckpt"

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(tmp_path / "pwned"), "w"))

    _lightning_ckpt(evil, {}, hparams=Boom())
    assert read_metrics("lightning", evil) == {"global_step": 40.0, "epoch": 1.0}
    assert not (tmp_path / "pwned").exists()
