"""The synthetic checkpoint the bench sends, and the ckptvault configs that point at it and a server."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.bucket import BUCKET
from bench.servers import Server

RUN = "bench"
STEP = 100


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def write_source(root: Path, size: int, step: int) -> Path:
    from ckptvault_cli.synthetic import write_checkpoint

    ck = write_checkpoint(root, "hf", step, size, shards=8)
    old = time.time() - 600  # settled: discovery would otherwise wait settle_seconds
    for p in [*ck.rglob("*"), ck]:
        os.utime(p, (old, old))
    return ck


def write_dcp_source(root: Path, size: int, step: int) -> Path:
    """A torch DCP save as torchtitan lays it out (`checkpoint/step-N`, one process): a model of 64 MiB
    Linear layers, a third of `size`, and AdamW's two moments after one step, two thirds."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    layers = max(1, size // 3 // (64 << 20))
    model = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096, bias=False) for _ in range(layers)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4096)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    ck = root / "checkpoint" / f"step-{step}"
    dcp.save({"model": msd, "optimizer": osd, "train_state": {"step": step}}, checkpoint_id=str(ck), no_dist=True)
    old = time.time() - 600
    for p in [*ck.rglob("*"), ck]:
        os.utime(p, (old, old))
    return ck


def write_config(
    path: Path, server: Server, prefix: str, source_root: Path, extra: str = "", bucket: str = BUCKET,
    fmt: str = "hf",
) -> Path:  # fmt: skip
    path.write_text(
        f"""[store]
bucket = "{bucket}"
prefix = "{prefix}"
endpoint_url = "{server.url}"
region = "{server.region}"
{extra}

[[sources]]
run = "{RUN}"
path = "{source_root}"
format = "{fmt}"
settle_seconds = 0
"""
    )
    return path
