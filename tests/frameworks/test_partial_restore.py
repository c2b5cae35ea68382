"""`ckptvault restore --only model` of real frameworks' checkpoints (tests/frameworks/writers.py), through
the command line. A Hugging Face Trainer checkpoint on SeaweedFS (in the command's own process) and on
moto (through the restore flow, every object in GLACIER): only the weights, config and index are thawed
and come back, byte-identical, and transformers' own `from_pretrained` loads them; the optimizer's object
is never read: replaced in the bucket by junk of the same size, the partial restore still succeeds and a
full one fails naming it. A DeepSpeed ZeRO-1 save's model comes back as its model states alone, and
DeepSpeed's own module-only load reads it. A layout that keeps model and optimizer in one file
(Lightning's .ckpt) is refused with exit 2, naming it."""

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
