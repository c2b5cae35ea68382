"""The benchmark itself: ckptvault's CLI and library data path against awscli, s5cmd and boto3 on the
same servers and data, interleaved by repetition; the big run; discovery, planning, validation and the
micro benchmarks of bench/micro.py. bench/run.py parses the command line and runs it."""

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

from bench.bucket import BUCKET, delete_prefix, s3_client, stored_bytes
from bench.machine import machine_info
from bench.measure import log, measure, run_quiet
from bench.paths import BENCH, REPO, VENV_BIN, s5cmd_binary
from bench.report import render, summarize
from bench.servers import ACCESS_KEY, SECRET_KEY, PrefectServer, Server
from bench.source import RUN, STEP, dir_bytes, write_config, write_source
from bench.units import GiB

BIG_STEP = 200
UPLOAD_TOOLS = ("ckptvault", "ckptvault-lib", "awscli", "s5cmd", "boto3")
DOWNLOAD_TOOLS = ("ckptvault", "ckptvault-lib", "awscli", "s5cmd", "boto3")


def tuned_toml(spec: str) -> str:
    """`--tuned`: "PART_MB,CONC" (the old short form) or [store] TOML lines separated by ';'."""
    if "=" not in spec:
        part, conc = (int(x) for x in spec.split(","))
        return f"part_size_mb = {part}\nmax_concurrency = {conc}\n"
    return "".join(line.strip() + "\n" for line in spec.split(";") if line.strip())


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch: Path = args.scratch
        self.logs = self.scratch / "logs"
        self.results: dict[str, Any] = {"transfers": [], "notes": []}
        self.env: dict[str, str] = {}
        self.s5cmd = str(s5cmd_binary())
        self.tuned_toml = ""
        self.upload_tools: tuple[str, ...] = UPLOAD_TOOLS
        self.download_tools: tuple[str, ...] = DOWNLOAD_TOOLS
        if args.tuned:
            self.tuned_toml = tuned_toml(args.tuned)
            self.upload_tools = (*UPLOAD_TOOLS[:2], "ckptvault-lib-tuned", *UPLOAD_TOOLS[2:])
            self.download_tools = (*DOWNLOAD_TOOLS[:2], "ckptvault-lib-tuned", *DOWNLOAD_TOOLS[2:])

    def child_env(self, server: Server | None, prefect_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
            DO_NOT_TRACK="1",
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_HOME=str(self.scratch / "prefect"),
            PREFECT_API_URL=prefect_url,
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_CONFIG_FILE=str(self.scratch / "aws-config"),  # empty: no user profile leaks in
            AWS_SHARED_CREDENTIALS_FILE=str(self.scratch / "aws-credentials"),
            AWS_EC2_METADATA_DISABLED="true",
            PYTHONPATH=str(REPO),
        )
        for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "CKPTVAULT_CONFIG"):
            env.pop(k, None)
        if server is not None:
            env.update(AWS_REGION=server.region, AWS_DEFAULT_REGION=server.region)
        return env

    # one upload by one tool; returns the measurement (data in the bucket is deleted afterwards)
    def upload(self, tool: str, server: Server, client: Any, src_root: Path, ck: Path, rep: int) -> dict[str, Any]:
        env = self.env_for[server.kind]
        prefix = f"up-{tool}-{rep}"
        py = sys.executable
        if tool in ("ckptvault", "ckptvault-lib", "ckptvault-lib-tuned"):
            extra = self.tuned_toml if tool == "ckptvault-lib-tuned" else ""
            cfg = write_config(self.scratch / f"cfg-{server.kind}-{prefix}.toml", server, prefix, src_root, extra)
            if tool == "ckptvault":
                cmd = [str(VENV_BIN / "ckptvault"), "--config", str(cfg), "ingest"]
            else:
                cmd = [py, str(BENCH / "lib_child.py"), "upload", str(cfg), str(STEP)]
            data_prefix = f"{prefix}/{RUN}/"
        elif tool == "awscli":
            cmd = _aws_cp(server, str(ck), f"s3://{BUCKET}/{prefix}/")
            data_prefix = f"{prefix}/"
        elif tool == "s5cmd":
            cmd = [self.s5cmd, "--endpoint-url", server.url, "cp", f"{ck}/*", f"s3://{BUCKET}/{prefix}/"]
            data_prefix = f"{prefix}/"
        elif tool == "boto3":
            cmd = [py, str(BENCH / "boto3_peer.py"), "upload", str(ck), server.url, BUCKET, prefix]
            data_prefix = f"{prefix}/"
        else:
            raise ValueError(tool)
        m = measure(cmd, env, self.logs / f"{server.kind}-upload-{tool}.log")
        names = {p.name for p in ck.iterdir()}
        got = stored_bytes(client, data_prefix, names)
        m["ok"] = m["rc"] == 0 and got == self.src_bytes
        if not m["ok"]:
            m["problem"] = f"rc={m['rc']}, stored {got} of {self.src_bytes} bytes"
        delete_prefix(client, server, f"{prefix}/")
        return m

    def download(self, tool: str, server: Server, rep: int) -> dict[str, Any]:
        env = self.env_for[server.kind]
        dest = self.scratch / "dl" / f"{tool}-{rep}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        from ckptvault.checkpoint.manifest import step_dir

        key_prefix = f"restore/{RUN}/{step_dir(STEP)}/"
        py = sys.executable
        cfg = str(self.restore_cfg[server.kind])
        if tool == "ckptvault":
            cmd = [
                str(VENV_BIN / "ckptvault"),
                "--config",
                cfg,
                "restore",
                RUN,
                "--step",
                str(STEP),
                "--dest",
                str(dest),
            ]
        elif tool == "ckptvault-lib":
            cmd = [py, str(BENCH / "lib_child.py"), "download", cfg, RUN, str(STEP), str(dest)]
        elif tool == "ckptvault-lib-tuned":
            cmd = [
                py,
                str(BENCH / "lib_child.py"),
                "download",
                str(self.restore_tuned_cfg[server.kind]),
                RUN,
                str(STEP),
                str(dest),
            ]
        elif tool == "awscli":
            cmd = _aws_cp(server, f"s3://{BUCKET}/{key_prefix}", str(dest))
        elif tool == "s5cmd":
            cmd = [self.s5cmd, "--endpoint-url", server.url, "cp", f"s3://{BUCKET}/{key_prefix}*", f"{dest}/"]
        elif tool == "boto3":
            cmd = [py, str(BENCH / "boto3_peer.py"), "download", server.url, BUCKET, key_prefix, str(dest)]
        else:
            raise ValueError(tool)
        m = measure(cmd, env, self.logs / f"{server.kind}-download-{tool}.log")
        got = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file() and p.name in self.src_names)
        m["ok"] = m["rc"] == 0 and got == self.src_bytes
        if not m["ok"]:
            m["problem"] = f"rc={m['rc']}, downloaded {got} of {self.src_bytes} bytes"
        shutil.rmtree(dest, ignore_errors=True)
        return m

    def record(self, server: str, op: str, tool: str, rep: int, m: dict[str, Any], nbytes: int) -> None:
        m.update(server=server, op=op, tool=tool, rep=rep, bytes=nbytes)
        m["mb_s"] = nbytes / 1e6 / m["seconds"]
        m["cpu_s_per_gb"] = m["cpu_seconds"] / (nbytes / 1e9)
        self.results["transfers"].append(m)
        flag = "" if m["ok"] else f"  FAILED: {m.get('problem')}"
        log(
            f"  {server:9} {op:8} {tool:13} rep {rep}: {m['mb_s']:7.1f} MB/s  {m['cpu_s_per_gb']:5.2f} CPU s/GB  "
            f"{m['max_rss_mib']:6.0f} MiB{flag}"
        )

    def transfers(self, server: Server, src_root: Path, ck: Path) -> None:
        client = s3_client(server)
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            client.create_bucket(Bucket=BUCKET)
        reps = self.args.reps
        # warm-up (untimed): first connections, the Prefect flow registered, the lifecycle rule set
        warm = write_config(self.scratch / f"cfg-{server.kind}-warm.toml", server, "warm", src_root)
        measure(
            [str(VENV_BIN / "ckptvault"), "--config", str(warm), "ingest"],
            self.env_for[server.kind],
            self.logs / f"{server.kind}-warmup.log",
        )
        delete_prefix(client, server, "warm/")
        log(f"{server.kind}: upload, {reps} reps interleaved")
        for rep in range(reps):
            tools = self.upload_tools
            order = tools[rep % len(tools) :] + tools[: rep % len(tools)]
            for tool in order:
                self.record(
                    server.kind,
                    "upload",
                    tool,
                    rep,
                    self.upload(tool, server, client, src_root, ck, rep),
                    self.src_bytes,
                )
        # the checkpoint every download reads: committed and in the catalog, so `restore` resolves it
        self.restore_cfg[server.kind] = write_config(
            self.scratch / f"cfg-{server.kind}-restore.toml", server, "restore", src_root
        )
        self.restore_tuned_cfg[server.kind] = write_config(
            self.scratch / f"cfg-{server.kind}-restore-tuned.toml", server, "restore", src_root, self.tuned_toml
        )
        run_quiet(
            [
                sys.executable,
                str(BENCH / "lib_child.py"),
                "upload",
                str(self.restore_cfg[server.kind]),
                str(STEP),
                "--record",
            ],
            env=self.env_for[server.kind],
        )
        log(f"{server.kind}: download, {reps} reps interleaved")
        for rep in range(reps):
            tools = self.download_tools
            order = tools[rep % len(tools) :] + tools[: rep % len(tools)]
            for tool in order:
                self.record(server.kind, "download", tool, rep, self.download(tool, server, rep), self.src_bytes)
        delete_prefix(client, server, "restore/")
        # the fixed cost of one `ckptvault ingest` (start-up, Prefect, discovery, the HEAD of a manifest)
        # when there is nothing to send: what the CLI adds on top of the data path
        noop = write_config(self.scratch / f"cfg-{server.kind}-noop.toml", server, "noop", src_root)
        measure(
            [str(VENV_BIN / "ckptvault"), "--config", str(noop), "ingest"],
            self.env_for[server.kind],
            self.logs / f"{server.kind}-noop.log",
        )
        m = measure(
            [str(VENV_BIN / "ckptvault"), "--config", str(noop), "ingest"],
            self.env_for[server.kind],
            self.logs / f"{server.kind}-noop.log",
        )
        self.results.setdefault("ingest_fixed_cost", {})[server.kind] = m
        log(
            f"  {server.kind}: `ckptvault ingest` with nothing to send: {m['seconds']:.1f} s, "
            f"{m['cpu_seconds']:.1f} CPU s, {m['max_rss_mib']:.0f} MiB"
        )
        delete_prefix(client, server, "noop/")

    def big(self, server: Server) -> None:
        gib = self.args.big_gib
        root = self.scratch / "big-src"
        log(f"writing a {gib:g} GiB checkpoint for the peak-RSS run")
        t0 = time.perf_counter()
        write_source(root, int(gib * GiB), BIG_STEP)
        log(f"  written in {time.perf_counter() - t0:.0f} s")
        nbytes = dir_bytes(root)
        cfg = write_config(self.scratch / "cfg-big.toml", server, "big", root)
        m = measure(
            [str(VENV_BIN / "ckptvault"), "--config", str(cfg), "ingest"],
            self.env_for[server.kind],
            self.logs / f"{server.kind}-big.log",
        )
        m.update(
            ok=m["rc"] == 0,
            bytes=nbytes,
            mb_s=nbytes / 1e6 / m["seconds"],
            cpu_s_per_gb=m["cpu_seconds"] / (nbytes / 1e9),
            server=server.kind,
            gib=gib,
        )
        self.results["big_ingest"] = m
        log(f"  big ingest {gib:g} GiB: peak RSS {m['max_rss_mib']:.0f} MiB, {m['mb_s']:.0f} MB/s, rc {m['rc']}")
        shutil.rmtree(root, ignore_errors=True)  # room for the restores
        if m["ok"]:
            self.big_restore(server, cfg, nbytes, gib)
        delete_prefix(s3_client(server), server, "big/")

    def big_restore(self, server: Server, cfg: Path, nbytes: int, gib: float) -> None:
        """The same checkpoint back with the CLI and with s5cmd, once each (s5cmd first): where the
        CLI's fixed start-up, a few seconds, is small against the transfer, as it is for real
        checkpoints. One repetition, so read it beside the 4 GiB medians, not instead of them."""
        from ckptvault.checkpoint.manifest import step_dir

        key_prefix = f"big/{RUN}/{step_dir(BIG_STEP)}/"
        out: dict[str, Any] = {"gib": gib, "server": server.kind, "bytes": nbytes}
        for tool in ("s5cmd", "ckptvault"):
            dest = self.scratch / "dl" / f"big-{tool}"
            shutil.rmtree(dest, ignore_errors=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if tool == "s5cmd":
                cmd = [self.s5cmd, "--endpoint-url", server.url, "cp", f"s3://{BUCKET}/{key_prefix}*", f"{dest}/"]
            else:
                restore = ["restore", RUN, "--step", str(BIG_STEP), "--dest", str(dest)]
                cmd = [str(VENV_BIN / "ckptvault"), "--config", str(cfg), *restore]
            r = measure(cmd, self.env_for[server.kind], self.logs / f"{server.kind}-big-restore-{tool}.log")
            got = dir_bytes(dest) if dest.exists() else 0
            # the CLI also writes the format's pointer file (none for HF) and nothing else
            r.update(ok=r["rc"] == 0 and got >= nbytes, mb_s=nbytes / 1e6 / r["seconds"])
            r["cpu_s_per_gb"] = r["cpu_seconds"] / (nbytes / 1e9)
            out[tool] = r
            log(f"  big restore {gib:g} GiB, {tool}: {r['mb_s']:.0f} MB/s, {r['max_rss_mib']:.0f} MiB, rc {r['rc']}")
            shutil.rmtree(dest, ignore_errors=True)
        self.results["big_restore"] = out

    def local(self) -> None:
        a = self.args
        py = sys.executable
        env = self.child_env(None, self.prefect_url)
        out: dict[str, Any] = {}
        if a.discovery_dirs > 0:
            root = self.scratch / "tree"
            log(f"discovery: making {a.discovery_dirs} checkpoint dirs x {a.files_per_dir} files")
            made = json.loads(
                run_quiet(
                    [py, str(BENCH / "micro.py"), "make-tree", str(root), str(a.discovery_dirs), str(a.files_per_dir)],
                    env=env,
                ).splitlines()[-1]
            )
            log(f"  tree made in {made['seconds']:.0f} s")
            # warm the dentry/inode caches, so every contender below reads the same cached tree
            subprocess.run(["find", str(root)], stdout=subprocess.DEVNULL, check=True)
            rows: dict[str, list[dict[str, Any]]] = {"ckptvault": [], "find": [], "find_stat": []}
            for rep in range(a.reps):
                m = measure([py, str(BENCH / "micro.py"), "discover", str(root)], env, self.logs / "discover.log")
                inner = json.loads((self.logs / "discover.log").read_text().splitlines()[-1])
                m.update(inner_seconds=inner["seconds"], checkpoints=inner["checkpoints"], files=inner["files"])
                rows["ckptvault"].append(m)
                rows["find"].append(measure(["find", str(root), "-type", "f"], env, Path(os.devnull)))
                rows["find_stat"].append(
                    measure(["find", str(root), "-type", "f", "-printf", "%s %T@\n"], env, Path(os.devnull))
                )
                log(
                    f"  rep {rep}: discover() {inner['seconds']:.2f} s ({inner['checkpoints']} ckpts, "
                    f"{inner['files']} files); find {rows['find'][-1]['seconds']:.2f} s; "
                    f"find -printf size,mtime {rows['find_stat'][-1]['seconds']:.2f} s"
                )
            out["discovery"] = {
                "dirs": a.discovery_dirs,
                "files": a.discovery_dirs * a.files_per_dir,
                "make_tree_seconds": made["seconds"],
                "discover_seconds": statistics.median(r["inner_seconds"] for r in rows["ckptvault"]),
                "discover_process_seconds": statistics.median(r["seconds"] for r in rows["ckptvault"]),
                "discover_max_rss_mib": max(r["max_rss_mib"] for r in rows["ckptvault"]),
                "find_seconds": statistics.median(r["seconds"] for r in rows["find"]),
                "find_stat_seconds": statistics.median(r["seconds"] for r in rows["find_stat"]),
                "runs": rows,
            }
            subprocess.run(["rm", "-rf", str(root)], check=False)
        if a.plan_checkpoints > 0:
            log(f"planning over {a.plan_checkpoints} checkpoints")
            out["planning"] = json.loads(
                run_quiet(
                    [py, str(BENCH / "micro.py"), "plan", str(a.plan_checkpoints), str(a.reps)], env=env
                ).splitlines()[-1]
            )
            log(f"  plan(): {out['planning']['seconds']:.2f} s for {out['planning']['checkpoints']} checkpoints")
        if not a.skip_validation:
            log("validation (Great Expectations), cold then warm")
            out["validation"] = json.loads(
                run_quiet([py, str(BENCH / "micro.py"), "validate", "20"], env=env).splitlines()[-1]
            )
            v = out["validation"]
            log(
                f"  validate_candidate: in-process cold {v['cold_seconds']:.1f} s (import + context), "
                f"warm {v['seconds'] * 1000:.0f} ms; isolated (the default) {v['isolated_seconds']:.1f} s"
            )
        # The scenarios tests used to bound by the clock (bench/micro.py says which): measured here instead.
        micro: list[tuple[str, list[str]]] = []
        if a.plan_checkpoints > 0:
            micro.append(("plan_mixed", ["plan-mixed", str(a.reps)]))
        if not a.skip_validation:
            micro.append(("validate_wide", ["validate-wide", str(max(a.reps, 3))]))
        micro += [("header_read", ["header-read", "20"]), ("endpoint_down", ["endpoint-down", "5"])]
        for key, args in micro:
            log(f"micro: {args[0]}")
            out[key] = json.loads(run_quiet([py, str(BENCH / "micro.py"), *args], env=env).splitlines()[-1])
            log(f"  {args[0]}: {out[key]['seconds']:.4f} s (median)")
        self.results.update(out)

    def main(self) -> int:
        a = self.args
        self.t_start = time.monotonic()
        started = dt.datetime.now(dt.UTC)
        name = started.strftime("%Y%m%dT%H%M%SZ") + ("-quick" if a.quick else "")
        self.out = BENCH / "results" / f"{name}.json"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        for f in ("aws-config", "aws-credentials"):
            (self.scratch / f).write_text("")
        size = int(a.size_gib * GiB)
        servers = [Server(k, self.scratch, max(32 * GiB, int(8 * a.size_gib * GiB))) for k in a.servers.split(",") if k]
        self.servers = servers
        prefect = PrefectServer(self.scratch / "prefect")
        self.prefect = prefect
        self.results["meta"] = machine_info()
        self.results["meta"].update(started=started.isoformat(), args={k: str(v) for k, v in vars(a).items()})
        self.restore_cfg: dict[str, Path] = {}
        self.restore_tuned_cfg: dict[str, Path] = {}

        log(f"scratch {self.scratch}; writing a {a.size_gib:g} GiB HF checkpoint (8 shards + optimizer)")
        t0 = time.perf_counter()
        src_root = self.scratch / "src"
        ck = write_source(src_root, size, STEP)
        self.src_names = {p.name for p in ck.iterdir()}
        self.src_bytes = dir_bytes(ck)
        self.results["checkpoint"] = {
            "bytes": self.src_bytes,
            "files": len(self.src_names),
            "sizes": {p.name: p.stat().st_size for p in sorted(ck.iterdir())},
        }
        log(f"  {self.src_bytes / GiB:.2f} GiB in {len(self.src_names)} files, {time.perf_counter() - t0:.0f} s")

        log("starting the Prefect server" + "".join(f", {s.kind}" for s in servers))
        prefect.up(self.child_env(None, ""))
        self.prefect_url = prefect.url
        for s in servers:
            t0 = time.perf_counter()
            s.up()
            log(f"  {s.kind} at {s.url} in {time.perf_counter() - t0:.0f} s")
        self.env_for = {s.kind: self.child_env(s, prefect.url) for s in servers}

        for s in servers:
            self.transfers(s, src_root, ck)
            self.save()
            if s.kind == "ceph":  # its block file is the biggest thing on disk: free it before the big run
                s.down()
        if a.big_gib > 0:
            sw = next((s for s in servers if s.kind == "seaweedfs"), None)
            if sw is None:
                self.results["notes"].append("big ingest skipped: needs seaweedfs in --servers")
            else:
                shutil.rmtree(self.scratch / "src", ignore_errors=True)  # make room
                self.big(sw)
                self.save()
        self.local()
        self.results["meta"]["complete"] = True
        text = self.save()
        print("\n" + text)
        log(f"results: {self.out.relative_to(REPO)} (elapsed {self.results['meta']['elapsed_seconds'] / 60:.1f} min)")
        return 0

    def save(self) -> str:
        """Write the results so far (after every phase: an interrupted run still leaves its numbers)."""
        self.results["meta"]["elapsed_seconds"] = time.monotonic() - self.t_start
        self.results["summary"] = summarize(self.results)
        text = render(self.results)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.rename(self.out)
        (BENCH / "results" / "latest.txt").write_text(text + "\n")
        return text

    def cleanup(self) -> None:
        from bench.lifecycle import stop_all

        stop_all([self.prefect, *getattr(self, "servers", [])], self.scratch, self.args.keep_scratch)


def _aws_cp(server: Server, src: str, dst: str) -> list[str]:
    """awscli's recursive copy, quiet, against `server`: the peer command of both directions."""
    return [
        str(VENV_BIN / "aws"),
        "--endpoint-url",
        server.url,
        "--region",
        server.region,
        "s3",
        "cp",
        "--recursive",
        "--only-show-errors",
        "--no-progress",
        src,
        dst,
    ]
