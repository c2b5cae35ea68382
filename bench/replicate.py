"""`make bench` row for issue [R]: `ckptvault replicate` against `rclone copy`, SeaweedFS primary -> Ceph RGW
replica, the same committed save, in one run.

The save (a synthetic HF checkpoint, 8 shards + optimizer, `--size-gib`) is ingested once into the
primary (untimed, the library's upload with its catalog event, bench/lib_child.py). Then, interleaved by
repetition (the order rotates), each contender copies it to the replica, measured as a whole process
(wall, CPU of the process tree, peak RSS: bench/measure.py), checked (every object there, the primary's
sizes) and deleted again (untimed):

- `ckptvault replicate`: the command as a user runs it; the save's files are still on the hot tier
  where ingest read them, so it reads them from there (docs/replicas.md, "Where the bytes come from");
- `ckptvault replicate --from-primary`: every byte GETs from the primary, the same server-to-server
  path rclone takes;
- `rclone copy`: the primary's save prefix to the replica (Debian's rclone; both remotes set through
  RCLONE_CONFIG_* variables, defaults otherwise: 4 transfers, 5 MiB chunks, 4 chunks in flight);
- `rclone copy` with ckptvault's part size (`--s3-chunk-size 32M --s3-upload-cutoff 32M`), to separate
  the part size from the rest.

s5cmd is not a contender: it takes one endpoint, so it cannot copy between two servers.

Reported per contender: the median wall time, MB/s and CPU seconds per GB (the tool's, and the two
servers': the replica's and the primary's process trees from /proc), the peak RSS, and each one's
ratio against `rclone copy`. Everything runs on one machine: the servers' CPU is the same cores' (read
the servers' columns beside the tool's). The hot copy is in the page cache (just written), as a save
replicated soon after its ingest usually is.

    .venv/bin/python bench/replicate.py [--size-gib 1.5] [--reps 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bucket import BUCKET, delete_prefix, list_objects, s3_client
from bench.lifecycle import run_bench
from bench.machine import machine_info
from bench.measure import log, measure, run_quiet
from bench.paths import BENCH, REPO, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, Server
from bench.source import RUN, STEP, dir_bytes, write_config, write_source
from bench.units import GiB

REPLICA_BUCKET = "ckptvault-bench-replica"
SAVE = f"{RUN}/step-{STEP:010d}"  # the save's prefix under a store's prefix (ckptvault.checkpoint.manifest.step_dir)
BASELINE = "rclone"
TOOLS = ("ckptvault", "ckptvault-from-primary", "rclone", "rclone-32M")
INSTALL_RCLONE = "apt-get install -y rclone (Debian's package), or put rclone on PATH"


def rclone_binary() -> str:
    """rclone on PATH, or exit 2 naming how to get it: the bench's own tool check (CI does not run the
    bench, so infra/ci/check-tools.sh does not install it)."""
    found = shutil.which("rclone")
    if found is None:
        raise SystemExit(f"bench/replicate.py needs rclone: {INSTALL_RCLONE}")
    return found


def server_pids(server: Server) -> list[int]:
    """The server's daemons (SeaweedFS: weed.pid; Ceph: run/*.fgpid), for their CPU time."""
    out = []
    for f in [*server.state.glob("*.pid"), *server.state.glob("run/*.fgpid")]:
        with contextlib.suppress(OSError, ValueError):
            out.append(int(f.read_text().strip()))
    return out


def tree_cpu(pids: list[int]) -> float:
    """user + sys seconds of these processes and their live descendants."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            procs = [psutil.Process(pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
    return total


class ReplicateBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch: Path = args.scratch
        self.logs = self.scratch / "logs"
        self.rclone = rclone_binary()
        size = int(args.size_gib * GiB)
        self.primary = Server("seaweedfs", self.scratch, max(8 * GiB, 3 * size))
        self.replica = Server("ceph", self.scratch, max(16 * GiB, 6 * size))
        self.rows: list[dict[str, Any]] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_", "CKPTVAULT_"))}
        creds = self.scratch / "aws-credentials"
        creds.write_text(f"[replica]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
        (self.scratch / "aws-config").write_text("")
        (self.scratch / "rclone.conf").write_text("")
        env.update(
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
            PYTHONPATH=str(REPO),
            AWS_ACCESS_KEY_ID=ACCESS_KEY,  # the primary's, from the environment; the replica's from its profile
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_REGION=self.primary.region,
            AWS_DEFAULT_REGION=self.primary.region,
            AWS_CONFIG_FILE=str(self.scratch / "aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(creds),
            AWS_EC2_METADATA_DISABLED="true",
            RCLONE_CONFIG=str(self.scratch / "rclone.conf"),  # empty: no user remote leaks in
        )
        for name, server, provider in (("prim", self.primary, "SeaweedFS"), ("repl", self.replica, "Ceph")):
            p = f"RCLONE_CONFIG_{name.upper()}_"
            env.update({
                p + "TYPE": "s3", p + "PROVIDER": provider, p + "ENDPOINT": server.url, p + "REGION": server.region,
                p + "ACCESS_KEY_ID": ACCESS_KEY, p + "SECRET_ACCESS_KEY": SECRET_KEY,
            })  # fmt: skip
        return env

    def config(self, src_root: Path) -> Path:
        replica = (
            f'[[replicas]]\nname = "ceph"\nbucket = "{REPLICA_BUCKET}"\nprefix = "ck"\n'
            f'endpoint_url = "{self.replica.url}"\nregion = "{self.replica.region}"\nprofile = "replica"\n'
        )
        return write_config(self.scratch / "primary.toml", self.primary, "prim", src_root, replica)

    def command(self, tool: str, cfg: Path) -> tuple[list[str], str]:
        """The command line and the replica prefix it writes under (the save is at SAVE below it)."""
        ckv = [str(VENV_BIN / "ckptvault"), "--config", str(cfg), "replicate"]
        rclone = [self.rclone, "copy", f"prim:{BUCKET}/prim/{SAVE}", f"repl:{REPLICA_BUCKET}/rc/{SAVE}"]
        if tool == "ckptvault":
            return ckv, "ck/"
        if tool == "ckptvault-from-primary":
            return [*ckv, "--from-primary"], "ck/"
        if tool == "rclone":
            return rclone, "rc/"
        if tool == "rclone-32M":
            return [*rclone, "--s3-chunk-size", "32M", "--s3-upload-cutoff", "32M"], "rc/"
        raise ValueError(tool)

    def one(self, tool: str, rep: int, cfg: Path, env: dict[str, str], want: dict[str, int]) -> dict[str, Any]:
        cmd, prefix = self.command(tool, cfg)
        pids_p, pids_r = server_pids(self.primary), server_pids(self.replica)
        p0, r0 = tree_cpu(pids_p), tree_cpu(pids_r)
        m = measure(cmd, env, self.logs / f"{tool}.log")
        m["primary_cpu"], m["replica_cpu"] = tree_cpu(pids_p) - p0, tree_cpu(pids_r) - r0
        client = s3_client(self.replica)
        there = prefix + SAVE + "/"
        got = {o["Key"][len(there) :]: o["Size"] for o in list_objects_in(client, REPLICA_BUCKET, there)}
        m.update(tool=tool, rep=rep, bytes=sum(want.values()), ok=m["rc"] == 0 and got == want)
        if not m["ok"]:
            m["problem"] = f"rc={m['rc']}, {len(got)} of {len(want)} objects as the primary's"
        m["mb_s"] = m["bytes"] / 1e6 / m["seconds"]
        flag = "" if m["ok"] else f"  FAILED: {m['problem']}"
        log(f"  {tool:23} rep {rep}: {m['seconds']:6.1f} s  {m['mb_s']:6.0f} MB/s  {m['cpu_seconds']:5.1f} CPU s  "
            f"{m['max_rss_mib']:5.0f} MiB{flag}")  # fmt: skip
        if tool == "ckptvault" and rep == self.args.reps - 1:
            # the fixed cost of a pass (start-up, the replica's bucket check, the catalog, one HEAD) when
            # the save is already there: what the whole process adds on top of the copy
            m["fixed"] = measure(cmd, env, self.logs / "fixed.log")
            log(f"  ckptvault replicate with nothing to copy: {m['fixed']['seconds']:.1f} s")
        delete_in(client, self.replica, REPLICA_BUCKET, prefix)
        return m

    def main(self) -> int:
        a = self.args
        started = dt.datetime.now(dt.UTC)
        self.logs.mkdir(parents=True, exist_ok=True)
        env = self.env()
        log(f"scratch {self.scratch}; writing a {a.size_gib:g} GiB HF checkpoint (8 shards + optimizer)")
        src_root = self.scratch / "hot"
        ck = write_source(src_root, int(a.size_gib * GiB), STEP)
        nbytes = dir_bytes(ck)
        for s in (self.primary, self.replica):
            t0 = time.perf_counter()
            s.up()
            log(f"  {s.kind} at {s.url} in {time.perf_counter() - t0:.0f} s")
        s3_client(self.primary).create_bucket(Bucket=BUCKET)
        s3_client(self.replica).create_bucket(Bucket=REPLICA_BUCKET)
        cfg = self.config(src_root)
        run_quiet([sys.executable, str(BENCH / "lib_child.py"), "upload", str(cfg), str(STEP), "--record"], env=env)
        save = f"prim/{SAVE}/"
        want = {o["Key"][len(save) :]: o["Size"] for o in list_objects(s3_client(self.primary), save)}
        log(f"  ingested: {nbytes / GiB:.2f} GiB of files, {len(want)} objects with the manifest")
        # warm-up (untimed): first connections, the bucket probes, rclone's and Python's first start
        for tool in ("ckptvault-from-primary", "rclone"):
            cmd, prefix = self.command(tool, cfg)
            run_quiet(cmd, env=env)
            delete_in(s3_client(self.replica), self.replica, REPLICA_BUCKET, prefix)
        log(f"replicate, {a.reps} reps interleaved")
        for rep in range(a.reps):
            order = TOOLS[rep % len(TOOLS) :] + TOOLS[: rep % len(TOOLS)]
            for tool in order:
                self.rows.append(self.one(tool, rep, cfg, env, want))
        summary = summarize(self.rows)
        text = render(summary, nbytes, a.reps)
        print("\n" + text)
        if a.json:
            meta = machine_info()
            meta["rclone"] = run_quiet([self.rclone, "version"], check=False).splitlines()[0]
            meta.update(started=started.isoformat(), args={k: str(v) for k, v in vars(a).items()})
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps({"meta": meta, "bytes": nbytes, "summary": summary, "runs": self.rows},
                                         indent=1, default=str))  # fmt: skip
        return 0 if all(r["ok"] for r in self.rows) else 1

    def cleanup(self) -> None:
        for s in (self.primary, self.replica):
            with contextlib.suppress(Exception):
                s.down()
        if self.rows and not all(r["ok"] for r in self.rows):
            shutil.copytree(self.logs, BENCH / ".replicate-logs", dirs_exist_ok=True)
        if not self.args.keep_scratch:
            subprocess.run(["rm", "-rf", str(self.scratch)], check=False)


def list_objects_in(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def delete_in(client: Any, server: Server, bucket: str, prefix: str) -> None:
    """bench/bucket.py's delete_prefix for the replica's own bucket."""
    if bucket == BUCKET:
        delete_prefix(client, server, prefix)
        return
    for o in list_objects_in(client, bucket, prefix):
        client.delete_object(Bucket=bucket, Key=o["Key"])
    with contextlib.suppress(Exception):
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
            for u in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for tool in TOOLS:
        rs = [r for r in rows if r["tool"] == tool and r["ok"]]
        if not rs:
            continue
        gb = rs[0]["bytes"] / 1e9
        out[tool] = {
            "seconds": statistics.median(r["seconds"] for r in rs),
            "mb_s": statistics.median(r["mb_s"] for r in rs),
            "cpu_s_per_gb": statistics.median(r["cpu_seconds"] for r in rs) / gb,
            "primary_cpu_s_per_gb": statistics.median(r["primary_cpu"] for r in rs) / gb,
            "replica_cpu_s_per_gb": statistics.median(r["replica_cpu"] for r in rs) / gb,
            "max_rss_mib": max(r["max_rss_mib"] for r in rs),
            "ok_reps": len(rs),
        }
        fixed = [r["fixed"]["seconds"] for r in rs if "fixed" in r]
        if fixed:
            out[tool]["fixed_seconds"] = fixed[0]
    base = out.get(BASELINE)
    for s in out.values():
        s["speed_vs_rclone"] = base["seconds"] / s["seconds"] if base else float("nan")
    return out


def render(summary: dict[str, dict[str, float]], nbytes: int, reps: int) -> str:
    lines = [
        f"SeaweedFS -> Ceph RGW, one save of {nbytes / GiB:.2f} GiB, median of {reps} interleaved reps",
        "",
        "| tool | wall s | MB/s | x rclone | CPU s/GB: tool | primary | replica | peak RSS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tool, s in summary.items():
        lines.append(
            f"| {tool} | {s['seconds']:.1f} | {s['mb_s']:.0f} | {s['speed_vs_rclone']:.2f} | {s['cpu_s_per_gb']:.2f} | "
            f"{s['primary_cpu_s_per_gb']:.2f} | {s['replica_cpu_s_per_gb']:.2f} | {s['max_rss_mib']:.0f} |"
        )
    fixed = summary.get("ckptvault", {}).get("fixed_seconds")
    if fixed is not None:
        lines.append(f"\n`ckptvault replicate` with nothing to copy (the fixed cost of a pass): {fixed:.1f} s")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.5, help="the save's size (default 1.5: a run under 5 minutes)")
    p.add_argument("--reps", type=int, default=3, help="repetitions, interleaved; medians are reported")
    p.add_argument("--scratch", type=Path, default=BENCH / ".scratch-replicate", help="bench data (deleted at the end)")
    p.add_argument("--keep-scratch", action="store_true", help="do not delete the scratch dir (debugging)")
    p.add_argument("--json", type=Path, default=None, help="write the runs and the summary here")
    args = p.parse_args()
    args.scratch = args.scratch.resolve()
    return run_bench(args.scratch, lambda: ReplicateBench(args))


if __name__ == "__main__":
    sys.exit(main())
