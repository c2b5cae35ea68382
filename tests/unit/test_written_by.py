"""What wrote each save: the versions a checkpoint records of its writer, read without unpickling
(formats.read_written_by), and the manifest's optional `written_by` (docs/FORMAT.md, "What wrote a save")."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch  # the dev venv has it (pyproject.toml, the frameworks extra)

from ckptvault.catalog.events import verified
from ckptvault.checkpoint.manifest import FileEntry, Manifest
from ckptvault.formats import read_written_by


class _Boom:
    """Unpickling this runs code: a reader that unpickles fails the test."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (pytest.fail, ("the checkpoint was unpickled",))


def _torch_save(path: Path, obj: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path


def test_hf_reads_transformers_version_from_config_then_generation_config(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    assert read_written_by("hf", ckpt) == {}  # no config: nothing recorded, no error
    (ckpt / "generation_config.json").write_text(json.dumps({"transformers_version": "4.56.0"}))
    assert read_written_by("hf", ckpt) == {"transformers": "4.56.0"}
    (ckpt / "config.json").write_text(json.dumps({"model_type": "gpt2", "transformers_version": "4.57.1"}))
    assert read_written_by("hf", ckpt) == {"transformers": "4.57.1"}  # the model's own config first
    (ckpt / "config.json").write_text("{not json")
    assert read_written_by("hf", ckpt) == {"transformers": "4.56.0"}
    (ckpt / "generation_config.json").write_text(json.dumps({"transformers_version": 4}))  # not a string
    assert read_written_by("hf", ckpt) == {}
    (ckpt / "config.json").write_text(json.dumps({"transformers_version": "x" * 65}))  # not a version
    assert read_written_by("hf", ckpt) == {}


def test_lightning_reads_its_top_level_version_by_opcodes(tmp_path: Path) -> None:
    ckpt = _torch_save(
        tmp_path / "epoch=0-step=4.ckpt",
        {
            "epoch": 0,
            "global_step": 4,
            # a nested key of the same name is not the checkpoint's
            "state_dict": {"w": torch.zeros(2), "pytorch-lightning_version": "0.0.1"},
            "pytorch-lightning_version": "2.6.6",
            "hyper_parameters": {"hook": _Boom()},
        },
    )
    assert read_written_by("lightning", ckpt) == {"pytorch-lightning": "2.6.6"}
    older = _torch_save(tmp_path / "epoch=0-step=5.ckpt", {"global_step": 5, "state_dict": {}})
    assert read_written_by("lightning", older) == {}
    garbled = tmp_path / "epoch=0-step=6.ckpt"
    garbled.write_bytes(ckpt.read_bytes()[:-100])  # cut short: not a readable zip
    assert read_written_by("lightning", garbled) == {}


def test_deepspeed_reads_ds_version_from_the_model_states(tmp_path: Path) -> None:
    tag = tmp_path / "global_step5"
    _torch_save(
        tag / "mp_rank_00_model_states.pt",
        {"module": {"w": torch.zeros(2)}, "global_steps": 5, "ds_config": {"x": _Boom()}, "ds_version": "0.19.8"},
    )
    assert read_written_by("deepspeed", tag) == {"deepspeed": "0.19.8"}
    zero3 = tmp_path / "global_step6"
    _torch_save(zero3 / "zero_pp_rank_0_mp_rank_00_model_states.pt", {"global_steps": 6, "ds_version": "0.18.0"})
    assert read_written_by("deepspeed", zero3) == {"deepspeed": "0.18.0"}
    none = tmp_path / "global_step7"
    _torch_save(none / "mp_rank_00_model_states.pt", {"global_steps": 7, "ds_version": None})
    assert read_written_by("deepspeed", none) == {}
    (tmp_path / "global_step8").mkdir()
    assert read_written_by("deepspeed", tmp_path / "global_step8") == {}


def _dcp_save(path: Path) -> Path:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process": meant
        dcp.save({"w": torch.ones(3), "extra": {"step": 1}}, checkpoint_id=str(path))
    return path


def test_dcp_records_its_format_version_from_the_end_of_metadata(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
    from torch.distributed.checkpoint.metadata import Metadata

    ckpt = _dcp_save(tmp_path / "step-1")
    assert read_written_by("dcp", ckpt) == {"torch.dcp": CURRENT_DCP_VERSION}
    # megatron-core's writer sets a field after `version` (all_local_plans)
    later = tmp_path / "step-3"
    later.mkdir()
    md = Metadata(state_dict_metadata={}, version="1.0.0")
    md.all_local_plans = [{"version": ("version",)}, "version"]  # type: ignore[attr-defined]
    (later / ".metadata").write_bytes(pickle.dumps(md))
    assert read_written_by("dcp", later) == {"torch.dcp": "1.0.0"}
    # a Metadata that records no version (torch before it), pickled as torch does
    old = tmp_path / "step-2"
    old.mkdir()
    (old / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    assert read_written_by("dcp", old) == {}
    # a pickle whose last field is a `version` but that is not torch's Metadata
    (old / ".metadata").write_bytes(pickle.dumps({"version": "1.0.0"}))
    assert read_written_by("dcp", old) == {}
    (old / ".metadata").write_bytes(b"\x80\x04garbage")
    assert read_written_by("dcp", old) == {}


def test_megatron_torch_dist_records_its_backend_and_dcp_versions_legacy_none(tmp_path: Path) -> None:
    it = _dcp_save(tmp_path / "iter_0000010")
    (it / "metadata.json").write_text(
        json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch"})
    )
    got = read_written_by("megatron", it)
    from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

    assert got == {"megatron-core.torch_dist": "1", "torch.dcp": CURRENT_DCP_VERSION}
    legacy = tmp_path / "iter_0000020"
    _torch_save(legacy / "mp_rank_00" / "model_optim_rng.pt", {"checkpoint_version": 3.0})
    assert read_written_by("megatron", legacy) == {}
    # NeMo's weights/ is the same dist checkpoint
    nemo = tmp_path / "model-step=3"
    (nemo / "weights").parent.mkdir()
    it.rename(nemo / "weights")
    assert read_written_by("nemo", nemo) == got


def test_orbax_records_nothing(tmp_path: Path) -> None:
    # what orbax-checkpoint 0.12's CheckpointManager writes: no version anywhere
    step = tmp_path / "3"
    (step / "default").mkdir(parents=True)
    (step / "_CHECKPOINT_METADATA").write_text(json.dumps({"item_handlers": {}, "metrics": {}}))
    (step / "default" / "_METADATA").write_text(json.dumps({"tree_metadata": {}, "use_ocdbt": True}))
    assert read_written_by("orbax", step) == {}


def _manifest(**kw: object) -> Manifest:
    f = FileEntry(path="config.json", size=3, mtime=1.0, crc32c="AAAAAA==")
    return Manifest(run="r", step=5, format="hf", files=(f,), created_at=1.0, uploaded_at=2.0, source="/x", **kw)  # type: ignore[arg-type]


def test_the_manifest_field_is_optional_and_older_manifests_read() -> None:
    m = _manifest(written_by={"transformers": "4.57.1"})
    doc = json.loads(m.to_json())
    assert doc["written_by"] == {"transformers": "4.57.1"}
    assert Manifest.from_json(m.to_json()) == m
    # none recorded: the manifest has no key, as before it existed; one without it reads as none
    assert "written_by" not in json.loads(_manifest().to_json())
    del doc["written_by"]
    assert Manifest.from_json(json.dumps(doc).encode()).written_by == {}
    # a malformed one is not a reason to refuse the save
    doc["written_by"] = ["4.57.1"]
    assert Manifest.from_json(json.dumps(doc).encode()).written_by == {}
    doc["written_by"] = {"transformers": 4, "torch.dcp": "1.0.0"}
    assert Manifest.from_json(json.dumps(doc).encode()).written_by == {"torch.dcp": "1.0.0"}


def test_the_verified_event_carries_it_and_only_when_recorded() -> None:
    assert json.loads(verified(_manifest(written_by={"transformers": "4.57.1"})).detail)["written_by"] == {
        "transformers": "4.57.1"
    }
    assert "written_by" not in json.loads(verified(_manifest()).detail)


def test_a_reported_version_reads_back_and_the_files_record_wins() -> None:
    """What a hook reports (`KEY=VERSION` words) parses, renders back, and merges under what the
    checkpoint's files record; a word that does not read is named, strictly (the command line) or as a
    warning that records nothing (an event's payload)."""
    from ckptvault.checkpoint import written_by as reported

    got = reported.parse(" torch=2.9.1+cu128, torch.cuda=12.8  transformers=4.57.1 ")
    assert got == {"torch": "2.9.1+cu128", "torch.cuda": "12.8", "transformers": "4.57.1"}
    assert reported.parse(reported.render(got)) == got and reported.parse("") == {} == reported.parse(None)
    assert reported.merge({"transformers": "4.56.0"}, got)["transformers"] == "4.56.0"
    assert reported.merge({}, got) == got
    for bad in ("torch", "=2.9", "torch=", "tor ch=1=2", "torch=" + "9" * 65, "to/rch=1"):
        with pytest.raises(reported.ReportedError, match="is not KEY=VERSION"):
            reported.parse(bad)
    assert reported.parse_leniently("torch") == ({}, "written_by not recorded: 'torch' is not KEY=VERSION"
                                                 " (e.g. torch=2.9.1): a key of letters, digits, '.', '_' or"
                                                 " '-', a version of at most 64 characters")  # fmt: skip
    assert reported.render({"ok": "1", "bad key": "2"}) == "ok=1"


def test_the_report_goes_to_the_named_steps_only(tmp_path: Path) -> None:
    from ckptvault.formats.base import Candidate
    from ckptvault.ingest.discovery import Found
    from ckptvault.ingest.narrow import with_reported

    found = [Found("r", Candidate("hf", s, tmp_path / str(s), True), (), True, "", 0.0) for s in (100, 200)]
    got = with_reported(found, [200], {"torch": "2.9.1"})
    assert [f.reported_by for f in got] == [(), (("torch", "2.9.1"),)]
    assert with_reported(found, [200], {}) == found
