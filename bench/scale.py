"""`make bench` row for issue [L]: one checkpoint ingested by `ckptvault ingest --dask-address` on a real
Dask cluster (infra/local/dask.sh) of 1, 2 and 4 worker processes, and by the default runner (the
flow's 2 threads) for reference, against the same SeaweedFS and a real Prefect server.

The checkpoint is DCP-shaped: `--files` equal rank files (`__R_0.distcp`) and its `.metadata`, so the
per-file upload tasks can spread over the workers. Each configuration runs twice: the upload, then a
pass with nothing to send (the fixed cost of a pass: CLI start-up, Prefect flow run, connecting to the
cluster, discovery, one HEAD). Reported: wall MB/s of the upload, the transfer rate with the fixed cost
taken out, and CPU seconds per GB of the CLI, of the Dask workers (their whole process trees: nanny
and worker) and of the SeaweedFS server, read from /proc before and after.

    .venv/bin/python bench/scale.py [--size-gib 8] [--files 16] [--workers 1,2,4] [--split-mb N]
                                    [--compare-unsplit] [--json PATH]

`--files 1` is the split case: one file, whose ranges (`[scale] split_size_mb`, default 2048) are the
only work there is to spread; `--compare-unsplit` adds a row of the most workers with splitting off
(split_size_mb = 0), the same file as one task, as before splitting existed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bucket import BUCKET, delete_prefix, list_objects, s3_client
from bench.measure import log, measure, run_quiet
from bench.paths import BENCH, REPO, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, PrefectServer, Server, free_block
from bench.source import RUN, STEP, dir_bytes, write_config
from bench.units import GiB

DASK_SH = REPO / "infra/local/dask.sh"


def write_dcp(root: Path, size: int, files: int) -> Path:
    from ckptvault_cli.synthetic import write_checkpoint

    ck = write_checkpoint(root, "dcp", STEP, size, shards=files, seed=1)
    old = time.time() - 600  # settled: discovery would otherwise wait settle_seconds
    for p in [*ck.rglob("*"), ck]:
        os.utime(p, (old, old))
    return ck


def tree_cpu(pids: list[int]) -> float:
    """user + sys seconds of these processes and every live descendant (children's own counters:
    a worker process is the nanny's child, alive for the whole measurement)."""
    total = 0.0
    for pid in pids:
        try:
            procs = [psutil.Process(pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total


def pids_in(state: Path) -> list[int]:
    out = []
    for f in state.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            out.append(int(f.read_text().strip()))
    return out


class Cluster:
    def __init__(self, scratch: Path, workers: int, env: dict[str, str]) -> None:
        self.state = scratch / f"dask-{workers}"
        self.port = free_block([0, 1], 28786)
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.env = {**env, "STATE_DIR": str(self.state), "PORT": str(self.port), "WORKERS": str(workers),
                    "STOP_TIMEOUT": "5"}  # fmt: skip

    def up(self) -> None:
        run_quiet(["bash", str(DASK_SH), "up"], env=self.env, timeout=300)

    def down(self) -> None:
        subprocess.run(["bash", str(DASK_SH), "clean"], env=self.env, capture_output=True, timeout=120)


def one(label: str, flags: list[str], cfg: Path, env: dict[str, str], logs: Path, worker_pids: list[int],
        server_pids: list[int]) -> dict[str, Any]:  # fmt: skip
    ckv = str(VENV_BIN / "ckptvault")
    w0, s0 = tree_cpu(worker_pids), tree_cpu(server_pids)
    up = measure([ckv, "--config", str(cfg), "ingest", *flags], env, logs / f"ingest-{label}.log")
    w1, s1 = tree_cpu(worker_pids), tree_cpu(server_pids)
    again = measure([ckv, "--config", str(cfg), "ingest", *flags], env, logs / f"again-{label}.log")
    return {"label": label, "ingest": up, "fixed": again, "worker_cpu": w1 - w0, "server_cpu": s1 - s0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=8.0)
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--scratch", type=Path, default=BENCH / ".scratch-scale")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--split-mb", type=int, default=None, help="[scale] split_size_mb (default: the config's)")
    p.add_argument("--compare-unsplit", action="store_true", help="a last row: the most workers, split_size_mb = 0")
    args = p.parse_args()
    scratch: Path = args.scratch
    shutil.rmtree(scratch, ignore_errors=True)
    logs = scratch / "logs"
    logs.mkdir(parents=True)
    size = int(args.size_gib * GiB)
    server = Server("seaweedfs", scratch, 2 * size)
    prefect = PrefectServer(scratch / "prefect")
    rows: list[dict[str, Any]] = []
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "CKPTVAULT_CONFIG", "PREFECT_API_URL")}
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=server.region,
                   AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(REPO), PREFECT_HOME=str(scratch / "prefect"),
                   DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")  # fmt: skip
        prefect.up(env)
        env["PREFECT_API_URL"] = prefect.url
        server.up()
        client = s3_client(server)
        client.create_bucket(Bucket=BUCKET)
        src_root = scratch / "hot"
        ck = write_dcp(src_root, size, args.files)
        total = dir_bytes(ck)
        log(f"checkpoint: {total / GiB:.2f} GiB in {args.files} rank files + .metadata")
        server_pids = pids_in(server.state)
        counts = [int(n) for n in args.workers.split(",")]
        configs: list[tuple[str, int, int | None]] = [("threads", 0, args.split_mb)]
        configs += [(f"dask-{n}", n, args.split_mb) for n in counts]
        if args.compare_unsplit:
            configs.append((f"dask-{max(counts)}-unsplit", max(counts), 0))
        for label, n, split_mb in configs:
            prefix = label
            cfg = write_config(scratch / f"{prefix}.toml", server, prefix, src_root, "")
            text = cfg.read_text().replace('format = "hf"', 'format = "dcp"')
            scale = f"[scale]\nsplit_size_mb = {split_mb}\n" if split_mb is not None else ""
            cfg.write_text(text + "[validation]\nenabled = false\n" + scale)
            cluster = Cluster(scratch, n, env) if n else None
            try:
                flags: list[str] = []
                worker_pids: list[int] = []
                if cluster is not None:
                    cluster.up()
                    flags = ["--dask-address", cluster.address]
                    worker_pids = [int(f.read_text()) for f in cluster.state.glob("node-*.pid")]
                row = one(label, flags, cfg, env, logs, worker_pids, server_pids)
            finally:
                if cluster is not None:
                    cluster.down()
            stored = sum(o["Size"] for o in list_objects(client, f"{prefix}/{RUN}/"))
            row.update(workers=n, bytes=total, stored=stored, split_size_mb=split_mb)
            rows.append(row)
            up, fixed = row["ingest"], row["fixed"]
            log(f"{label}: ingest {up['seconds']:.1f} s (rc {up['rc']}), nothing to send {fixed['seconds']:.1f} s, "
                f"workers {row['worker_cpu']:.0f} CPU s, server {row['server_cpu']:.0f} CPU s")  # fmt: skip
            delete_prefix(client, server, f"{prefix}/")
            server.vacuum()
    finally:
        server.down()
        prefect.down()
        if any(r["ingest"]["rc"] for r in rows):
            shutil.copytree(logs, BENCH / ".scale-logs", dirs_exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1))
    ok = all(r["ingest"]["rc"] == 0 and r["fixed"]["rc"] == 0 and r["stored"] >= r["bytes"] for r in rows)
    return 0 if ok else 1


def render(rows: list[dict[str, Any]]) -> str:
    out = [
        "| runner | wall s | MB/s | fixed s | transfer MB/s | CPU s/GB: CLI | workers | server |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = next((r for r in rows if r["workers"] == 1), None)
    for r in rows:
        gb = r["bytes"] / 1e9
        wall, fixed = r["ingest"]["seconds"], r["fixed"]["seconds"]
        transfer = r["bytes"] / 1e6 / max(wall - fixed, 1e-9)
        cpu = f"{r['ingest']['cpu_seconds'] / gb:.2f} | {r['worker_cpu'] / gb:.2f} | {r['server_cpu'] / gb:.2f}"
        mbs = r["bytes"] / 1e6 / wall
        out.append(f"| {r['label']} | {wall:.1f} | {mbs:.0f} | {fixed:.1f} | {transfer:.0f} | {cpu} |")
    if base is not None:
        b1 = base["bytes"] / 1e6 / (base["ingest"]["seconds"] - base["fixed"]["seconds"])
        speedups = [
            f"{r['workers']} workers {r['bytes'] / 1e6 / (r['ingest']['seconds'] - r['fixed']['seconds']) / b1:.2f}x"
            for r in rows if r["workers"] and r["split_size_mb"] != 0
        ]  # fmt: skip
        out.append("\ntransfer rate against 1 worker: " + ", ".join(speedups))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
