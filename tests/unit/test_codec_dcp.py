"""The element size of a DCP `.distcp` file from the `.metadata` torch.distributed.checkpoint writes beside
it (ckptvault.formats.dcp.element_bytes, ckptvault.codec_hints): real saves, read by opcodes only."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from ckptvault import codec
from ckptvault.formats import dcp as dcp_format
from tests.helpers import dcp_save
from tests.helpers import torch_weights as _model


def test_bf16_and_fp32_dcp_saves_give_typesize_2_and_4(tmp_path: Path) -> None:
    import torch

    files = dcp_save(tmp_path / "bf16", {**_model(torch.bfloat16), "step": 7}, threads=2)
    assert len(files) == 2  # every data file of the save has its own items, each file its own hint
    for f in files:
        assert codec.header_hint(f) == (2, "DCP metadata"), f
    fp32 = dcp_save(tmp_path / "fp32", _model(torch.float32))
    assert [codec.header_typesize(f) for f in fp32] == [4]
    choice = codec.choose(fp32[0], fp32[0].stat().st_size)
    assert (choice.codec, choice.typesize) == ("shuffle-zstd", 4) and "DCP metadata" in choice.why


def test_a_mixed_save_is_weighed_by_bytes_per_file(tmp_path: Path) -> None:
    """BF16 weights and FP32 Adam moments of twice their elements: FP32 holds most bytes of the one file."""
    import torch

    state = {"model": _model(torch.bfloat16), "optim": {k: v.float() for k, v in _model(torch.float32, 1).items()}}
    (f,) = dcp_save(tmp_path / "mixed", state)
    by_size = dcp_format.element_bytes(tmp_path / "mixed" / ".metadata")[f.name]
    assert set(by_size) == {2, 4} and by_size[4] > by_size[2] >= 4 * 512 * 512 * 2
    assert codec.header_typesize(f) == 4


def test_a_garbled_or_hostile_metadata_gives_no_hint_and_runs_nothing(tmp_path: Path) -> None:
    import torch

    (f,) = dcp_save(tmp_path / "c", _model(torch.bfloat16))
    meta = tmp_path / "c" / ".metadata"
    assert codec.header_hint(f) == (2, "DCP metadata")  # read once and remembered for this .metadata...
    good = meta.read_bytes()
    meta.write_bytes(good[: len(good) // 2])  # ...torn: read again, not the remembered answer
    assert codec.header_hint(f) is None
    meta.write_bytes(b"\x80\x04not a pickle at all")
    assert codec.header_hint(f) is None

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    meta.write_bytes(pickle.dumps(Boom()))
    assert codec.header_hint(f) is None and not (tmp_path / "ran").exists()
    meta.write_bytes(pickle.dumps({"state_dict_metadata": {}, "storage_data": {}}))  # not torch's Metadata
    assert codec.header_hint(f) is None
    meta.unlink()
    assert codec.header_hint(f) is None
    # the trial still decides, and BF16 weights still compress
    choice = codec.choose(f, f.stat().st_size)
    assert choice.codec == "shuffle-zstd" and "sampled trial" in choice.why


def test_a_metadata_over_the_size_limit_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The opcode reader's CPU and memory grow with `.metadata`: past MAX_METADATA the trial decides."""
    import torch

    (f,) = dcp_save(tmp_path / "c", _model(torch.bfloat16))
    size = (tmp_path / "c" / ".metadata").stat().st_size
    monkeypatch.setattr(dcp_format, "MAX_METADATA", size - 1)
    assert codec.header_hint(f) is None
    monkeypatch.setattr(dcp_format, "MAX_METADATA", size)
    assert codec.header_hint(f) == (2, "DCP metadata")
