"""The drill's load check: pickles are read and never run, and every file says how it was checked."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptvault.restore import loadcheck
from tests.frameworks import need


@dataclass
class FrameworkArgs:  # a class torch's weights_only unpickler does not allow, like HF's TrainingArguments
    lr: float
    name: str


def _rewrite_zip(src: bytes, edit: dict[str, bytes | None]) -> bytes:
    """A copy of a zip with members replaced (bytes) or dropped (None); CRCs are those of the new bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(src)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = edit.get(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
    return out.getvalue()


def _member(data: bytes, suffix: str) -> str:
    return next(n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if n.endswith(suffix))


@pytest.fixture
def torch_file(tmp_path: Path) -> tuple[Path, bytes]:
    torch = need("torch")
    buf = io.BytesIO()
    torch.save({"args": FrameworkArgs(0.1, "x"), "w": torch.arange(10.0), "b": torch.ones(3)}, buf)
    return tmp_path / "training_args.bin", buf.getvalue()


def test_weights_only_refusal_of_a_framework_class_passes_by_opcode_read(torch_file: tuple[Path, bytes]) -> None:
    path, data = torch_file
    path.write_bytes(data)
    c = loadcheck.check(path).checks[0]
    assert c.ok and c.ran, c
    assert f"it refuses {__name__}.FrameworkArgs" in c.how
    assert "pickle opcodes were read, not executed" in c.how and f"names {__name__}.FrameworkArgs" in c.how
    assert "2 storages present" in c.how


def test_plain_tensors_load_with_weights_only(tmp_path: Path) -> None:
    torch = need("torch")
    path = tmp_path / "optimizer.pt"
    torch.save({"state": {0: torch.zeros(4)}}, path)
    [c] = loadcheck.check(path).checks
    assert (c.how, c.problem) == ("zip CRCs; torch.load(weights_only=True)", "")


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_truncated_pickle_fails_even_where_weights_only_refuses(torch_file: tuple[Path, bytes], cut: int) -> None:
    path, data = torch_file
    pkl = _member(data, "/data.pkl")
    body = zipfile.ZipFile(io.BytesIO(data)).read(pkl)
    path.write_bytes(_rewrite_zip(data, {pkl: body[:-cut]}))  # CRCs match: only the pickle itself is cut short
    [c] = loadcheck.check(path).checks
    assert not c.ok and "not a complete pickle" in c.problem, c


def test_garbled_pickle_fails(torch_file: tuple[Path, bytes]) -> None:
    path, data = torch_file
    pkl = _member(data, "/data.pkl")
    body = bytearray(zipfile.ZipFile(io.BytesIO(data)).read(pkl))
    body[len(body) // 2] = 0xFF  # not an opcode
    path.write_bytes(_rewrite_zip(data, {pkl: bytes(body)}))
    [c] = loadcheck.check(path).checks
    assert not c.ok and "not a complete pickle" in c.problem, c


def test_a_storage_missing_from_the_zip_fails(torch_file: tuple[Path, bytes]) -> None:
    path, data = torch_file
    path.write_bytes(_rewrite_zip(data, {_member(data, "/data/1"): None}))
    [c] = loadcheck.check(path).checks
    assert not c.ok and "data/1" in c.problem, c


def test_a_flipped_bit_in_a_zip_member_fails_its_crc(torch_file: tuple[Path, bytes]) -> None:
    path, data = torch_file
    raw = bytearray(data)
    start = raw.index(b"PK\x03\x04") + 30  # the first member's data, past its local header
    raw[start + 2] ^= 0x01
    path.write_bytes(bytes(raw))
    [c] = loadcheck.check(path).checks
    assert not c.ok and "CRC" in c.problem, c


def test_the_opcode_read_never_runs_the_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    data = pickle.dumps({"x": Evil()}, protocol=2)
    for proto_data in (data, pickle.dumps({"x": Evil()}, protocol=5)):
        scan = loadcheck.scan_pickle(proto_data)
        assert any(n.endswith(".system") for n in scan.globals), scan
    assert not marker.exists()


@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_scan_reads_every_protocol_to_stop(protocol: int) -> None:
    obj = {"a": [1, 2.5, "s", b"b", (1, 2), {3}, frozenset({4}), None, True], "n": 2**70, "r": FrameworkArgs(1.0, "n")}
    obj["self"] = obj["a"]  # memo references
    scan = loadcheck.scan_pickle(pickle.dumps(obj, protocol=protocol))
    assert f"{__name__}.FrameworkArgs" in scan.globals and scan.trailing == 0
    with pytest.raises(ValueError):
        loadcheck.scan_pickle(pickle.dumps(obj, protocol=protocol)[:-1])


def test_every_file_says_how_it_was_checked(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "broken.json").write_text("{")
    report = loadcheck.check(tmp_path)
    assert report.descriptions() == [
        "broken.json: JSON parsed; FAILED: not valid JSON: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
        "config.json: JSON parsed",
        "notes.txt: CRC32C only (no load check for this kind of file)",
    ]
    assert report.problems == [report.checks[0].path + ": " + report.checks[0].problem]


_BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "jax", "orbax"}:
            raise ModuleNotFoundError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
import json
from pathlib import Path
from ckptvault.restore import drill
r = drill.load_report(Path(sys.argv[1]))
mods = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "jax", "orbax"})
print(json.dumps({"problems": r.problems, "not_run": r.not_run, "mods": mods}))
"""


def test_without_torch_the_check_says_what_it_could_not_run(torch_file: tuple[Path, bytes], tmp_path: Path) -> None:
    import json

    path, data = torch_file
    path.write_bytes(data)
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "__0_0.distcp").write_bytes(b"x" * 10)
    (tmp_path / "weights" / ".metadata").write_bytes(b"x")
    (tmp_path / "item").mkdir()
    (tmp_path / "item" / "_METADATA").write_text("{}")
    out = subprocess.run([sys.executable, "-c", _BLOCK, str(tmp_path)], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["problems"] == [] and doc["mods"] == []
    assert len(doc["not_run"]) == 3, doc
    not_run = "\n".join(doc["not_run"])
    assert "training_args.bin: zip CRCs; pickle opcodes read, not executed" in not_run
    assert "torch.load(weights_only=True) not run: torch is not installed on this worker" in not_run
    assert "weights/: .metadata and 1 .distcp file(s): CRC32C only; torch.distributed.checkpoint load not" in not_run
    assert "item/: Orbax item: CRC32C only; Orbax restore not run" in not_run


def _bf16_file(path: Path, tail: bytes = b"") -> None:
    import json
    import struct

    header = {
        "w": {"dtype": "BF16", "shape": [4, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(range(24)) + tail)


def test_a_bf16_safetensors_file_loads_and_a_truncated_one_does_not(tmp_path: Path) -> None:
    # numpy has no bfloat16: safetensors' numpy reader refuses such tensors, so they are read as bytes
    good = tmp_path / "model.safetensors"
    _bf16_file(good)
    check = loadcheck._check_file(good, "model.safetensors")
    assert check.ok and "1 of a dtype numpy lacks" in check.how, check
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(good.read_bytes()[:-10])
    assert not loadcheck._check_file(bad, "bad.safetensors").ok
