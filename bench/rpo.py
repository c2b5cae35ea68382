"""`make bench-rpo` (issue [T]): the RPO of real training runs on SeaweedFS, archived by the hook, by
`ckptvault follow` and by the scheduled ingest alone; and the training step time with the hook against
without it.

Per framework (Hugging Face Trainer, Lightning, torch DCP; bench/rpo_train.py trains a small model in a
child process, a save every `--every` steps, `--saves` saves), in one run, interleaved:

- `baseline`: the training run alone, no hook, nothing ingesting: the step time without the hook;
- `hook`: the framework's hook (CKPTVAULT_HOOK_SIGNAL=ingest: each save starts a detached
  `ckptvault ingest --run R --step S`, no Prefect anywhere), then nothing else;
- `hook-prefect`: [T]'s Done-when path. A real Prefect server (bench-only state under the scratch dir,
  bench/servers.py) and `ckptvault serve` (the seven deployments of prefect.yaml, the ingest one with its
  trigger on `ckptvault.checkpoint.saved`), every deployment's schedule set inactive once registered (its
  scheduled runs deleted: no scheduled ingest runs; any ingest flow run without a `run` parameter is
  counted and printed); the framework's hook with PREFECT_API_URL set (CKPTVAULT_HOOK_SIGNAL=event):
  each save's event starts a flow run of the served ingest deployment for that run and step, one at a
  time (the deployment's concurrency limit of 1);
- `hook-event`: the hook's cost alone on the Prefect path: the same hook, the same events to the same
  Prefect server, with the ingest deployment's trigger (its automation) disabled for the run, so nothing
  is archived and nothing runs beside the training but the servers idling; its saves are not archived
  (0/N is expected, not a failure);
- `follow`: no hook; `ckptvault follow --run R --poll-seconds 1` beside the training run;
- `scheduled`: no hook; `ckptvault ingest` every `--interval` seconds (the deployment's 10-minute
  schedule, scaled down; a pass that overruns delays the next, as the deployment's concurrency limit
  of 1 does), with `settle_seconds = --settle` (default 60, scaled down the same).

Every mode's config is the same (defaults, validation on), only `settle_seconds` set. After the training
run ends, the bench waits until every save is verified in the catalog (or the mode's bound passes: a
save the mode does not archive is counted, not waited for forever), then reads each save's `verified`
event: `rpo_seconds` (the commit marker's mtime to the manifest's commit, recorded by the ingest) and
`upload_seconds` (the ingest's first file sent to that commit: the save's upload time). Reported per
framework and mode: the saves archived, median and max RPO, and the Done-when's bound: the saves verified
within their upload time + 10 s of their save (`rpo_seconds <= upload_seconds + 10`) over all saves, and
the worst margin (`upload_seconds + 10 - rpo_seconds`, the smallest; negative: over the bound).

The save interval. By default a save every `EVERY` steps, every ~5-8 s of training at load 15-30: far
more often than a real job saves (every few minutes), and shorter than one ingest (process start,
imports, the gate child, the upload: ~20 s at that load), so a run's saves QUEUE behind its earlier
ingests and their RPO is the queue's, not one save's path. `--every-seconds S` spaces the saves by wall
time instead (the first step end S seconds after the last save), in every mode alike: with S longer than
one ingest, each save's RPO is its own signal, ingest and upload, which is what the bound is about.

Step time: each run's median (and mean: the save steps are in it) step time; the hook's cost is the ratio
of each `hook` run to the `baseline` run next to it (the pairs alternate their order). Load on a shared
machine moves both: read the ratios, with the load printed beside them.

    .venv/bin/python bench/rpo.py [--frameworks hf,lightning,dcp]
        [--modes hook,scheduled[,follow][,hook-prefect]] [--saves 20] [--pairs 2] [--every-seconds S]
        [--interval 30] [--settle 3] [--servers-nice 19] [--json PATH]

`--servers-nice N` (default 19): SeaweedFS, the Prefect server and `ckptvault serve` with its flow runs
(the ingests of `hook-prefect`) run at niceness N, every thread. In production they are other machines;
here they share the 2 cores with the training run, so at niceness 0 the step-time pairs measure the
shared box, not the hook (HF `hook-prefect` at 0: step 31.0 ms against 16.7 ms without, CPU a step 1.07).
It also puts those ingests behind anything else running on the box: their RPO is a ceiling. Renicing
up needs no privilege; a bench itself started at a niceness above N cannot go back down (the error is
ignored, the servers keep the bench's). The `hook` mode's ingests are the training node's own (its
niceness +10), as in production.

The step-time pairs: each repetition runs `baseline` and every hook mode of --modes (`hook`,
`hook-event`, `hook-prefect`), the order rotated each repetition; the other modes run once, after the
first. Each hook run's ratio is to the baseline of its repetition.

`--pin` (default on with two or more CPUs): the training run on the first CPU of the bench's affinity,
everything a real deployment runs on other machines (SeaweedFS, the Prefect server, `serve` and its flow
runs, `follow`, the scheduled ingests) on the others, every thread. Niceness alone (`--servers-nice`)
keeps them from taking the training's core for long but not from running on it: each slice they get
there is the training's L1/L2 caches refilled afterwards, which the training's own CPU time per step
shows. `hook` mode's ingests are the training node's own: started by the hook, they inherit the training
run's CPU, as they share a real training node. `--no-pin` runs everything where the kernel puts it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bucket import BUCKET, s3_client
from bench.lifecycle import run_bench
from bench.machine import machine_info
from bench.measure import log
from bench.paths import BENCH, REPO, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, PrefectServer, Server
from bench.units import GiB

FRAMEWORKS = ("hf", "lightning", "dcp")
MODES = ("hook", "hook-event", "hook-prefect", "follow", "scheduled")
HOOKS = ("hook", "hook-event", "hook-prefect")
PREFECT_MODES = ("hook-event", "hook-prefect")
BOUND_EXTRA = 10.0  # the Done-when: verified within (its upload time + 10 s) of its save
# Steps between saves: about 5 s of training each at one torch thread here (at load 13-18). A save every
# few seconds is far more often than a real job saves: long enough that one save's archiving is not
# queued behind the last one's, short enough that 20 saves train in minutes.
EVERY = {"hf": 25, "lightning": 60, "dcp": 50}
FORMAT = {"hf": "hf", "lightning": "lightning", "dcp": "dcp"}
PREFIX = "rpo"
SERVE_TIMEOUT = 300.0  # `ckptvault serve` registering its deployments on a loaded machine
# How long after the training run a mode gets to archive the rest: the hook's and follow's ingests are
# already running or due within a poll; the scheduled one needs its next passes
AFTER = {"hook": 900.0, "hook-prefect": 900.0, "follow": 900.0, "hook-event": 0.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--modes", default="hook,scheduled", help=f"of {', '.join(MODES)} (default hook,scheduled)")
    p.add_argument("--saves", type=int, default=20, help="checkpoints per training run (default 20)")
    p.add_argument("--pairs", type=int, default=2, help="baseline/hook pairs per framework, order alternating")
    p.add_argument(
        "--every-seconds", type=float, default=None,
        help="a save every S seconds of wall time instead of every EVERY steps (~5-8 s at load, which queues: "
        "a real job saves every few minutes); longer than one ingest, each save's RPO is its own path",
    )  # fmt: skip
    p.add_argument(
        "--prefect-env", action="append", default=[], metavar="KEY=VALUE",
        help="hook-prefect: a setting in the Prefect server's and serve's environment (repeatable), e.g. "
        "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS=2, or PREFECT_RUNNER_POLL_FREQUENCY=10 for Prefect's "
        "own poll (ckptvault serve's is 1 s); "
        "default: none, Prefect's defaults as shipped",
    )  # fmt: skip
    p.add_argument(
        "--servers-nice", type=int, default=19, metavar="N",
        help="niceness of SeaweedFS, the Prefect server and `ckptvault serve` (with its flow runs) (default 19): "
        "in production they are other machines, here they share the training's 2 cores; 0 shares them equally",
    )  # fmt: skip
    p.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=None,
        help="the training run on one CPU, the servers and the archive's processes on the others (default: on "
        "with 2+ CPUs)",
    )  # fmt: skip
    p.add_argument("--interval", type=float, default=30, help="the scheduled ingest's period, s (default 30)")
    p.add_argument("--settle", type=float, default=3, help="settle_seconds of every mode's source (default 3)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--scratch", type=Path, default=BENCH / ".scratch-rpo")
    p.add_argument("--keep-scratch", action="store_true")
    a = p.parse_args(argv)
    a.frameworks = [f for f in a.frameworks.split(",") if f]
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [f for f in a.frameworks if f not in FRAMEWORKS] + [m for m in a.modes if m not in MODES]
    if bad:
        p.error(f"unknown {', '.join(bad)}: frameworks are {', '.join(FRAMEWORKS)}, modes {', '.join(MODES)}")
    a.scratch = a.scratch.resolve()
    a.paired = [m for m in a.modes if m in HOOKS] or ["hook"]
    cpus = sorted(os.sched_getaffinity(0))
    if a.pin is None:
        a.pin = len(cpus) >= 2
    if a.pin and len(cpus) < 2:
        p.error(f"--pin needs two CPUs; this process may run on {len(cpus)}")
    a.train_cpus, a.server_cpus = (set(cpus[:1]), set(cpus[1:])) if a.pin else (set(cpus), set(cpus))
    bad_env = [kv for kv in a.prefect_env if "=" not in kv or not kv.startswith("PREFECT_")]
    if bad_env:
        p.error(f"--prefect-env takes PREFECT_NAME=VALUE, not {', '.join(bad_env)}")
    a.prefect_env = dict(kv.split("=", 1) for kv in a.prefect_env)
    return a


def handoff_us(calls: int = 20_000) -> dict[str, float]:
    """What `notify_saved` costs the training thread, in microseconds a call: the rank check, the queue
    put and the thread start (the first call); the channel is `off`, so the hook's thread does nothing
    with it and the machine's load is all that moves the number."""
    from ckptvault.hooks.signal import DISPATCHER, notify_saved

    times = []
    for step in range(calls):
        t0 = time.perf_counter()
        notify_saved("bench-handoff", step, "/nowhere", signal="off")
        times.append(time.perf_counter() - t0)
    DISPATCHER.drain(30)
    return {"median_us": statistics.median(times) * 1e6, "max_us": max(times) * 1e6, "first_us": times[0] * 1e6}


def pids_where(match: Callable[[int, str], bool]) -> list[int]:
    """The processes for which match(process group, command line) holds."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            pgid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[2])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if match(pgid, cmd):
            out.append(int(d.name))
    return out


def renice(pids: list[int], n: int) -> None:
    """Every thread of `pids` at niceness `n` (Linux's niceness is per thread; the threads and processes
    they start later inherit it). `--servers-nice`: the servers a real deployment runs on other machines
    must not take the training's core here, or the step time measures the shared box, not the hook."""
    for pid in pids:
        for t in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                os.setpriority(os.PRIO_PROCESS, int(t.name), n)


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of `pids` on `cpus` (affinity is per thread; threads and processes started later
    inherit their starter's). `--pin`: the servers a real deployment runs on other machines kept off the
    training's CPU."""
    for pid in pids:
        for t in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                os.sched_setaffinity(int(t.name), cpus)


def on_cpus(cpus: set[int]) -> Callable[[], None]:
    """A preexec_fn: the child starts on `cpus` (so does everything it starts)."""
    return lambda: os.sched_setaffinity(0, cpus)


def busy_idle(t: dict[str, Any], windows: list[tuple[float, float]]) -> dict[str, Any]:
    """The run's steps split by whether an ingest of its saves was running when the step ended (a window
    per save: the save's return to its ingest's end), the steps that saved left out of both: the
    archive's effect on the step inside one run, free of what moves between runs on a shared box."""
    ends, steps = t.get("step_end_unix") or [], t["step_seconds"]
    if not ends or not windows:
        return {}
    saves = sorted(float(v) for v in t["saved_at"].values())
    busy: list[float] = []
    idle: list[float] = []
    for end, d in zip(ends, steps, strict=False):
        if any(end - d - 0.05 <= s <= end for s in saves):  # the step that saved (and its hand-off)
            continue
        (busy if any(a <= end <= b for a, b in windows) else idle).append(d)
    if len(busy) < 5 or len(idle) < 5:
        return {}
    idle_mean = statistics.fmean(idle)
    return {
        "busy_steps": len(busy), "idle_steps": len(idle),
        "busy_median_ms": statistics.median(busy) * 1000, "idle_median_ms": statistics.median(idle) * 1000,
        "busy_over_idle": statistics.median(busy) / statistics.median(idle),
        # the whole run's mean step (the saving steps left out) against its steps with no ingest running:
        # what the archive's work cost the run's steps on average, at this save interval
        "run_over_idle_mean": statistics.fmean(busy + idle) / idle_mean,
    }  # fmt: skip


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class RpoBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.scratch: Path = args.scratch
        self.logs = self.scratch / "logs"
        self.server = Server("seaweedfs", self.scratch, 8 * GiB)
        self.rows: list[dict[str, Any]] = []
        self.handoff: dict[str, float] = {}
        self.children: list[subprocess.Popen[bytes]] = []  # follow and the scheduled ingests: stopped at the end
        # hook-prefect: the Prefect server, `ckptvault serve` and the served ingest deployment's id
        self.prefect: PrefectServer | None = None
        self.serve: subprocess.Popen[bytes] | None = None
        self.ingest_deployment = ""
        self.automations: list[str] = []
        self.prefect_notes: dict[str, Any] = {}

    def env(self) -> dict[str, str]:
        drop = ("AWS_", "CKPTVAULT_", "PREFECT_")  # no Prefect API: the hook's signal is the subprocess ingest
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env.update(
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}", PYTHONPATH=str(REPO),
            AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION=self.server.region,
            AWS_DEFAULT_REGION=self.server.region, AWS_EC2_METADATA_DISABLED="true",
            AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            CKPTVAULT_HOOK_SIGNAL="ingest", CKPTVAULT_HOOK_LOG_DIR=str(self.logs / "hooks"),
        )  # fmt: skip
        return env

    def config(self, name: str, sources: list[tuple[str, Path, str]]) -> Path:
        """A config of the bench's store with these (run, root, framework) sources."""
        path = self.scratch / "cfg" / f"{name}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = (
            f'[store]\nbucket = "{BUCKET}"\nprefix = "{PREFIX}"\nendpoint_url = "{self.server.url}"\n'
            f'region = "{self.server.region}"\n'
        )
        for run, root, fw in sources:
            text += (
                f'\n[[sources]]\nrun = "{run}"\npath = "{root}"\nformat = "{FORMAT[fw]}"\n'
                f"settle_seconds = {self.args.settle:g}\n"
            )
        path.write_text(text)
        return path

    def root(self, run: str) -> Path:
        return self.scratch / "hot" / run

    def saves(self, run: str) -> dict[int, dict[str, float | None]]:
        """step -> the `rpo_seconds` and `upload_seconds` of the run's last `verified` event of that step."""
        from ckptvault.catalog import Catalog
        from ckptvault.config import StoreConfig
        from ckptvault.store import open_store

        store = open_store(StoreConfig(bucket=BUCKET, endpoint_url=self.server.url, region=self.server.region))
        out: dict[int, dict[str, float | None]] = {}
        for e in Catalog(store, PREFIX).events(run):
            if e.event == "verified":
                d = json.loads(e.detail or "{}")
                out[e.step] = {"rpo": d.get("rpo_seconds"), "upload": d.get("upload_seconds")}
        return out

    def ckptvault(self, cfg: Path, *args: str) -> list[str]:
        return [str(VENV_BIN / "ckptvault"), "--config", str(cfg), *args]

    def verified(self, cfg: Path, run: str, env: dict[str, str]) -> dict[int, int | None]:
        """step -> rpo_ms of the run's verified saves, as `ls --run R --json` lists them."""
        p = subprocess.run(self.ckptvault(cfg, "ls", "--run", run, "--json"), env=env, capture_output=True, text=True)
        if p.returncode != 0:
            return {}
        return {r["step"]: r["rpo_ms"] for r in json.loads(p.stdout) if r["state"] == "verified"}

    def one(self, fw: str, mode: str, rep: int, env: dict[str, str]) -> dict[str, Any]:
        a = self.args
        run = f"{fw}-{mode}-{rep}"
        root, times = self.root(run), self.scratch / "times" / f"{run}.json"
        times.parent.mkdir(parents=True, exist_ok=True)
        # the config names it: it must exist before follow or ingest reads the config (hook-prefect's: made
        # before `serve` read its config)
        root.mkdir(parents=True, exist_ok=True)
        cfg = self.config(run, [(run, root, fw)])
        env = {**env, "CKPTVAULT_CONFIG": str(cfg)}
        every = ["--every", str(EVERY[fw])] if a.every_seconds is None else ["--every-seconds", f"{a.every_seconds:g}"]
        child = [sys.executable, str(BENCH / "rpo_train.py"), fw, str(root), "--saves", str(a.saves), *every,
                 "--out", str(times)]  # fmt: skip
        train_env = env
        if mode in HOOKS:
            child += ["--hook", run]
        if mode in PREFECT_MODES:
            assert self.prefect is not None
            # the hook's event to the served ingest deployment's trigger (hook-event: disabled for this run)
            train_env = {**env, "PREFECT_API_URL": self.prefect.url, "CKPTVAULT_HOOK_SIGNAL": "event"}
            self.trigger(enabled=mode == "hook-prefect")
        side: subprocess.Popen[bytes] | None = None
        stop = threading.Event()
        ticker: threading.Thread | None = None
        logf = open(self.logs / f"{run}.log", "ab")  # noqa: SIM115 (closed below, after the side process)
        if mode == "follow":
            side = subprocess.Popen(
                self.ckptvault(cfg, "follow", "--run", run, "--poll-seconds", "1"), env=env, stdout=logf,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=on_cpus(a.server_cpus),
            )  # fmt: skip
            self.children.append(side)
        elif mode == "scheduled":
            ticker = threading.Thread(target=self.schedule, args=(cfg, env, logf, stop), daemon=True)
            ticker.start()
        load0 = load()
        t0 = time.perf_counter()
        subprocess.run(
            child, env=train_env, stdout=logf, stderr=subprocess.STDOUT, check=True, timeout=7200,
            preexec_fn=on_cpus(a.train_cpus),
        )  # fmt: skip
        train_s = time.perf_counter() - t0
        got: dict[int, int | None] = {}
        if mode != "baseline":
            bound = AFTER.get(mode, 3 * a.interval + a.settle + 500)
            deadline = time.monotonic() + bound
            while time.monotonic() < deadline:
                got = self.verified(cfg, run, env)
                if len(got) >= a.saves:
                    break
                time.sleep(2)
        stop.set()
        if side is not None:
            side.send_signal(signal.SIGINT)
            try:
                side.wait(60)
            except subprocess.TimeoutExpired:
                side.kill()
                side.wait()
        if ticker is not None:
            ticker.join(600)
        logf.close()
        t = json.loads(times.read_text())
        steps = t["step_seconds"]
        rpo = [v / 1000 for v in got.values() if v is not None]
        per_save = self.saves(run) if mode != "baseline" else {}
        margins = {
            step: v["upload"] + BOUND_EXTRA - v["rpo"]
            for step, v in per_save.items()
            if step in got and v["rpo"] is not None and v["upload"] is not None
        }
        row = {
            "fw": fw, "mode": mode, "rep": rep, "run": run, "load_before": load0, "load_after": load(),
            "train_seconds": train_s, "steps": len(steps) + 1, "every": t["every"],
            "step_median_ms": statistics.median(steps) * 1000, "step_mean_ms": statistics.fmean(steps) * 1000,
            "cpu_median_ms": statistics.median(t["step_cpu_seconds"]) * 1000,
            "cpu_mean_ms": statistics.fmean(t["step_cpu_seconds"]) * 1000,
            "saves": a.saves, "archived": len(got), "rpo_seconds": sorted(rpo), "saved_at": t["saved_at"],
            "rpo_by_step": {s: v / 1000 for s, v in sorted(got.items()) if v is not None},
            "rpo_median": statistics.median(rpo) if rpo else None, "rpo_max": max(rpo) if rpo else None,
            "upload_by_step": {s: v["upload"] for s, v in sorted(per_save.items())},
            "margin_by_step": dict(sorted(margins.items())),
            "within_bound": sum(1 for m in margins.values() if m >= 0),
            "worst_margin": min(margins.values()) if margins else None,
        }  # fmt: skip
        if mode == "hook-prefect":
            row["flow_runs"] = self.flow_runs(run)
            row["prefect_timeline"] = self.timeline(run, {int(k): v for k, v in t["saved_at"].items()})
        # each save's ingest window: its return to the flow run's end (hook-prefect), else to its commit
        # (its RPO after the marker) + 1 s of the ingest's after-work
        windows = []
        for k, at in t["saved_at"].items():
            step = int(k)
            end = row.get("prefect_timeline", {}).get(step, {}).get("end_unix")
            if end is None and step in got and got[step] is not None:
                end = float(at) + got[step] / 1000 + 1.0  # type: ignore[operator]
            if end is not None:
                windows.append((float(at), end))
        row["busy_idle"] = busy_idle(t, windows)
        shown = (
            f"  RPO median {row['rpo_median']:.1f} s, max {row['rpo_max']:.1f} s" if rpo
            else ("" if mode == "baseline" else "  RPO: none recorded")
        )  # fmt: skip
        log(f"  {run:22} step {row['step_median_ms']:6.1f} ms median, {row['step_mean_ms']:6.1f} mean, "
            f"CPU {row['cpu_median_ms']:5.1f} median; "
            f"{len(got)}/{a.saves} archived{shown}{bound_text(row, mode)}{timeline_text(row)}{busy_text(row)}  "
            f"(load {load0} -> {row['load_after']})")  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
        return row

    def schedule(self, cfg: Path, env: dict[str, str], logf: Any, stop: threading.Event) -> None:
        """`ckptvault ingest` every --interval s from the training run's start, one at a time."""
        while not stop.is_set():
            start = time.monotonic()
            p = subprocess.Popen(
                self.ckptvault(cfg, "ingest"), env=env, stdout=logf, stderr=subprocess.STDOUT,
                preexec_fn=on_cpus(self.args.server_cpus),
            )  # fmt: skip
            self.children.append(p)
            p.wait()
            stop.wait(max(0.0, start + self.args.interval - time.monotonic()))

    def order(self) -> list[tuple[str, int]]:
        """Per framework, each repetition: `baseline` and every hook mode of --modes, the order rotated
        each repetition; the other modes after the first."""
        paired = [m for m in self.args.paired if m in self.args.modes]
        out: list[tuple[str, int]] = []
        for rep in range(self.args.pairs):
            group = ["baseline", *paired]
            k = rep % len(group)
            out += [(m, rep) for m in group[k:] + group[:k]]
            if rep == 0:
                out += [(m, 0) for m in self.args.modes if m not in paired]
        return out

    # hook-prefect: a Prefect server and `ckptvault serve`, for the whole bench

    def api(self, method: str, path: str, body: Any = None) -> Any:
        assert self.prefect is not None
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.prefect.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        for attempt in range(10):
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    text = r.read()
                break
            except urllib.error.HTTPError as e:
                # the server's SQLite busy beside serve's own registrations answers 503: again, as a client would
                if e.code not in (429, 503) or attempt == 9:
                    raise
                time.sleep(0.5 * (attempt + 1))
        return json.loads(text) if text else None

    def start_serve(self, env: dict[str, str]) -> None:
        """The Prefect server and `ckptvault serve` over one config naming every hook-prefect run's source
        (made now: the served deployments read it when a flow run starts); every schedule set inactive
        once registered, so only the trigger starts ingests."""
        runs = [
            (f"{fw}-{m}-{rep}", fw) for fw in self.args.frameworks for m, rep in self.order()
            if m in PREFECT_MODES
        ]  # fmt: skip
        for run, _ in runs:
            self.root(run).mkdir(parents=True)
        a = self.args
        cfg = self.config("serve", [(run, self.root(run), fw) for run, fw in runs])
        home = self.scratch / "prefect"
        self.prefect = PrefectServer(home)
        penv = {k: v for k, v in env.items() if not k.startswith("CKPTVAULT_HOOK")}
        penv.update(
            PREFECT_HOME=str(home / "home"), DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false",
            **self.args.prefect_env,
        )  # fmt: skip
        t0 = time.perf_counter()
        self.prefect.up(penv)
        prefect_pids = pids_where(lambda pgid, _: pgid == self.prefect.proc.pid)  # type: ignore[union-attr]
        renice(prefect_pids, a.servers_nice)
        pin(prefect_pids, a.server_cpus)
        penv["PREFECT_API_URL"] = self.prefect.url
        logf = open(self.logs / "serve.log", "ab")  # noqa: SIM115 (lives as long as serve)
        self.serve = subprocess.Popen(
            self.ckptvault(cfg, "serve"), env=penv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: its flow runs' subprocesses are stopped with it
            preexec_fn=on_cpus(a.server_cpus),  # its flow runs, started later, inherit it
        )  # fmt: skip
        # its flow runs, started later, inherit it
        renice(pids_where(lambda pgid, _: pgid == self.serve.pid), self.args.servers_nice)  # type: ignore[union-attr]
        deadline = time.monotonic() + SERVE_TIMEOUT
        while True:
            if self.serve.poll() is not None:
                raise RuntimeError(f"ckptvault serve exited {self.serve.returncode}; see {self.logs / 'serve.log'}")
            ds = self.api("POST", "/deployments/filter", {})
            if len(ds) == 7 and all(d["parameters"].get("config_path") == str(cfg) for d in ds):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ckptvault serve registered {len(ds)} of 7 deployments in {SERVE_TIMEOUT:g} s")
            time.sleep(1)
        for d in ds:  # inactive: no scheduled run of anything (the server deletes those already scheduled)
            for sch in d["schedules"]:
                self.api("PATCH", f"/deployments/{d['id']}/schedules/{sch['id']}", {"active": False})
        self.ingest_deployment = next(d["id"] for d in ds if d["name"] == "ingest")
        # the trigger's automation: its run-deployment action names the deployment
        self.automations = [
            x["id"] for x in self.api("POST", "/automations/filter", {})
            if self.ingest_deployment in json.dumps(x.get("actions", []))
        ]  # fmt: skip
        if not self.automations:
            raise RuntimeError("no automation runs the served ingest deployment: is its trigger in prefect.yaml?")
        # a scheduled run that started before its schedule was set inactive: let it finish, and say so
        early = self.api("POST", "/flow_runs/filter", {"limit": 200})
        self.prefect_notes["runs_before_training"] = len(early)
        while any(r["state"]["type"] in ("RUNNING", "PENDING") for r in early):
            time.sleep(2)
            early = self.api("POST", "/flow_runs/filter", {"limit": 200})
        log(
            f"Prefect server at {self.prefect.url} and `ckptvault serve` (7 deployments, schedules inactive, the "
            f"ingest trigger on) in {time.perf_counter() - t0:.0f} s; {len(early)} flow runs before training; "
            f"load {load()}"
        )

    def trigger(self, enabled: bool) -> None:
        """The served ingest deployment's trigger on or off (hook-event: the events arrive, nothing starts)."""
        for aid in self.automations:
            self.api("PATCH", f"/automations/{aid}", {"enabled": enabled})

    def ingest_runs(self) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = self.api(
            "POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [self.ingest_deployment]}}, "limit": 200}
        )
        return got

    def flow_runs(self, run: str) -> dict[str, int]:
        """The served ingest deployment's flow runs of `run`, by final state (triggered by its saves' events)."""
        out: dict[str, int] = {}
        for r in self.ingest_runs():
            if r["parameters"].get("run") == run:
                out[r["state"]["type"]] = out.get(r["state"]["type"], 0) + 1
        return out

    def timeline(self, run: str, saved_at: dict[int, float]) -> dict[int, dict[str, float | None]]:
        """Where a save's time went on the Prefect path, per step: `trigger` (the save's return, or the
        .ckpt's mtime for Lightning, to its flow run's creation by the automation: the hook's POST and the
        trigger), `pickup` (creation to the run's Running state: `serve`'s poll for work,
        PREFECT_RUNNER_POLL_FREQUENCY, any wait for the deployment's concurrency slot, retried every
        PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS, and the flow run subprocess's start and
        imports), `run` (Running to its end: the ingest and the flow's after-work)."""

        def ts(v: str | None) -> float | None:
            return None if not v else dt.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()

        out: dict[int, dict[str, float | None]] = {}
        for r in self.ingest_runs():
            step = r["parameters"].get("step")
            if r["parameters"].get("run") != run or not isinstance(step, int):
                continue
            created, start, end = ts(r["created"]), ts(r["start_time"]), ts(r["end_time"])
            saved = saved_at.get(step)
            out[step] = {
                "end_unix": end,
                "trigger": None if saved is None or created is None else created - saved,
                "pickup": None if created is None or start is None else start - created,
                "run": None if start is None or end is None else end - start,
            }
        return dict(sorted(out.items()))

    def stop_serve(self) -> None:
        if self.serve is not None and self.serve.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.serve.pid, signal.SIGTERM)
            try:
                self.serve.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.serve.pid, signal.SIGKILL)
                self.serve.wait(10)
        if self.prefect is not None:
            with contextlib.suppress(Exception):
                self.prefect.down()

    def main(self) -> int:
        a = self.args
        started = dt.datetime.now(dt.UTC)
        self.logs.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self.server.up()
        store_pids = pids_where(lambda _, cmd: str(self.server.state) in cmd)
        renice(store_pids, a.servers_nice)
        pin(store_pids, a.server_cpus)
        if a.pin:
            log(f"pinned: training on CPU {sorted(a.train_cpus)}, servers and archive on {sorted(a.server_cpus)}")
        log(f"SeaweedFS at {self.server.url} in {time.perf_counter() - t0:.0f} s; load {load()}")
        s3_client(self.server).create_bucket(Bucket=BUCKET)
        # the bench's own catalog reads (each save's verified event)
        os.environ.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_EC2_METADATA_DISABLED="true",
            AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        )  # fmt: skip
        env = self.env()
        if any(m in PREFECT_MODES for m in a.modes):
            self.start_serve(env)
        self.handoff = handoff_us()
        h = self.handoff
        log(
            f"notify_saved on the caller's thread: {h['median_us']:.1f} us median, {h['max_us']:.0f} us max, "
            f"{h['first_us']:.0f} us the first (the thread's start); load {load()}"
        )
        for fw in a.frameworks:
            spacing = f"{EVERY[fw]} steps" if a.every_seconds is None else f"{a.every_seconds:g} s"
            log(f"{fw}: {a.saves} saves, one every {spacing}")
            for mode, rep in self.order():
                self.rows.append(self.one(fw, mode, rep, env))
                if a.json:  # after every run: an interrupted bench keeps what it measured
                    self.write_json(started)
        if self.serve is not None:
            # the Done-when's "no scheduled ingest running": every ingest flow run was a hook's event's
            untriggered = [r["id"] for r in self.ingest_runs() if "run" not in r["parameters"]]
            self.prefect_notes["untriggered_ingest_runs"] = len(untriggered)
            log(f"ingest flow runs not started by a hook's event: {len(untriggered)}")
        summary = summarize(self.rows)
        text = render(summary, a, self.prefect_notes)
        print("\n" + text)
        if a.json:
            self.write_json(started)
        return 0

    def write_json(self, started: dt.datetime) -> None:
        a = self.args
        meta = machine_info()
        meta.update(started=started.isoformat(), args={k: str(v) for k, v in vars(a).items()})
        a.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"meta": meta, "handoff": self.handoff, "prefect": self.prefect_notes, "summary": summarize(self.rows),
               "runs": self.rows}  # fmt: skip
        a.json.write_text(json.dumps(out, indent=1))

    def cleanup(self) -> None:
        self.stop_serve()
        for p in self.children:  # an interrupted bench: its follow or scheduled ingest still running
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(30)
        with contextlib.suppress(Exception):
            self.server.down()
        if not self.args.keep_scratch:
            if self.logs.exists():
                shutil.copytree(self.logs, BENCH / ".rpo-logs", dirs_exist_ok=True)
            subprocess.run(["rm", "-rf", str(self.scratch)], check=False)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per framework: each mode's RPO over all its runs' saves, and the hook/baseline step-time ratios."""
    out: dict[str, Any] = {}
    for fw in dict.fromkeys(r["fw"] for r in rows):
        mine = [r for r in rows if r["fw"] == fw]
        modes: dict[str, Any] = {}
        for mode in dict.fromkeys(r["mode"] for r in mine):
            rs = [r for r in mine if r["mode"] == mode]
            rpo = sorted(x for r in rs for x in r["rpo_seconds"])
            margins = [r["worst_margin"] for r in rs if r.get("worst_margin") is not None]
            uploads = [u for r in rs for u in r.get("upload_by_step", {}).values() if u is not None]
            modes[mode] = {
                "runs": len(rs), "saves": sum(r["saves"] for r in rs), "archived": sum(r["archived"] for r in rs),
                "rpo_median": statistics.median(rpo) if rpo else None, "rpo_max": max(rpo) if rpo else None,
                "within_bound": sum(r.get("within_bound", 0) for r in rs),
                "worst_margin": min(margins) if margins else None,
                "upload_median": statistics.median(uploads) if uploads else None,
                "timeline_median": {k: _median([v[k] for r in rs for v in r.get("prefect_timeline", {}).values()])
                                    for k in ("trigger", "pickup", "run")},
                "step_median_ms": statistics.median(r["step_median_ms"] for r in rs),
                "busy_idle": [r["busy_idle"] for r in rs if r.get("busy_idle")],
                "load": ", ".join(r["load_before"].split()[0] for r in rs),
            }  # fmt: skip
        base = {r["rep"]: r for r in mine if r["mode"] == "baseline"}
        ratios: dict[str, Any] = {}
        for paired in (m for m in modes if m in HOOKS):
            pairs = [(r, base[r["rep"]]) for r in mine if r["mode"] == paired and r["rep"] in base]
            ratios[paired] = {
                "hook_median_ratio": [h["step_median_ms"] / b["step_median_ms"] for h, b in pairs],
                "hook_mean_ratio": [h["step_mean_ms"] / b["step_mean_ms"] for h, b in pairs],
                "hook_cpu_median_ratio": [h["cpu_median_ms"] / b["cpu_median_ms"] for h, b in pairs],
                "hook_cpu_mean_ratio": [h["cpu_mean_ms"] / b["cpu_mean_ms"] for h, b in pairs],
            }
        out[fw] = {"modes": modes, "ratios": ratios}
    return out


def _median(vs: list[float | None]) -> float | None:
    known = [v for v in vs if v is not None]
    return statistics.median(known) if known else None


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def bound_text(row: dict[str, Any], mode: str) -> str:
    if mode == "baseline":
        return ""
    worst = row["worst_margin"]
    return f"; within upload + {BOUND_EXTRA:g} s: {row['within_bound']}/{row['saves']}, worst margin {_s(worst)} s"


def busy_text(row: dict[str, Any]) -> str:
    b = row.get("busy_idle")
    if not b:
        return ""
    return (
        f"; step while ingesting / not {b['busy_over_idle']:.3f} ({b['busy_steps']}/{b['idle_steps']} steps), "
        f"run mean / idle mean {b['run_over_idle_mean']:.3f}"
    )


def timeline_text(row: dict[str, Any]) -> str:
    """hook-prefect: the medians of the timeline's parts (Prefect's share of the RPO)."""
    parts = row.get("prefect_timeline")
    if not parts:
        return ""

    def med(k: str) -> str:
        return _s(_median([v[k] for v in parts.values()]))

    return f"; median trigger {med('trigger')} s, pickup {med('pickup')} s, flow run {med('run')} s"


def render(summary: dict[str, Any], a: argparse.Namespace, prefect: dict[str, Any] | None = None) -> str:
    spacing = "EVERY steps" if a.every_seconds is None else f"{a.every_seconds:g} s"
    lines = [
        f"RPO (commit marker -> verified manifest, the verified event's rpo_seconds), {a.saves} saves a run, a save "
        f"every {spacing}, SeaweedFS; scheduled: every {a.interval:g} s, settle_seconds {a.settle:g} in every mode. "
        f"Bound: verified within its upload_seconds + {BOUND_EXTRA:g} s of its save; margin = upload + "
        f"{BOUND_EXTRA:g} - RPO (negative: over)"
        + "".join(f"; {k}={v}" for k, v in getattr(a, "prefect_env", {}).items()),
        "",
        "| framework | mode | saves archived | within upload + 10 s | worst margin s | upload median s | RPO median s "
        "| RPO max s | step median ms | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for fw, s in summary.items():
        for mode, m in s["modes"].items():
            if mode == "baseline":
                archived = within = "-"
            else:
                archived, within = f"{m['archived']}/{m['saves']}", f"{m['within_bound']}/{m['saves']}"
            lines.append(
                f"| {fw} | {mode} | {archived} | {within} | {_s(m['worst_margin'])} | {_s(m['upload_median'])} | "
                f"{_s(m['rpo_median'])} | {_s(m['rpo_max'])} | {m['step_median_ms']:.1f} | {m['load']} |"
            )
    if prefect and "untriggered_ingest_runs" in prefect:
        lines += [
            "",
            f"hook-prefect: ingest flow runs not started by a hook's event: {prefect['untriggered_ingest_runs']}",
        ]
        for fw, s in summary.items():
            tl = s["modes"].get("hook-prefect", {}).get("timeline_median")
            if tl:
                lines.append(
                    f"- {fw}, median over saves: save -> flow run created {_s(tl['trigger'])} s, created -> Running "
                    f"{_s(tl['pickup'])} s, flow run {_s(tl['run'])} s"
                )
    lines += ["", "Step time with the hook / without (each interleaved pair):", ""]
    for fw, s in summary.items():
        for paired, r in s["ratios"].items():
            med = ", ".join(f"{x:.3f}" for x in r["hook_median_ratio"])
            mean = ", ".join(f"{x:.3f}" for x in r["hook_mean_ratio"])
            cpu = ", ".join(f"{x:.3f}" for x in r["hook_cpu_median_ratio"])
            cpu_mean = ", ".join(f"{x:.3f}" for x in r["hook_cpu_mean_ratio"])
            lines.append(
                f"- {fw} ({paired}): wall: median step {med}, mean {mean}; "
                f"process CPU: median step {cpu}, mean {cpu_mean}"
            )
    lines += ["", "Within each run: the median step while one of its saves' ingests ran / while none ran (the "
              "steps that saved left out; busy/idle steps; the run's mean step / its idle steps' mean):", ""]
    for fw, s in summary.items():
        for mode, m in s["modes"].items():
            if m.get("busy_idle"):
                each = ", ".join(
                    f"{b['busy_over_idle']:.3f} ({b['busy_steps']}/{b['idle_steps']}; the run's mean "
                    f"{b['run_over_idle_mean']:.3f})"
                    for b in m["busy_idle"]
                )
                lines.append(f"- {fw} {mode}: {each}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(args.scratch, lambda: RpoBench(args))


if __name__ == "__main__":
    sys.exit(main())
