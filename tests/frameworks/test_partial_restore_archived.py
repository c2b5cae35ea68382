"""`ckptvault restore --only model` of a torch DCP save in GLACIER, through the command line on moto (AWS's
archival classes and RestoreObject): the `.metadata` is thawed first (which `.distcp` files hold the
model's items is read there), then only the files the part reads; a `.distcp` holding only optimizer
items is created empty at its size and never thawed nor read, and `dcp.load` of the model gives the saved
tensors. The save is written a file per item (`FileSystemWriter(single_file_per_rank=False)`) so that
files hold one part each. Its ingest records the model and optimizer bytes from the `.metadata`
(`ls --json`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import checkpoint_prefix
from ckptvault_cli.main import main
from tests.frameworks import need
from tests.helpers import write_config

# In a child process, as the writers run: torch.distributed's state stays out of the test process.
SAVE = """
import sys, warnings
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemWriter
torch.manual_seed(0)
model = {"model.0.weight": torch.randn(128, 128), "model.0.bias": torch.randn(128)}
optim = {k: {"exp_avg": torch.randn_like(v), "exp_avg_sq": torch.rand_like(v)} for k, v in model.items()}
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    dcp.save({**model, "optimizer": {"state": optim}, "train_state": {"step": 4}},
             storage_writer=FileSystemWriter(sys.argv[1], single_file_per_rank=False))
torch.save(model, sys.argv[2])
"""

LOAD = """
import json, sys, warnings
import torch
import torch.distributed.checkpoint as dcp
saved = torch.load(sys.argv[2], weights_only=True)
got = {k: torch.zeros_like(v) for k, v in saved.items()}
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    dcp.load(got, checkpoint_id=sys.argv[1], no_dist=True)
print(json.dumps({"equal": all(torch.equal(got[k], v) for k, v in saved.items()), "keys": sorted(got)}))
"""


def _python(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_only_model_from_glacier_thaws_the_metadata_first_then_only_the_files_the_model_is_in(
    moto_server: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    need("torch.distributed.checkpoint")
    for k, v in moto_server.env().items():
        monkeypatch.setenv(k, v)
    ckpt = tmp_path / "d" / "step-4"
    _python(SAVE, str(ckpt), str(tmp_path / "model.pt"))
    distcp = sorted(p.name for p in ckpt.glob("*.distcp"))
    assert len(distcp) >= 4, distcp
    bucket = bucket_factory(moto_server)
    cfg = write_config(tmp_path / "c.toml", moto_server, bucket, [("d", tmp_path / "d", "dcp")],
                       extra="[validation]\nenabled = false\n")  # fmt: skip
    assert main(["--config", str(cfg), "ingest"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    assert row["model_bytes"] + row["optimizer_bytes"] == size and 0 < row["model_bytes"] < row["optimizer_bytes"], row

    client = moto_server.client()
    base = checkpoint_prefix("t", "d", 4)
    names = sorted(p.name for p in ckpt.iterdir())
    for name in names:
        client.copy_object(Bucket=bucket, Key=base + name, CopySource={"Bucket": bucket, "Key": base + name},
                           StorageClass="GLACIER", MetadataDirective="COPY")  # fmt: skip
    dest = tmp_path / "model"
    capsys.readouterr()
    rc = main(["--config", str(cfg), "restore", "d", "--only", "model", "--dest", str(dest), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    doc = json.loads(out)
    assert doc["status"] == "restored" and doc["partial"] is True, doc
    files = doc["selection"]["tensors"]["files"]
    unread = {f["path"] for f in files if not f["ranges"]}
    read = {f["path"] for f in files if f["ranges"]}
    assert read and unread and read | unread == set(distcp), files
    asked = {n for n in names if "Restore" in client.head_object(Bucket=bucket, Key=base + n)}
    assert asked == set(names) - unread, asked  # the optimizer's files never thawed
    assert doc["estimate_detail"]["objects"] == len(names) - len(unread), doc["estimate_detail"]
    for name in unread:  # at its size, all holes
        data = (dest / "step-4" / name).read_bytes()
        assert len(data) == (ckpt / name).stat().st_size and data.count(0) == len(data)
    got = json.loads(_python(LOAD, str(dest / "step-4"), str(tmp_path / "model.pt")).strip().splitlines()[-1])
    assert got["equal"] and got["keys"] == ["model.0.bias", "model.0.weight"], got
