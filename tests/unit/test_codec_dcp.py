"""The element size of a DCP `.distcp` file from the `.metadata` torch.distributed.checkpoint writes beside
it (ckptvault.formats.dcp.element_bytes, ckptvault.codec.hints): real saves, read by opcodes only."""

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
    with pytest.raises(ValueError, match=r"not a torch\.distributed\.checkpoint\.metadata\.Metadata"):
        dcp_format.element_bytes(_put(meta, pickle.dumps({"state_dict_metadata": {}, "storage_data": {}})))
    assert codec.header_hint(f) is None  # a plain dict with Metadata's field names is not torch's Metadata
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


def _put(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


_HOSTILE = r"""
import pickle, sys
from pathlib import Path
from ckptvault import codec
d = Path(sys.argv[1])
(d / "__0_0.distcp").write_bytes(b"\0" * (2 << 20))
shared = []
for _ in range(40):
    shared = [shared, shared]  # 2**40 elements through the memo: a few hundred bytes
flat = pickle.dumps(shared, protocol=2)[:-1]
cases = {
    # a dict key nested 300,000 tuples deep: hashing it overflows the C stack
    "deep tuple key": b"\x80\x02}N" + b"\x85" * 300_000 + b"Ns.",
    # a top-level object whose repr (in an error message) would be exponential
    "shared list": pickle.dumps(shared, protocol=2),
    # STACK_GLOBAL naming a module by that list: its str() would be exponential too
    "shared global": flat + b"\x8c\x01x\x93.",
}
for name, data in cases.items():
    (d / ".metadata").write_bytes(data)
    codec_hint = codec.header_hint(d / "__0_0.distcp")
    assert codec_hint is None, (name, codec_hint)
    print("ok", name, len(data))
"""


def test_hostile_metadata_gives_no_hint_in_bounded_time_and_never_crashes(tmp_path: Path) -> None:
    """Pickles far under the size limit that crashed (SIGSEGV, past any except) or ran for hours."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _HOSTILE, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.count("ok ") == 3, proc.stdout
