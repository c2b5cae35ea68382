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


def write_config(
    path: Path, server: Server, prefix: str, source_root: Path, extra: str = "", bucket: str = BUCKET
) -> Path:
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
format = "hf"
settle_seconds = 0
"""
    )
    return path
