"""Layouts: candidates and commit rules per format, auto-detection, pointer files, metrics."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from ckptvault.formats import LAYOUTS, FormatError, detect_layout, get_layout, read_metrics
from ckptvault.formats import hf as hf_mod
from ckptvault.ingest.discovery import discover
from ckptvault.ingest.structure import check_structure
from ckptvault_cli import synthetic
from tests.helpers import simulate_run

FORMATS = list(synthetic.FORMATS)
SIZE = 64 << 10


def steps_of(root: Path, fmt: str) -> list[tuple[int, bool]]:
    return [(c.step, c.complete) for c in get_layout(fmt).candidates(root)]


def test_registry_has_every_format() -> None:
    assert sorted(LAYOUTS) == sorted(FORMATS)
    for name, layout in LAYOUTS.items():
        assert layout.name == name
        assert get_layout(name) is layout


def test_unknown_format_names_the_fix() -> None:
    with pytest.raises(FormatError, match=r"unknown checkpoint format 'zarr'.*\[\[sources\]\]"):
        get_layout("zarr")


@pytest.mark.parametrize("fmt", FORMATS)
def test_complete_incomplete_finish(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path, fmt, 100, SIZE)
    synthetic.write_checkpoint(tmp_path, fmt, 200, SIZE, complete=False)
    cands = get_layout(fmt).candidates(tmp_path)
    assert [(c.step, c.complete) for c in cands] == [(100, True), (200, False)]
    assert cands[0].reason == ""
    assert cands[1].reason  # a human reason for the operator
    synthetic.finish_checkpoint(tmp_path, fmt, 200)
    assert steps_of(tmp_path, fmt) == [(100, True), (200, True)]


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_detects_each_format(tmp_path: Path, fmt: str) -> None:
    simulate_run(tmp_path, fmt, [10, 20], SIZE)
    assert detect_layout(tmp_path).name == fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_auto_detects_a_run_with_only_an_incomplete_save(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path, fmt, 10, SIZE, complete=False)
    assert detect_layout(tmp_path).name == fmt


def test_auto_detect_nothing_names_path_and_fix(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(FormatError) as err:
        detect_layout(tmp_path)
    msg = str(err.value)
    assert str(tmp_path) in msg and "checkpoint-<N>/" in msg and "set format =" in msg and "[[sources]]" in msg


def test_auto_detect_ambiguous(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "hf", 10, SIZE)
    synthetic.write_checkpoint(tmp_path, "deepspeed", 10, SIZE)
    with pytest.raises(FormatError, match=r"ambiguous.*hf, .*deepspeed.*set format"):
        detect_layout(tmp_path)


def test_format_error_is_a_value_error() -> None:
    assert issubclass(FormatError, ValueError)


def test_pointer_files() -> None:
    assert get_layout("deepspeed").pointer_file(100, "global_step100") == ("latest", "global_step100")
    assert get_layout("megatron").pointer_file(100, "iter_0000100") == ("latest_checkpointed_iteration.txt", "100")
    assert get_layout("deepspeed").pointer_file(7, "my_tag") == ("latest", "my_tag")  # custom save tags
    assert get_layout("megatron").pointer_file(0, "release") == ("latest_checkpointed_iteration.txt", "release")
    for fmt in ("hf", "dcp", "orbax", "lightning", "nemo"):
        assert get_layout(fmt).pointer_file(100, "x") is None


# --- format-specific rules ---


def test_hf_missing_index_shard_is_complete_but_invalid(tmp_path: Path) -> None:
    """trainer_state.json is written last: a shard missing after it is corruption, not a save in progress,
    so it must surface as a structural problem rather than wait forever."""
    d = synthetic.write_checkpoint(tmp_path, "hf", 5, SIZE, shards=3)
    (d / "model-00002-of-00003.safetensors").unlink()
    (c,) = get_layout("hf").candidates(tmp_path)
    assert c.complete
    (found,) = discover("r", tmp_path, "hf", 0, time.time() + 10).found
    (msg,) = check_structure("hf", d, found.files)
    assert "model-00002-of-00003.safetensors" in msg and "missing" in msg


def test_hf_temporary_dir_is_incomplete(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 5, SIZE)
    d.rename(tmp_path / "tmp-checkpoint-5")
    (c,) = get_layout("hf").candidates(tmp_path)
    assert (c.step, c.complete) == (5, False) and "temporary" in c.reason


@pytest.mark.parametrize("name", ["step-7", "step_7", "7"])
def test_dcp_dir_names(tmp_path: Path, name: str) -> None:
    d = synthetic.write_checkpoint(tmp_path, "dcp", 7, SIZE)
    d.rename(tmp_path / name)
    assert steps_of(tmp_path, "dcp") == [(7, True)]
    assert detect_layout(tmp_path).name == "dcp"


def test_megatron_tracker_names_later_step(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "megatron", 100, SIZE, complete=False)
    assert steps_of(tmp_path, "megatron") == [(100, False)]
    synthetic.write_checkpoint(tmp_path, "megatron", 300, SIZE)
    assert steps_of(tmp_path, "megatron") == [(100, True), (300, True)]


def test_megatron_no_tracker_and_release(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "megatron", 100, SIZE, complete=False)
    (c,) = get_layout("megatron").candidates(tmp_path)
    assert "latest_checkpointed_iteration.txt" in c.reason
    synthetic.write_torch_zip(tmp_path / "release" / "mp_rank_00" / "model_optim_rng.pt", SIZE)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release\n")
    assert steps_of(tmp_path, "megatron") == [(0, True), (100, False)]


def test_deepspeed_latest_names_later_tag(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "deepspeed", 100, SIZE, complete=False)
    (c,) = get_layout("deepspeed").candidates(tmp_path)
    assert not c.complete and "latest" in c.reason
    synthetic.write_checkpoint(tmp_path, "deepspeed", 200, SIZE)
    assert steps_of(tmp_path, "deepspeed") == [(100, True), (200, True)]
    synthetic.write_checkpoint(tmp_path, "deepspeed", 300, SIZE, complete=False)
    assert steps_of(tmp_path, "deepspeed")[-1] == (300, False)


def test_orbax_commit_success_required_once_used(tmp_path: Path) -> None:
    simulate_run(tmp_path, "orbax", [1, 2], SIZE)
    (tmp_path / "2" / "commit_success.txt").unlink()
    cands = get_layout("orbax").candidates(tmp_path)
    assert [(c.step, c.complete) for c in cands] == [(1, True), (2, False)]
    assert "commit_success.txt" in cands[1].reason


def test_orbax_without_commit_protocol_and_prefixed_names(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "orbax", 3, SIZE)
    (tmp_path / "3" / "commit_success.txt").unlink()
    (tmp_path / "3").rename(tmp_path / "ckpt_3")
    assert steps_of(tmp_path, "orbax") == [(3, True)]
    (tmp_path / "ckpt_3" / "_CHECKPOINT_METADATA").unlink()
    (c,) = get_layout("orbax").candidates(tmp_path)
    assert not c.complete and "_CHECKPOINT_METADATA" in c.reason


def test_lightning_skips_aliases(tmp_path: Path) -> None:
    p = synthetic.write_checkpoint(tmp_path, "lightning", 50, SIZE)
    (tmp_path / "last.ckpt").write_bytes(p.read_bytes())
    (tmp_path / "last-v1.ckpt").write_bytes(b"x")
    (tmp_path / "best.ckpt").write_bytes(b"x")
    cands = get_layout("lightning").candidates(tmp_path)
    assert [(c.step, c.path.name) for c in cands] == [(50, "epoch=0-step=50.ckpt")]
    assert cands[0].path.is_file()


def test_nemo_needs_weights_and_context(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "nemo", 9, SIZE)
    (d / "context" / "io.json").unlink()
    (d / "context" / "model.yaml").unlink()
    (d / "context").rmdir()
    (c,) = get_layout("nemo").candidates(tmp_path)
    assert not c.complete and "context/" in c.reason


def test_nemo_last_copy_is_skipped(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "nemo", 9, SIZE)
    (tmp_path / (d.name + "-last")).mkdir()
    assert [c.path.name for c in get_layout("nemo").candidates(tmp_path)] == [d.name]


def test_temporary_names_never_complete(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "dcp", 4, SIZE)
    d.rename(tmp_path / "step-4.tmp")
    assert steps_of(tmp_path, "dcp") == [(4, False)]


# --- metrics ---


def test_hf_read_metrics_last_values(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 100, SIZE, loss=1.5)
    m = hf_mod.read_metrics(d)
    assert m["loss"] == 1.5
    assert m["eval_loss"] == pytest.approx(1.575)
    assert {"learning_rate", "grad_norm", "global_step"} <= set(m)
    assert read_metrics("hf", d) == m
    assert read_metrics("dcp", d) == {}


def test_hf_read_metrics_keeps_nan(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "hf", 100, SIZE, loss=float("nan"))
    assert "NaN" in (d / "trainer_state.json").read_text()
    assert math.isnan(hf_mod.read_metrics(d)["loss"])


def test_hf_read_metrics_absent_or_broken(tmp_path: Path) -> None:
    assert hf_mod.read_metrics(tmp_path) == {}
    (tmp_path / "trainer_state.json").write_text("{not json")
    assert hf_mod.read_metrics(tmp_path) == {}
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"loss": "x", "flag": True}]}))
    assert hf_mod.read_metrics(tmp_path) == {}


def test_deepspeed_latest_counts_only_once_every_rank_file_is_there(tmp_path: Path) -> None:
    """DeepSpeed's rank 0 writes `latest` after its own save, with no barrier across ranks
    (engine.py save_checkpoint): a rank whose optimizer states are still missing keeps the tag unready."""
    d = synthetic.write_checkpoint(tmp_path, "deepspeed", 100, SIZE, shards=3)
    assert steps_of(tmp_path, "deepspeed") == [(100, True)]
    (d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    (c,) = get_layout("deepspeed").candidates(tmp_path)
    assert not c.complete
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in c.reason and "data-parallel ranks 0..2" in c.reason
    # the rank finishes: ready again
    synthetic.write_torch_zip(d / "zero_pp_rank_1_mp_rank_00_optim_states.pt", 1024, 0)
    assert steps_of(tmp_path, "deepspeed") == [(100, True)]


def test_deepspeed_every_dp_rank_for_every_mp_rank(tmp_path: Path) -> None:
    d = synthetic.write_checkpoint(tmp_path, "deepspeed", 100, SIZE, shards=2)
    synthetic.write_torch_zip(d / "mp_rank_01_model_states.pt", 1024, 0)
    synthetic.write_torch_zip(d / "zero_pp_rank_0_mp_rank_01_optim_states.pt", 1024, 0)
    (c,) = get_layout("deepspeed").candidates(tmp_path)
    assert not c.complete and "zero_pp_rank_1_mp_rank_01_optim_states.pt" in c.reason, c.reason
    synthetic.write_torch_zip(d / "zero_pp_rank_1_mp_rank_01_optim_states.pt", 1024, 0)
    assert steps_of(tmp_path, "deepspeed") == [(100, True)]
    # a model-parallel rank's model states missing: mp ranks must be 0..max
    synthetic.write_torch_zip(d / "mp_rank_03_model_states.pt", 1024, 0)
    (c,) = get_layout("deepspeed").candidates(tmp_path)
    assert not c.complete and "mp_rank_02_model_states.pt" in c.reason, c.reason
    (d / "mp_rank_03_model_states.pt").unlink()
    (d / "mp_rank_00_model_states.pt").unlink()
    (d / "mp_rank_01_model_states.pt").unlink()
    (c,) = get_layout("deepspeed").candidates(tmp_path)
    assert not c.complete and "no mp_rank_XX_model_states.pt" in c.reason, c.reason


def test_deepspeed_zero3_model_states_per_rank_and_bf16(tmp_path: Path) -> None:
    d = tmp_path / "global_step5"
    for r in (0, 1):
        synthetic.write_torch_zip(d / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt", 1024, 0)
        synthetic.write_torch_zip(d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt", 1024, 0)
    (tmp_path / "latest").write_text("global_step5")
    assert steps_of(tmp_path, "deepspeed") == [(5, True)]
    (d / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    (c,) = get_layout("deepspeed").candidates(tmp_path)
    assert not c.complete and "zero_pp_rank_1_mp_rank_00_model_states.pt" in c.reason, c.reason
