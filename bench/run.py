"""ckptvault against peer tools on the same servers and data, in one run (`make bench`).

See bench/README.md. In short: writes a synthetic HF checkpoint, starts SeaweedFS and Ceph RGW with
bench-only state and ports, and a Prefect server; measures upload (`ckptvault ingest`, the library
data path alone, `aws s3 cp --recursive`, `s5cmd cp`, boto3 `upload_file`) and download
(`ckptvault restore`, the library, the same peers) interleaved by repetition, median of --reps; one
big ingest for peak RSS; discovery against `find`; planning; validation. Prints a table, writes JSON
to bench/results/, and stops and deletes everything it started, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.comparison import Bench
from bench.lifecycle import run_bench
from bench.paths import BENCH


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=4, help="checkpoint size for the comparisons (default 4)")
    p.add_argument(
        "--big-gib",
        type=float,
        default=16,
        help="the big run: ingest for peak RSS, then restore against s5cmd (default 16; 0 skips)",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions, interleaved; medians are reported")
    p.add_argument("--servers", default="seaweedfs,ceph", help="comma-separated: seaweedfs,ceph")
    p.add_argument("--discovery-dirs", type=int, default=10_000, help="checkpoint dirs in the discovery tree (0 skips)")
    p.add_argument("--files-per-dir", type=int, default=100, help="files per checkpoint dir")
    p.add_argument("--plan-checkpoints", type=int, default=100_000, help="checkpoints for the planner (0 skips)")
    p.add_argument("--skip-validation", action="store_true")
    p.add_argument(
        "--tuned",
        default="",
        metavar="SPEC",
        help="also measure the library data path with other [store] settings: PART_MB,CONC (e.g. 16,8) "
        "or TOML lines separated by ';' (e.g. 'sign_payload = \"never\"')",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 512 MiB, 1 GiB big, 1,000 dirs, 1 rep")
    p.add_argument("--scratch", type=Path, default=BENCH / ".scratch", help="bench data (deleted at the end)")
    p.add_argument("--keep-scratch", action="store_true", help="do not delete the scratch dir (debugging)")
    a = p.parse_args(argv)
    if a.quick:
        a.size_gib, a.big_gib, a.reps = 0.5, min(a.big_gib, 1), 1
        a.discovery_dirs, a.plan_checkpoints = min(a.discovery_dirs, 1000), min(a.plan_checkpoints, 10_000)
    a.scratch = a.scratch.resolve()
    return a


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(args.scratch, lambda: Bench(args))


if __name__ == "__main__":
    sys.exit(main())
