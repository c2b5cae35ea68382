"""Where a whole `ckptvault ingest` and `ckptvault restore` spend their wall time (`--profile`, docs/
performance.md, "Where a command's time goes"): one synthetic HF checkpoint (8 shards) on SeaweedFS, each
command run as a user runs it (the console script), without and with a Prefect API, alternating.
Prints a markdown table of the phases (median over --reps), the printed total and the wall time this
script measured around the process, and the load average.

    python -m bench.profile_cmd [--size-gib 1] [--reps 1] [--no-prefect-api] [--json out.json]
                                [--tree before=/tmp/before]

`--tree LABEL=DIR` runs the same commands from another checkout too (e.g. a `git archive` of main),
interleaved with this one's in every rep: columns `ingest prefect @before` beside `ingest prefect`.

Scratch (the servers' state, the checkpoint, the restores) is under bench/.scratch-profile, deleted at
the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bucket import BUCKET, delete_prefix, s3_client
from bench.measure import log
from bench.paths import BENCH, REPO, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, PrefectServer, Server, stop_leftovers
from bench.source import RUN, STEP, dir_bytes, write_config, write_source

GiB = 2**30


def _run(cmd: Sequence[str], env: dict[str, str], logfile: Path) -> dict[str, Any]:
    """The command's JSON document (with its `profile`) and the wall time measured around it."""
    t0 = time.perf_counter()
    p = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    with open(logfile, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n{p.stdout}\n{p.stderr}\n")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    doc = json.loads(p.stdout)
    return {"wall": wall, "profile": doc["profile"]}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--no-prefect-api", action="store_true", help="only the direct mode (no Prefect server)")
    ap.add_argument("--scratch", type=Path, default=BENCH / ".scratch-profile")
    ap.add_argument("--json", type=Path, default=None, help="write every measurement here")
    ap.add_argument("--tree", action="append", default=[], help="LABEL=DIR: another checkout, interleaved")
    args = ap.parse_args(argv)
    trees: list[tuple[str, Path]] = [("", REPO)]
    for spec in args.tree:
        label, _, d = spec.partition("=")
        if not label or not d or not (Path(d) / "ckptvault_cli").is_dir():
            ap.error(f"--tree {spec}: want LABEL=DIR, DIR a ckptvault checkout")
        trees.append((f" @{label}", Path(d).resolve()))
    scratch: Path = args.scratch
    stop_leftovers(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    logfile = scratch / "commands.log"
    size = int(args.size_gib * GiB)
    server = Server("seaweedfs", scratch, 2 * size)
    prefect = PrefectServer(scratch / "prefect")
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "CKPTVAULT_CONFIG", "PREFECT_API_URL")}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_EC2_METADATA_DISABLED="true",
               PYTHONPATH=str(REPO), PREFECT_HOME=str(scratch / "prefect"), DO_NOT_TRACK="1",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")  # fmt: skip
    modes = ["direct"] if args.no_prefect_api else ["direct", "prefect"]
    results: dict[str, list[dict[str, Any]]] = {}
    loads: list[float] = []
    try:
        server.up()
        env.update(AWS_REGION=server.region)
        if "prefect" in modes:
            prefect.up(env)
        client = s3_client(server)
        client.create_bucket(Bucket=BUCKET)
        src = scratch / "hot"
        ck = write_source(src, size, STEP)
        total = dir_bytes(ck)
        log(f"checkpoint: {total / GiB:.2f} GiB, 8 shards + optimizer (hf)")
        ckptvault = str(VENV_BIN / "ckptvault")
        # alternating: a slow minute of the shared box hits every mode and tree alike; the trees' order
        # rotates by rep, so the first (cold) command of a rep is not always the same tree's
        order = [(r, t, m) for r in range(args.reps) for t in trees[r % len(trees) :] + trees[: r % len(trees)]
                 for m in modes]  # fmt: skip
        for rep, (label, tree), mode in order:
            menv = dict(env, PYTHONPATH=str(tree))
            if mode == "prefect":
                menv["PREFECT_API_URL"] = prefect.url
            prefix = f"prof-{mode}-{rep}{label.replace(' @', '-')}"
            cfg = write_config(scratch / f"{prefix}.toml", server, prefix, src)
            loads.append(os.getloadavg()[0])
            up = _run([ckptvault, "--config", str(cfg), "ingest", "--profile", "--json"], menv, logfile)
            dest = scratch / f"back-{prefix}"
            loads.append(os.getloadavg()[0])
            down = _run(
                [ckptvault, "--config", str(cfg), "restore", RUN, "--dest", str(dest), "--profile", "--json"],
                menv, logfile,
            )  # fmt: skip
            shutil.rmtree(dest, ignore_errors=True)
            delete_prefix(client, server, prefix)
            results.setdefault(f"ingest {mode}{label}", []).append(up)
            results.setdefault(f"restore {mode}{label}", []).append(down)
            log(f"rep {rep} {mode}{label}: ingest {up['wall']:.2f} s, restore {down['wall']:.2f} s")
    finally:
        prefect.down()
        server.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(table(results, total, loads))
    if args.json:
        args.json.write_text(json.dumps({"bytes": total, "loadavg": loads, "results": results}, indent=1))
    return 0


def table(results: dict[str, list[dict[str, Any]]], total: int, loads: list[float]) -> str:
    """Phases as rows (every name any column has, in the order the commands print them), one column
    per command and mode: the median seconds over the reps."""
    names: list[str] = []
    for runs in results.values():
        after = -1  # a name only one command has goes after the one before it in that command's order
        for p in runs[0]["profile"]["phases"]:
            if p["phase"] == "other":
                continue
            if p["phase"] not in names:
                names.insert(after + 1, p["phase"])
            after = names.index(p["phase"])
    names.append("other")
    cols = list(results)

    def med(col: str, name: str) -> str:
        vals = [sum(p["seconds"] for p in r["profile"]["phases"] if p["phase"] == name) for r in results[col]]
        if not any(p["phase"] == name for p in results[col][0]["profile"]["phases"]):
            return "-"
        return f"{statistics.median(vals):.2f}"

    lines = [f"{total / GiB:.2f} GiB; load average (1 min) before each command: "
             f"{min(loads):.1f}-{max(loads):.1f}", "",
             "| phase | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]  # fmt: skip
    lines += [f"| {n} | " + " | ".join(med(c, n) for c in cols) + " |" for n in names]
    printed = [statistics.median(r["profile"]["total_s"] for r in results[c]) for c in cols]
    walls = [statistics.median(r["wall"] for r in results[c]) for c in cols]
    lines.append("| **total (printed)** | " + " | ".join(f"{t:.2f}" for t in printed) + " |")
    lines.append("| wall, measured around the process | " + " | ".join(f"{w:.2f}" for w in walls) + " |")

    def med_mark(col: str, name: str = "first_byte") -> str:
        vals = [r["profile"].get("marks", {}).get(name) for r in results[col]]
        got = [v for v in vals if v is not None]
        return f"{statistics.median(got):.2f}" if got else "-"

    lines.append("| *first bytes moved, s from the process's start* | " + " | ".join(med_mark(c) for c in cols) + " |")
    beside = sorted({a["phase"] for runs in results.values() for r in runs for a in r["profile"].get("alongside", [])})
    for n in beside:  # what ran beside the main thread and overlapped it (the gate child): not in the total

        def med_beside(col: str, name: str = n) -> str:
            vals = [sum(a["thread_seconds"] for a in r["profile"]["alongside"] if a["phase"] == name)
                    for r in results[col]]  # fmt: skip
            return f"{statistics.median(vals):.2f}" if any(vals) else "-"

        lines.append(f"| *beside: {n}* | " + " | ".join(med_beside(c) for c in cols) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
