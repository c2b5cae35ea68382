"""`ckptvault restore --only model` of real frameworks' checkpoints (tests/frameworks/writers.py), through
the command line. A Hugging Face Trainer checkpoint on SeaweedFS (in the command's own process) and on
moto (through the restore flow, every object in GLACIER): only the weights, config and index are thawed
and come back, byte-identical, and transformers' own `from_pretrained` loads them; the optimizer's object
is never read: replaced in the bucket by junk of the same size, the partial restore still succeeds and a
full one fails naming it. A DeepSpeed ZeRO-1 or ZeRO-2 save's model comes back as its model states alone, and
DeepSpeed's own module-only load reads it. A layout that keeps model and optimizer in one file
(Lightning's .ckpt, a DeepSpeed ZeRO-3 save's partitions) is refused with exit 2, naming it. A torch DCP
save (and Megatron's torch_dist, a DCP inside) comes back with its .distcp files sparse, holding only the
model's (or the optimizer's, or the keys asked for) tensors, which `torch.distributed.checkpoint.load`
reads back equal to the saved ones; with block CRC32Cs (one process, and 2 ranks sharded by FSDP2) only
the blocks around the model's tensors are read."""

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


@pytest.mark.parametrize("stage", [1, 2])
def test_only_model_of_deepspeed_zero1_and_2_loads_with_load_module_only(
    seaweedfs: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stage: int,
) -> None:  # fmt: skip
    """ZeRO-1 and ZeRO-2 keep the module's whole weights in mp_rank_00_model_states.pt (the optimizer's
    partitions beside it): `--only model` brings back that file and `latest`, which DeepSpeed's own
    module-only load reads."""
    torch = need("torch")
    from tests.frameworks.conftest import write_run

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = (
        framework_run("deepspeed")
        if stage == 1
        else write_run("deepspeed", tmp_path / "zero2", "--zero-stage", "2", "--steps", str(STEP), "--every", str(STEP))
    )
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
# original, as a loader of a model-only state dict does (flat keys, empty tensors shaped by .metadata: the
# whole tensors, whichever ranks' shards the save holds them in).
DCP_LOAD = """
import json, sys
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
out = []
for original, restored, prefix in json.loads(sys.argv[1]):
    md = dcp.FileSystemReader(original).read_metadata()
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


def _dcp_load(jobs: list[tuple[Path, Path, str]]) -> list[dict[str, Any]]:
    """One child process (one torch import) for every (original, restored checkpoint, key prefix) to load."""
    loaded = subprocess.run([sys.executable, "-c", DCP_LOAD, json.dumps([(str(o), str(r), k) for o, r, k in jobs])],
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

    model, optimizer, layer = _dcp_load([(original, ckpt, "model"), (original, optim, "optimizer"),
                                         (original, keys, "model.0")])  # fmt: skip
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
    """Real torch DCP saves whose tensors are 16 MiB and more (the MLP 65,536 wide: a 16 MiB and a 4 MiB
    weight, AdamW's two moments of each), so that 4 MiB blocks separate them: one written by a single
    process (__0_0.distcp), one by 2 ranks with FSDP2 sharding every tensor in halves (__0_0.distcp and
    __1_0.distcp, each holding its half of the model's and of the optimizer's tensors). Their ingest (one,
    of both) records block CRC32Cs; `--only model` reads under 40% of the bytes (of every .distcp a part)
    and `dcp.load` of the model gives the saved tensors; a byte flipped in the stored object inside an
    optimizer moment's blocks is never read, one inside the model's weight fails the restore naming the
    file and the block, nothing written."""
    need("torch.distributed.checkpoint")
    import torch.distributed.checkpoint as dcp

    from tests.frameworks.conftest import write_run

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    wide = ("--hidden", "65536", "--steps", "2", "--every", "2")
    roots = {"w": write_run("dcp", tmp_path / "wide", *wide),
             "r": write_run("dcp", tmp_path / "ranks", *wide, "--ranks", "2")}  # fmt: skip
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [(run, root, "dcp") for run, root in roots.items()],
                       extra="[validation]\nenabled = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest"]) == 0
    s3 = seaweedfs.client()
    block = 4 << 20

    def restore(run: str, name: str) -> tuple[int, dict[str, Any] | None, str]:
        dest = tmp_path / name
        capsys.readouterr()
        rc = main(["--config", str(cfg), "restore", run, "--step", "2", "--only", "model", "--dest", str(dest),
                   "--json"])  # fmt: skip
        out, err = capsys.readouterr()
        return rc, (json.loads(out) if rc == 0 else None), err

    def flip(key: str, stored: bytes, at: int) -> None:
        """The stored object with one byte at `at` flipped: what the store gives back from now on."""
        junk = bytearray(stored)
        junk[at] ^= 0xFF
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(junk))

    loads: list[tuple[Path, Path, str]] = []
    for run, root in roots.items():
        original = root / "checkpoint" / "step-2"
        base = checkpoint_prefix("t", run, 2)
        assert s3.head_object(Bucket=bucket, Key=base + "_BLOCKS.json")["ContentLength"] > 0
        distcp = sorted(p.name for p in original.glob("*.distcp"))
        ranks = 2 if run == "r" else 1
        assert distcp == [f"__{r}_0.distcp" for r in range(ranks)], distcp
        # where each item's chunk lies in each .distcp, from torch's own reader of the original .metadata
        storage = dcp.FileSystemReader(str(original)).read_metadata().storage_data
        where = {(info.relative_path, idx.fqn): (info.offset, info.length) for idx, info in storage.items()}
        for f in distcp:  # each rank's file holds its share of the model's tensors and of the optimizer's
            assert {(f, "model.0.weight"), (f, "optimizer.state.0.weight.exp_avg")} <= set(where), (f, sorted(where))
        # the last rank's file: the 16 MiB weight's chunk in it (all of it, or its half), a moment's beside it
        file = distcp[-1]
        w_off, w_len = where[file, "model.0.weight"]
        m_off, m_len = where[file, "optimizer.state.0.weight.exp_avg"]
        assert w_len >= (16 << 20) // ranks and m_len >= (16 << 20) // ranks, where  # two blocks and more
        key = base + file
        stored = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        flip(key, stored, m_off + m_len // 2)  # inside the optimizer's moment, blocks away from any model tensor
        rc, doc, err = restore(run, f"model-{run}")
        assert rc == 0 and doc is not None, err[-3000:]
        files = doc["selection"]["tensors"]["files"]
        assert sorted(f["path"] for f in files if f["ranges"]) == distcp, files
        # every .distcp read in part, the whole of them under 40%
        assert all(0 < f["read_bytes"] < f["of_bytes"] for f in files if f["ranges"]), files
        read, of = sum(f["read_bytes"] for f in files), sum(f["of_bytes"] for f in files)
        assert 0 < read < 0.4 * of, files
        assert all(f["verified"].startswith("the blocks around its ranges") for f in files if f["ranges"]), files
        loads.append((original, tmp_path / f"model-{run}" / "step-2", "model"))

        flip(key, stored, w_off + w_len // 2)  # inside the model's weight: its block no longer matches
        rc, _, err = restore(run, f"damaged-{run}")
        assert rc != 0 and f"{file}: block {(w_off + w_len // 2) // block} (bytes" in err, err[-3000:]
        assert "Traceback" not in err and not (tmp_path / f"damaged-{run}").exists()

    for got in _dcp_load(loads):  # the model's tensors, whole, from the restored (sparse) files of each save
        assert got["equal"] and got["nonzero"] and len(got["keys"]) == 4, got


def test_only_model_of_a_deepspeed_zero3_save_is_refused_naming_the_partitions(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A real ZeRO-3 save (DeepSpeed on CPU, one process): its model states hold the module's parameters as
    empty placeholders, the weights live only in the flat fp32 groups of *_optim_states.pt. `--only model`
    exits 2 naming the format, the file and why, with nothing written (`--only optimizer` too); a whole
    restore still works."""
    torch = need("torch")
    from tests.frameworks.conftest import write_run

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = write_run("deepspeed", tmp_path / "zero3", "--zero-stage", "3", "--steps", "2", "--every", "2")
    tag = root / "global_step2"
    assert sorted(p.name for p in tag.iterdir()) == ["zero_pp_rank_0_mp_rank_00_model_states.pt",
                                                     "zero_pp_rank_0_mp_rank_00_optim_states.pt"]  # fmt: skip
    # the premise of the refusal, in the framework's own file: no weight in the model states
    module = torch.load(tag / "zero_pp_rank_0_mp_rank_00_model_states.pt", weights_only=True)["module"]
    assert module and all(t.numel() == 0 for t in module.values()), {k: t.shape for k, t in module.items()}
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("z", root, "deepspeed")],
                       extra="[validation]\nenabled = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest"]) == 0
    capsys.readouterr()
    dest = tmp_path / "model"
    assert main(["--config", str(cfg), "restore", "z", "--only", "model", "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    said = (
        "'deepspeed' checkpoint whose zero_pp_rank_0_mp_rank_00_optim_states.pt holds both: "
        "DeepSpeed ZeRO-3 partitions the weights across ranks: they are kept only inside the *_optim_states.pt"
    )
    assert said in err and "Restore it whole (no --only)" in err and "Traceback" not in err, err
    assert not dest.exists()
    # the optimizer's part is refused alike: its partitions hold the weights too
    assert main(["--config", str(cfg), "restore", "z", "--only", "optimizer", "--dest", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "--only optimizer: z step 2 is a 'deepspeed' checkpoint" in err and "Traceback" not in err, err
    assert not dest.exists()
    # as the refusal says: the whole save restores
    whole = tmp_path / "whole"
    assert main(["--config", str(cfg), "restore", "z", "--dest", str(whole)]) == 0
    assert _tree(whole / tag.name) == _tree(tag)
