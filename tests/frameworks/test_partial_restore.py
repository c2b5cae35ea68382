"""`ckptvault restore --only model` of real frameworks' checkpoints (tests/frameworks/writers.py), through
the command line. A Hugging Face Trainer checkpoint on SeaweedFS (in the command's own process) and on
moto (through the restore flow, every object in GLACIER): only the weights, config and index are thawed
and come back, byte-identical, and transformers' own `from_pretrained` loads them; the optimizer's object
is never read: replaced in the bucket by junk of the same size, the partial restore still succeeds and a
full one fails naming it. A DeepSpeed ZeRO-1 save's model comes back as its model states alone, and
DeepSpeed's own module-only load reads it. A layout that keeps model and optimizer in one file
(Lightning's .ckpt) is refused with exit 2, naming it. A torch DCP save (and Megatron's torch_dist, a DCP
inside) comes back with its .distcp files sparse, holding only the model's (or the optimizer's, or the
keys asked for) tensors, which `torch.distributed.checkpoint.load` reads back equal to the saved ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import checkpoint_prefix
from ckptvault.restore.selection import MARKER
from ckptvault_cli.main import main
from tests.frameworks import need
from tests.frameworks.conftest import writer
from tests.helpers import write_config

STEP = 6
TRAINING_STATE = ["optimizer.pt", "rng_state.pth", "scheduler.pt", "trainer_state.json", "training_args.bin"]

# In a child process, as the writers run: transformers' global state stays out of the test process.
LOAD = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
saved = load_file(str(Path(sys.argv[2]) / "model.safetensors"))
state = model.state_dict()
print(json.dumps({"tensors": len(saved), "equal": all(torch.equal(state[k], t) for k, t in saved.items())}))
"""


def _tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("server", ["seaweedfs", "moto_server"])
def test_only_model_brings_back_what_from_pretrained_loads_and_never_reads_the_optimizer(
    prefect_api: None, request: pytest.FixtureRequest, bucket_factory: Any, framework_run: Callable[[str], Path],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], server: str,
) -> None:  # fmt: skip
    endpoint = request.getfixturevalue(server)
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    if server == "moto_server":  # the restore flow's path: the same selection as the flow's parameters
        monkeypatch.setenv("CKPTVAULT_PREFECT", "always")
    root = framework_run("hf")
    bucket = bucket_factory(endpoint)
    cfg = write_config(tmp_path / "c.toml", endpoint, bucket, [("r", root, "hf")],
                       extra="[validation]\nisolate = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest"]) == 0
    original = root / f"checkpoint-{STEP}"
    base = checkpoint_prefix("t", "r", STEP)
    client = endpoint.client()
    client.put_object(
        Bucket=bucket, Key=base + "optimizer.pt", Body=os.urandom((original / "optimizer.pt").stat().st_size)
    )
    archived = server == "moto_server"  # moto has AWS's archival classes: every file of the save in GLACIER
    if archived:
        for name in (p.name for p in original.iterdir()):
            client.copy_object(Bucket=bucket, Key=base + name, CopySource={"Bucket": bucket, "Key": base + name},
                               StorageClass="GLACIER", MetadataDirective="COPY")  # fmt: skip

    dest = tmp_path / "model"
    capsys.readouterr()
    rc = main(["--config", str(cfg), "restore", "r", "--step", str(STEP), "--only", "model", "--dest", str(dest),
               "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["status"] == "restored" and doc["partial"] is True, doc
    assert sorted(doc["selection"]["left_out"]) == TRAINING_STATE
    whole = _tree(original)
    model_files = {p: b for p, b in whole.items() if p not in TRAINING_STATE}
    assert _tree(dest / original.name) == model_files
    assert doc["selection"]["bytes"] == sum(len(b) for b in model_files.values()) < doc["selection"]["of_bytes"]
    assert json.loads((dest / MARKER).read_text())["left_out"] == doc["selection"]["left_out"]
    est = doc["estimate_detail"]
    assert (est["objects"], est["whole"]["objects"]) == (len(model_files), len(whole))
    if archived:  # only the part was thawed: the optimizer's objects were never asked for
        assert (est["frozen_objects"], est["whole"]["frozen_objects"]) == (len(model_files), len(whole))
        asked = {n for n in whole if "Restore" in client.head_object(Bucket=bucket, Key=base + n)}
        assert asked == set(model_files), asked
    loaded = subprocess.run([sys.executable, "-c", LOAD, str(dest / original.name), str(original)],
                            capture_output=True, text=True, timeout=300, check=False,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert got["tensors"] > 0 and got["equal"], got

    # the whole save reads optimizer.pt, and its junk fails the restore by name
    full = tmp_path / "full"
    assert main(["--config", str(cfg), "restore", "r", "--step", str(STEP), "--dest", str(full)]) == 1
    assert "optimizer.pt" in capsys.readouterr().err
    assert not full.exists()


def test_only_model_of_a_lightning_checkpoint_is_refused_naming_the_file(
    seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("l", framework_run("lightning"), "lightning")],
                       extra="[validation]\nisolate = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest", "--run", "l", "--step", str(STEP)]) == 0
    capsys.readouterr()
    dest = tmp_path / "d"
    assert main(["--config", str(cfg), "restore", "l", "--only", "model", "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "'lightning' checkpoint whose epoch=0-step=6.ckpt holds both" in err and "Traceback" not in err, err
    assert not dest.exists()


def test_only_model_of_deepspeed_zero1_loads_with_load_module_only(
    seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    torch = need("torch")
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = framework_run("deepspeed")
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("d", root, "deepspeed")],
                       extra="[validation]\nisolate = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest"]) == 0
    dest = tmp_path / "model"
    assert main(["--config", str(cfg), "restore", "d", "--only", "model", "--dest", str(dest)]) == 0
    original = root / f"global_step{STEP}"
    restored = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert restored == [MARKER, f"global_step{STEP}/mp_rank_00_model_states.pt", "latest"], restored
    assert _tree(dest / original.name) == {"mp_rank_00_model_states.pt": (original / "mp_rank_00_model_states.pt")
                                           .read_bytes()}  # fmt: skip
    got = writer("load-module", str(dest), str(tmp_path / "out"))
    assert got["loaded"].endswith(f"global_step{STEP}/mp_rank_00_model_states.pt"), got
    loaded = torch.load(tmp_path / "out" / "module.pt", weights_only=True)
    saved = torch.load(original / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert sorted(loaded) == sorted(f"model.{k}" for k in saved) and loaded
    assert all(torch.equal(loaded[f"model.{k}"], t) for k, t in saved.items())


# In a child process: dcp.load of every tensor item under PREFIX from the restored checkpoint and from the
# original, as a loader of a model-only state dict does (flat keys, empty tensors shaped by .metadata).
DCP_LOAD = """
import json, sys
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
original, jobs, out = sys.argv[1], json.loads(sys.argv[2]), []
md = dcp.FileSystemReader(original).read_metadata()
for restored, prefix in jobs:
    def state():
        return {k: torch.full(m.size, float("nan"), dtype=m.properties.dtype)
                for k, m in md.state_dict_metadata.items()
                if isinstance(m, TensorStorageMetadata) and (k == prefix or k.startswith(prefix + "."))}
    got, saved = state(), state()
    dcp.load(got, checkpoint_id=restored, no_dist=True)
    dcp.load(saved, checkpoint_id=original, no_dist=True)
    out.append({"keys": sorted(got), "equal": all(torch.equal(got[k], saved[k]) for k in got),
                "nonzero": all(bool(saved[k].abs().sum() > 0) for k in saved if k.endswith("weight"))})
print(json.dumps(out))
"""
DCP_DIRS = {"dcp": f"checkpoint/step-{STEP}", "megatron": f"iter_{STEP:07d}"}


def _dcp_load(original: Path, jobs: list[tuple[Path, str]]) -> list[dict[str, Any]]:
    """One child process (one torch import) for every (restored checkpoint, key prefix) to load."""
    loaded = subprocess.run([sys.executable, "-c", DCP_LOAD, str(original), json.dumps([(str(p), k) for p, k in jobs])],
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    got: list[dict[str, Any]] = json.loads(loaded.stdout.strip().splitlines()[-1])
    return got


@pytest.mark.parametrize("fw", ["dcp", "megatron"])
def test_only_model_of_a_dcp_save_writes_the_model_tensors_alone_into_sparse_distcp_files(
    seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fw: str,
) -> None:  # fmt: skip
    need("torch.distributed.checkpoint")
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = framework_run(fw)
    original = root / DCP_DIRS[fw]
    bucket = bucket_factory(seaweedfs)
    # the quality gates are not what this tests: off, the ingest is the upload alone
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("d", root, fw)],
                       extra="[validation]\nenabled = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest", "--run", "d", "--step", str(STEP)]) == 0
    distcp = sorted(p.name for p in original.glob("*.distcp"))
    beside = sorted(p.name for p in original.iterdir() if p.is_file() and p.suffix != ".distcp")
    assert distcp and ".metadata" in beside

    def restore(*flags: str) -> tuple[Path, dict[str, Any]]:
        dest = tmp_path / "-".join(f.strip("-") for f in flags)
        capsys.readouterr()
        rc = main(["--config", str(cfg), "restore", "d", "--step", str(STEP), *flags, "--dest", str(dest), "--json"])
        out, err = capsys.readouterr()
        assert rc == 0, err
        doc: dict[str, Any] = json.loads(out)
        assert doc["status"] == "restored" and doc["partial"] is True, doc
        assert json.loads((dest / MARKER).read_text())["tensors"] == doc["selection"]["tensors"]
        ckpt = dest / original.name
        # every file a loader reads beside the .distcp ones, byte-identical; each .distcp at its full size
        assert sorted(p.name for p in ckpt.iterdir() if p.suffix != ".distcp") == beside
        assert all((ckpt / n).read_bytes() == (original / n).read_bytes() for n in beside)
        assert {p.name: p.stat().st_size for p in ckpt.glob("*.distcp")} == {
            n: (original / n).stat().st_size for n in distcp
        }
        return ckpt, doc["selection"]

    ckpt, sel = restore("--only", "model")
    t = sel["tensors"]
    assert (t["parts"], t["tensors"], t["of_tensors"]) == (["model"], 4, 16 if fw == "dcp" else 12), t
    written = sum(f["bytes"] for f in t["files"])
    of = sum(f["of_bytes"] for f in t["files"])
    assert 0 < written < of / 2, t  # the model's tensors: a third of the bytes (AdamW keeps two moments)
    # sparse: the optimizer's two thirds were never written, nor reserved
    allocated = sum((ckpt / n).stat().st_blocks * 512 for n in distcp)
    assert allocated < of * 0.6, (allocated, of)
    # no block checksums yet: each .distcp with a model tensor is read whole, to check its CRC32C
    assert all(f["read_bytes"] == (f["of_bytes"] if f["ranges"] else 0) for f in t["files"]), t
    assert sel["bytes"] < sel["of_bytes"] and sel["read_bytes"] >= sel["bytes"]

    optim, sel = restore("--only", "optimizer")
    assert sel["tensors"]["tensors"] == (12 if fw == "dcp" else 8), sel["tensors"]
    keys, sel = restore("--only-keys", "model.0")
    assert sel["tensors"]["tensors"] == 2

    model, optimizer, layer = _dcp_load(original, [(ckpt, "model"), (optim, "optimizer"), (keys, "model.0")])
    assert model["equal"] and model["nonzero"] and len(model["keys"]) == 4, model  # two Linear layers
    assert optimizer["equal"] and len(optimizer["keys"]) == sel["tensors"]["of_tensors"] - 4, optimizer
    assert layer["equal"] and layer["keys"] == ["model.0.bias", "model.0.weight"], layer

    # the command's own words, without --json: what the .distcp files hold
    capsys.readouterr()
    dest = tmp_path / "said"
    assert main(["--config", str(cfg), "restore", "d", "--only-keys", "model.2", "--dest", str(dest)]) == 0
    out = capsys.readouterr().out
    assert f"of {len(distcp)} .distcp files only 2 of " in out and "the rest reads as zeros" in out, out

    # a prefix no item has: exit 2 naming it, nothing written
    dest = tmp_path / "none"
    assert main(["--config", str(cfg), "restore", "d", "--only-keys", "decoder", "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "no item of keys decoder" in err and "Traceback" not in err, err
    assert not dest.exists()


def test_with_block_crc32cs_only_the_models_blocks_are_fetched_and_each_is_checked(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A real torch DCP save whose tensors are 16 MiB and more (the MLP 65,536 wide: a 16 MiB and a 4 MiB
    weight, AdamW's two moments of each), so that 4 MiB blocks separate them: its ingest records block
    CRC32Cs, `--only model` reads under 40% of the bytes and `dcp.load` of the model gives the saved
    tensors; a byte flipped in the stored object inside an optimizer moment's blocks is never read, one
    inside the model's weight fails the restore naming the file and the block, nothing written."""
    need("torch.distributed.checkpoint")
    from tests.frameworks.conftest import write_run

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = write_run("dcp", tmp_path / "wide", "--hidden", "65536", "--steps", "2", "--every", "2")
    original = root / "checkpoint" / "step-2"
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("w", root, "dcp")],
                       extra="[validation]\nenabled = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest", "--run", "w", "--step", "2"]) == 0
    s3 = seaweedfs.client()
    base = checkpoint_prefix("t", "w", 2)
    assert s3.head_object(Bucket=bucket, Key=base + "_BLOCKS.json")["ContentLength"] > 0

    def restore(name: str) -> tuple[int, dict[str, Any] | None, str]:
        dest = tmp_path / name
        capsys.readouterr()
        rc = main(["--config", str(cfg), "restore", "w", "--step", "2", "--only", "model", "--dest", str(dest),
                   "--json"])  # fmt: skip
        out, err = capsys.readouterr()
        return rc, (json.loads(out) if rc == 0 else None), err

    # where each item lies in the .distcp, from torch's own reader of the original .metadata
    import torch.distributed.checkpoint as dcp

    storage = dcp.FileSystemReader(str(original)).read_metadata().storage_data
    where = {idx.fqn: (info.relative_path, info.offset, info.length) for idx, info in storage.items()}
    w_file, w_off, w_len = where["model.0.weight"]
    [moment] = [k for k in where if k.startswith("optimizer.state.") and k.endswith("0.weight.exp_avg")]
    m_file, m_off, m_len = where[moment]
    assert w_len >= 16 << 20 and m_len >= 16 << 20, where
    key = base + m_file
    stored = s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    def flip(at: int) -> None:
        junk = bytearray(stored)
        junk[at] ^= 0xFF
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(junk))

    flip(m_off + m_len // 2)  # inside the optimizer's moment, blocks away from any model tensor
    rc, doc, err = restore("model")
    assert rc == 0 and doc is not None, err[-3000:]
    files = doc["selection"]["tensors"]["files"]
    read, of = sum(f["read_bytes"] for f in files), sum(f["of_bytes"] for f in files)
    assert 0 < read < 0.4 * of, files
    assert all(f["verified"].startswith("the blocks around its ranges") for f in files if f["ranges"]), files
    [model] = _dcp_load(original, [(tmp_path / "model" / "step-2", "model")])
    assert model["equal"] and model["nonzero"] and len(model["keys"]) == 4, model

    assert w_file == m_file
    flip(w_off + w_len // 2)  # inside the model's weight: its block no longer matches
    rc, _, err = restore("damaged")
    assert rc != 0 and f"{m_file}: block {(w_off + w_len // 2) // (4 << 20)} (bytes" in err, err[-3000:]
    assert "Traceback" not in err and not (tmp_path / "damaged").exists()
