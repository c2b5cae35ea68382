"""`ckptvault restore --profile --json` of one save from two or more source trees (a commit before a change
and after it, e.g. `git archive C | tar -x -C /tmp/before`), interleaved on one SeaweedFS, without and with a
Prefect API, so a loaded shared box hits every tree alike: each phase's median, the wall time and
`first_byte` per tree and mode (issue [W], bench/README.md "Where a command's time goes").

    python -m bench.restore_ab --trees before=/tmp/before after=. --reps 3 --json out.json [--no-prefect-api] [--step N]

The save is ingested once, by the first tree. Scratch under bench/.scratch-restore-ab, deleted at the end.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.bucket import BUCKET, s3_client
from bench.paths import BENCH, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, PrefectServer, Server, stop_leftovers
from bench.source import RUN, STEP, write_config, write_source

Row = dict[str, Any]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="+", required=True, help="NAME=PATH of each source tree")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--no-prefect-api", action="store_true")
    ap.add_argument("--step", default=None, help="restore --step N (default: latest, the command's default)")
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args(argv)
    trees = {name: str(Path(path).resolve()) for name, path in (t.split("=", 1) for t in a.trees)}
    scratch = BENCH / ".scratch-restore-ab"
    stop_leftovers(scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    size = int(a.size_gib * 2**30)
    server = Server("seaweedfs", scratch, 2 * size)
    prefect = PrefectServer(scratch / "prefect")
    dropped = ("AWS_PROFILE", "CKPTVAULT_CONFIG", "PREFECT_API_URL", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_EC2_METADATA_DISABLED="true",
               PREFECT_HOME=str(scratch / "prefect"), DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}")  # fmt: skip
    modes = ["direct"] if a.no_prefect_api else ["direct", "prefect"]
    ckptvault = str(VENV_BIN / "ckptvault")
    first = next(iter(trees.values()))
    out: list[Row] = []
    try:
        server.up()
        env.update(AWS_REGION=server.region)
        if "prefect" in modes:
            prefect.up(dict(env, PYTHONPATH=first))
        s3_client(server).create_bucket(Bucket=BUCKET)
        src = scratch / "hot"
        write_source(src, size, STEP)
        cfg = write_config(scratch / "c.toml", server, "ab", src)
        p = subprocess.run([ckptvault, "--config", str(cfg), "ingest", "--json"], env=dict(env, PYTHONPATH=first),
                           capture_output=True, text=True)  # fmt: skip
        if p.returncode != 0:
            raise RuntimeError(f"ingest exited {p.returncode}: {p.stderr[-2000:]}")
        for rep in range(a.reps):
            for mode in modes:
                names = list(trees) if rep % 2 == 0 else list(reversed(trees))  # neither tree always first
                for name in names:
                    menv = dict(env, PYTHONPATH=trees[name])
                    if mode == "prefect":
                        menv["PREFECT_API_URL"] = prefect.url
                    dest = scratch / f"back-{name}-{mode}-{rep}"
                    load = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    cmd = [ckptvault, "--config", str(cfg), "restore", RUN, "--dest", str(dest), "--profile", "--json"]
                    cmd += ["--step", a.step] if a.step is not None else []
                    p = subprocess.run(cmd, env=menv, capture_output=True, text=True)
                    wall = time.perf_counter() - t0
                    if p.returncode != 0:
                        raise RuntimeError(f"restore ({name}, {mode}) exited {p.returncode}: {p.stderr[-3000:]}")
                    prof = json.loads(p.stdout)["profile"]
                    shutil.rmtree(dest, ignore_errors=True)
                    row: Row = dict(tree=name, mode=mode, rep=rep, wall=wall, load=load, total=prof["total_s"],
                                    first_byte=prof.get("marks", {}).get("first_byte"),
                                    phases={x["phase"]: x["seconds"] for x in prof["phases"]})  # fmt: skip
                    out.append(row)
                    print(f"rep {rep} {mode:7} {name}: wall {wall:.2f} s, first byte {row['first_byte']} s, "
                          f"load {load:.1f}", flush=True)  # fmt: skip
    finally:
        prefect.down()
        server.down()
        shutil.rmtree(scratch, ignore_errors=True)
    a.json.write_text(json.dumps(out, indent=1))
    print(table(out, modes, list(trees)))
    return 0


def table(out: list[Row], modes: list[str], trees: list[str]) -> str:
    """One column per mode and tree, the median over the reps."""
    names = list(dict.fromkeys(n for r in out for n in r["phases"]))
    cols = [(m, t) for m in modes for t in trees]

    def med(m: str, t: str, f: Callable[[Row], float | None]) -> str:
        got = [v for r in out if r["mode"] == m and r["tree"] == t if (v := f(r)) is not None]
        return f"{statistics.median(got):.2f}" if got else "-"

    def line(label: str, f: Callable[[Row], float | None]) -> str:
        return f"| {label} | " + " | ".join(med(m, t, f) for m, t in cols) + " |"

    lines = ["| phase | " + " | ".join(f"{t}, {m}" for m, t in cols) + " |", "| --- |" + " ---: |" * len(cols)]
    lines += [line(n, lambda r, n=n: r["phases"].get(n, 0.0)) for n in names]  # type: ignore[misc]
    lines += [line("**total (printed)**", lambda r: r["total"]), line("wall", lambda r: r["wall"]),
              line("*first byte, s from the start*", lambda r: r["first_byte"])]  # fmt: skip
    loads = [r["load"] for r in out]
    lines.append(f"\nload average (1 min) before each restore: {min(loads):.1f}-{max(loads):.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
