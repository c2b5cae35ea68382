"""`ckptvault restore --only model` against a whole restore of the same save, interleaved on one SeaweedFS:
wall time, CPU and peak memory of the command (bench/measure.py), and the bytes each wrote, per rep and as
the median ratio. The save is the bench's synthetic HF checkpoint (bench/source.py): its weights a third,
its optimizer state two thirds, as Adam's two moments make a real one.

    python bench/partial_restore.py --size-gib 1 --reps 3 --json bench/results/partial-restore.json
    python bench/partial_restore.py --format dcp --size-gib 1 --reps 3 --json bench/results/partial-restore-dcp.json

`--format dcp`: a torch DCP save of 64 MiB layers and AdamW's moments (bench/source.py write_dcp_source):
`--only model` is then tensor-level, reading only the blocks around the model's ranges. Bytes written are
allocated blocks (a restored .distcp is sparse).

Scratch under bench/.scratch-partial-restore, deleted at the end. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bucket import BUCKET, s3_client
from bench.measure import measure
from bench.paths import BENCH, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, Server, stop_leftovers
from bench.source import RUN, STEP, write_config, write_dcp_source, write_source

KINDS: dict[str, list[str]] = {"whole": [], "--only model": ["--only", "model"]}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument(
        "--format", choices=["hf", "dcp"], default="hf",
        help="hf: the synthetic HF save (file-level); dcp: a torch DCP save (tensor-level, blocks read)",
    )  # fmt: skip
    a = ap.parse_args(argv)
    scratch = BENCH / ".scratch-partial-restore"
    stop_leftovers(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    size = int(a.size_gib * 2**30)
    server = Server("seaweedfs", scratch, 2 * size)
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "CKPTVAULT_CONFIG", "PREFECT_API_URL")}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_EC2_METADATA_DISABLED="true")
    ckptvault = str(VENV_BIN / "ckptvault")
    rows: list[dict[str, Any]] = []
    try:
        server.up()
        env.update(AWS_REGION=server.region)
        s3_client(server).create_bucket(Bucket=BUCKET)
        src = scratch / "hot"
        if a.format == "dcp":
            write_dcp_source(src, size, STEP)
        else:
            write_source(src, size, STEP)
        cfg = write_config(scratch / "c.toml", server, "partial", src, fmt=a.format)
        p = subprocess.run([ckptvault, "--config", str(cfg), "ingest"], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"ingest exited {p.returncode}: {p.stderr[-2000:]}")
        for rep in range(a.reps):
            kinds = list(KINDS) if rep % 2 == 0 else list(reversed(KINDS))  # neither always first
            for kind in kinds:
                dest = scratch / f"back-{rep}"
                cmd = [ckptvault, "--config", str(cfg), "restore", RUN, "--dest", str(dest), *KINDS[kind]]
                got = measure(cmd, env, scratch / "restore.log")
                if got["rc"] != 0:
                    raise RuntimeError(f"{kind} exited {got['rc']}: see {scratch / 'restore.log'}")
                row = dict(kind=kind, rep=rep, bytes=_allocated(dest), load=os.getloadavg()[0], **got)
                rows.append(row)
                shutil.rmtree(dest)
                print(f"rep {rep} {kind:13} {row['seconds']:.2f} s, {row['bytes'] / 2**20:.0f} MiB, "
                      f"CPU {row['cpu_seconds']:.2f} s, peak {row['max_rss_mib']:.0f} MiB", flush=True)  # fmt: skip
    finally:
        server.down()
        shutil.rmtree(scratch, ignore_errors=True)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


def _allocated(dest: Path) -> int:
    """The bytes the restore wrote: allocated blocks, so a sparse .distcp counts what it holds, not its size."""
    return sum(p.stat().st_blocks * 512 for p in dest.rglob("*") if p.is_file())


def table(rows: list[dict[str, Any]]) -> str:
    def med(kind: str, field: str) -> float:
        return float(statistics.median(r[field] for r in rows if r["kind"] == kind))

    lines = ["| restore | wall s | CPU s | peak RSS MiB | bytes written |", "| --- | ---: | ---: | ---: | ---: |"]
    for kind in KINDS:
        lines.append(f"| {kind} | {med(kind, 'seconds'):.2f} | {med(kind, 'cpu_seconds'):.2f} | "
                     f"{med(kind, 'max_rss_mib'):.0f} | {med(kind, 'bytes') / 2**20:.0f} MiB |")  # fmt: skip
    ratio = med("--only model", "seconds") / med("whole", "seconds")
    share = med("--only model", "bytes") / med("whole", "bytes")
    loads = [r["load"] for r in rows]
    lines.append(f"\n--only model / whole: {ratio:.2f}x the wall time, {share:.2f}x the bytes; "
                 f"load average {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
