"""`make bench` row for issue [M]: `ckptvault ingest` and `ckptvault restore` of the same mixed
checkpoint (BF16 weights in a safetensors file + FP32 optimizer state in a torch zip, 1:4 by bytes as
in a 70B model's checkpoint) with `[store] compression` "off" and "auto", on the same SeaweedFS,
interleaved. Reports wall MB/s (checkpoint bytes), CPU s/GB and peak RSS of the ckptvault process
tree (bench/measure.py's `measure`), and stored / original bytes. Every restore is compared byte for byte.

    .venv/bin/python bench/compression.py [--size-gib 1] [--reps 2] [--json bench/results/compression.json]
        [--link-mb-s 100] [--s5cmd PATH]

--link-mb-s puts bench/linkcap.py (a TCP proxy capping each direction at that many MB/s) between
the tools and the server, as a production link to the store is; --s5cmd adds s5cmd's `cp` of the
same files up and down through the same cap (the issue's comparison).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import statistics
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bucket import BUCKET, delete_prefix, list_objects, s3_client
from bench.linkcap import LinkCap
from bench.measure import log, measure
from bench.paths import BENCH, REPO, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, Server
from bench.source import RUN, STEP, dir_bytes, write_config
from bench.units import GiB, MiB

MODES = ("off", "auto")


def _bf16_safetensors(path: Path, nbytes: int) -> None:
    """BF16 normal values (the top halves of float32s, as trained weights are), written in 64 MiB pieces."""
    piece = 64 * MiB
    n = nbytes // piece * piece or piece
    header = {"model.weight": {"dtype": "BF16", "shape": [n // 2], "data_offsets": [0, n]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    rng = np.random.default_rng(0)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _ in range(n // piece):
            f32 = rng.standard_normal(piece // 2, dtype=np.float32) * 0.02
            f.write((f32.view(np.uint32) >> 16).astype(np.uint16).tobytes())


def write_mixed(root: Path, size: int) -> Path:
    from ckptvault_cli.synthetic import write_checkpoint, write_torch_zip

    ck = write_checkpoint(root, "hf", STEP, 3 * MiB, shards=1)
    _bf16_safetensors(ck / "model.safetensors", size // 5)
    write_torch_zip(ck / "optimizer.pt", size - size // 5)  # FP32 normal values, as Adam's moments
    old = time.time() - 600  # settled: discovery would otherwise wait settle_seconds
    for p in [*ck.rglob("*"), ck]:
        os.utime(p, (old, old))
    return ck


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--scratch", type=Path, default=BENCH / ".scratch-compression")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--link-mb-s", type=float, default=None, help="cap each direction of the link (MB/s)")
    p.add_argument("--s5cmd", type=str, default=None, help="an s5cmd binary: its cp up and down, compared")
    args = p.parse_args()
    scratch: Path = args.scratch
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "logs").mkdir(parents=True)
    size = int(args.size_gib * GiB)
    server = Server("seaweedfs", scratch, 4 * size)
    rows: list[dict[str, Any]] = []
    cap: LinkCap | None = None
    try:
        server.up()
        if args.link_mb_s:
            cap = LinkCap(server.port, args.link_mb_s).start()
        # what write_config reads of a Server (url, region), pointing at the cap when there is one
        via = cast(Server, SimpleNamespace(url=cap.url if cap else server.url, region=server.region))
        client = s3_client(server)
        client.create_bucket(Bucket=BUCKET)
        src_root = scratch / "hot"
        ck = write_mixed(src_root, size)
        total = dir_bytes(ck)
        env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "CKPTVAULT_CONFIG")}
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=server.region,
                   AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO))  # fmt: skip
        ckv = str(VENV_BIN / "ckptvault")
        modes = (*MODES, "s5cmd") if args.s5cmd else MODES
        for rep in range(args.reps):
            for mode in modes if rep % 2 == 0 else modes[::-1]:
                prefix = f"{mode}-{rep}"
                if mode == "s5cmd":
                    rows.append(_s5cmd(args.s5cmd, via.url, ck, scratch, prefix, env, client, server, total))
                    continue
                cfg = write_config(scratch / f"{prefix}.toml", via, prefix, src_root, f'compression = "{mode}"')
                up = measure([ckv, "--config", str(cfg), "ingest"], env, scratch / "logs" / f"ingest-{prefix}.log")
                objects = list_objects(client, f"{prefix}/{RUN}/")
                stored = sum(o["Size"] for o in objects if not o["Key"].rpartition("/")[2].startswith("_"))
                dest = scratch / "out" / prefix
                cmd = [ckv, "--config", str(cfg), "restore", RUN, "--step", str(STEP), "--dest", str(dest)]
                down = measure(cmd, env, scratch / "logs" / f"restore-{prefix}.log")
                same = down["rc"] == 0 and all(
                    filecmp.cmp(f, dest / ck.name / f.name, shallow=False) for f in ck.iterdir()
                )
                if not same:  # keep what says why: the scratch directory goes at the end
                    shutil.copytree(scratch / "logs", BENCH / ".compression-logs", dirs_exist_ok=True)
                rows.append({"mode": mode, "rep": rep, "ingest": up, "restore": down, "stored": stored,
                             "bytes": total, "identical": same})  # fmt: skip
                log(f"{prefix}: ingest {up['seconds']:.1f} s, restore {down['seconds']:.1f} s, "
                    f"stored {stored / total:.3f}x, identical {same}")  # fmt: skip
                shutil.rmtree(dest, ignore_errors=True)
                delete_prefix(client, server, f"{prefix}/")
                server.vacuum()
    finally:
        if cap:
            cap.stop()
        server.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(render(rows, modes))
    if args.json:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "link_mb_s": args.link_mb_s, "rows": rows}, indent=1))
    return 0 if all(r["identical"] and r["ingest"]["rc"] == 0 and r["restore"]["rc"] == 0 for r in rows) else 1


def _s5cmd(
    s5: str, url: str, ck: Path, scratch: Path, prefix: str, env: dict[str, str], client: Any, server: Any, total: int
) -> dict[str, Any]:
    """s5cmd's cp of the checkpoint's files up, then down, through the same endpoint; stored = uploaded."""
    logs = scratch / "logs"
    up = measure([s5, "--endpoint-url", url, "cp", f"{ck}/*", f"s3://{BUCKET}/{prefix}/"], env, logs / f"{prefix}.log")
    dest = scratch / "out" / prefix
    dest.mkdir(parents=True)
    down = measure([s5, "--endpoint-url", url, "cp", f"s3://{BUCKET}/{prefix}/*", f"{dest}/"], env,
                   logs / f"{prefix}.log")  # fmt: skip
    same = all(filecmp.cmp(f, dest / f.name, shallow=False) for f in ck.iterdir())
    log(f"{prefix}: up {up['seconds']:.1f} s, down {down['seconds']:.1f} s, identical {same}")
    shutil.rmtree(dest, ignore_errors=True)
    delete_prefix(client, server, f"{prefix}/")
    return {
        "mode": "s5cmd",
        "rep": 0,
        "ingest": up,
        "restore": down,
        "stored": total,
        "bytes": total,
        "identical": same,
    }


def render(rows: list[dict[str, Any]], modes: tuple[str, ...] = MODES) -> str:
    out = [
        "| compression | op | MB/s | CPU s/GB | peak RSS MiB | stored / original |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        for op in ("ingest", "restore"):
            ms = [r[op] for r in mine]
            n = mine[0]["bytes"]
            mbs = statistics.median(n / 1e6 / m["seconds"] for m in ms)
            cpu = statistics.median(m["cpu_seconds"] / (n / 1e9) for m in ms)
            rss = max(m["max_rss_mib"] for m in ms)
            ratio = statistics.median(r["stored"] / r["bytes"] for r in mine)
            out.append(f"| {mode} | {op} | {mbs:.0f} | {cpu:.2f} | {rss:.0f} | {ratio:.3f} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
