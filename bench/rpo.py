"""`make bench-rpo` (issue [T]): the RPO of real training runs on SeaweedFS, archived by the hook, by
`ckptvault follow` and by the scheduled ingest alone; and the training step time with the hook against
without it.

Per framework (Hugging Face Trainer, Lightning, torch DCP; bench/rpo_train.py trains a small model in a
child process, a save every `--every` steps, `--saves` saves), in one run, interleaved:

- `baseline`: the training run alone, no hook, nothing ingesting: the step time without the hook;
- `hook`: the framework's hook (CKPTVAULT_HOOK_SIGNAL=ingest: each save starts a detached
  `ckptvault ingest --run R --step S`, no Prefect anywhere), then nothing else;
- `follow`: no hook; `ckptvault follow --run R --poll-seconds 1` beside the training run;
- `scheduled`: no hook; `ckptvault ingest` every `--interval` seconds (the deployment's 10-minute
  schedule, scaled down; a pass that overruns delays the next, as the deployment's concurrency limit
  of 1 does), with `settle_seconds = --settle` (default 60, scaled down the same).

Every mode's config is the same (defaults, validation on), only `settle_seconds` set. After the training
run ends, the bench waits until every save is verified in the catalog (or the mode's bound passes: a
save the mode does not archive is counted, not waited for forever), then reads `ls --run R --json`'s
`rpo_ms` (the commit marker's mtime to the manifest's commit, recorded by the ingest). Reported per
framework and mode: the saves archived, median and max RPO.

Step time: each run's median (and mean: the save steps are in it) step time; the hook's cost is the ratio
of each `hook` run to the `baseline` run next to it (the pairs alternate their order). Load on a shared
machine moves both: read the ratios, with the load printed beside them.

    .venv/bin/python bench/rpo.py [--frameworks hf,lightning,dcp] [--modes hook,scheduled[,follow]]
        [--saves 20] [--pairs 2] [--interval 30] [--settle 3] [--json PATH]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bucket import BUCKET, s3_client
from bench.lifecycle import run_bench
from bench.machine import machine_info
from bench.measure import log
from bench.paths import BENCH, REPO, VENV_BIN
from bench.servers import ACCESS_KEY, SECRET_KEY, Server
from bench.units import GiB

FRAMEWORKS = ("hf", "lightning", "dcp")
MODES = ("hook", "follow", "scheduled")
# Steps between saves: about 5 s of training each at one torch thread here (at load 13-18). A save every
# few seconds is far more often than a real job saves: long enough that one save's archiving is not
# queued behind the last one's, short enough that 20 saves train in minutes.
EVERY = {"hf": 25, "lightning": 60, "dcp": 50}
FORMAT = {"hf": "hf", "lightning": "lightning", "dcp": "dcp"}
# How long after the training run a mode gets to archive the rest: the hook's and follow's ingests are
# already running or due within a poll; the scheduled one needs its next passes
AFTER = {"hook": 900.0, "follow": 900.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--modes", default="hook,scheduled", help=f"of {', '.join(MODES)} (default hook,scheduled)")
    p.add_argument("--saves", type=int, default=20, help="checkpoints per training run (default 20)")
    p.add_argument("--pairs", type=int, default=2, help="baseline/hook pairs per framework, order alternating")
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

    def config(self, run: str, root: Path, fw: str) -> Path:
        path = self.scratch / "cfg" / f"{run}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f'[store]\nbucket = "{BUCKET}"\nprefix = "rpo"\nendpoint_url = "{self.server.url}"\n'
            f'region = "{self.server.region}"\n\n[[sources]]\nrun = "{run}"\npath = "{root}"\n'
            f'format = "{FORMAT[fw]}"\nsettle_seconds = {self.args.settle:g}\n'
        )
        return path

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
        root, times = self.scratch / "hot" / run, self.scratch / "times" / f"{run}.json"
        times.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(parents=True)  # the config names it: it must exist before follow or ingest reads the config
        cfg = self.config(run, root, fw)
        env = {**env, "CKPTVAULT_CONFIG": str(cfg)}
        child = [sys.executable, str(BENCH / "rpo_train.py"), fw, str(root), "--saves", str(a.saves),
                 "--every", str(EVERY[fw]), "--out", str(times)]  # fmt: skip
        if mode == "hook":
            child += ["--hook", run]
        side: subprocess.Popen[bytes] | None = None
        stop = threading.Event()
        ticker: threading.Thread | None = None
        logf = open(self.logs / f"{run}.log", "ab")  # noqa: SIM115 (closed below, after the side process)
        if mode == "follow":
            side = subprocess.Popen(
                self.ckptvault(cfg, "follow", "--run", run, "--poll-seconds", "1"), env=env, stdout=logf,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            self.children.append(side)
        elif mode == "scheduled":
            ticker = threading.Thread(target=self.schedule, args=(cfg, env, logf, stop), daemon=True)
            ticker.start()
        load0 = load()
        t0 = time.perf_counter()
        subprocess.run(child, env=env, stdout=logf, stderr=subprocess.STDOUT, check=True, timeout=1800)
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
        row = {
            "fw": fw, "mode": mode, "rep": rep, "run": run, "load_before": load0, "load_after": load(),
            "train_seconds": train_s, "steps": len(steps) + 1, "every": t["every"],
            "step_median_ms": statistics.median(steps) * 1000, "step_mean_ms": statistics.fmean(steps) * 1000,
            "cpu_median_ms": statistics.median(t["step_cpu_seconds"]) * 1000,
            "cpu_mean_ms": statistics.fmean(t["step_cpu_seconds"]) * 1000,
            "saves": a.saves, "archived": len(got), "rpo_seconds": sorted(rpo),
            "rpo_by_step": {s: v / 1000 for s, v in sorted(got.items()) if v is not None},
            "rpo_median": statistics.median(rpo) if rpo else None, "rpo_max": max(rpo) if rpo else None,
        }  # fmt: skip
        shown = (
            f"  RPO median {row['rpo_median']:.1f} s, max {row['rpo_max']:.1f} s" if rpo
            else ("" if mode == "baseline" else "  RPO: none recorded")
        )  # fmt: skip
        log(f"  {run:22} step {row['step_median_ms']:6.1f} ms median, {row['step_mean_ms']:6.1f} mean, "
            f"CPU {row['cpu_median_ms']:5.1f} median; "
            f"{len(got)}/{a.saves} archived{shown}  (load {load0} -> {row['load_after']})")  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)
        return row

    def schedule(self, cfg: Path, env: dict[str, str], logf: Any, stop: threading.Event) -> None:
        """`ckptvault ingest` every --interval s from the training run's start, one at a time."""
        while not stop.is_set():
            start = time.monotonic()
            p = subprocess.Popen(self.ckptvault(cfg, "ingest"), env=env, stdout=logf, stderr=subprocess.STDOUT)
            self.children.append(p)
            p.wait()
            stop.wait(max(0.0, start + self.args.interval - time.monotonic()))

    def order(self) -> list[tuple[str, int]]:
        """Per framework: baseline/hook pairs, alternating which goes first, with follow and scheduled
        after the first pair."""
        out: list[tuple[str, int]] = []
        for rep in range(self.args.pairs):
            pair = [("baseline", rep), ("hook", rep)]
            out += pair if rep % 2 == 0 else pair[::-1]
            if rep == 0:
                out += [(m, 0) for m in self.args.modes if m != "hook"]
        if "hook" not in self.args.modes:
            out = [(m, r) for m, r in out if m != "hook"]
        return out

    def main(self) -> int:
        a = self.args
        started = dt.datetime.now(dt.UTC)
        self.logs.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self.server.up()
        log(f"SeaweedFS at {self.server.url} in {time.perf_counter() - t0:.0f} s; load {load()}")
        s3_client(self.server).create_bucket(Bucket=BUCKET)
        env = self.env()
        self.handoff = handoff_us()
        h = self.handoff
        log(
            f"notify_saved on the caller's thread: {h['median_us']:.1f} us median, {h['max_us']:.0f} us max, "
            f"{h['first_us']:.0f} us the first (the thread's start); load {load()}"
        )
        for fw in a.frameworks:
            log(f"{fw}: {a.saves} saves, one every {EVERY[fw]} steps")
            for mode, rep in self.order():
                self.rows.append(self.one(fw, mode, rep, env))
                if a.json:  # after every run: an interrupted bench keeps what it measured
                    self.write_json(started)
        summary = summarize(self.rows)
        text = render(summary, a)
        print("\n" + text)
        if a.json:
            self.write_json(started)
        return 0

    def write_json(self, started: dt.datetime) -> None:
        a = self.args
        meta = machine_info()
        meta.update(started=started.isoformat(), args={k: str(v) for k, v in vars(a).items()})
        a.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"meta": meta, "handoff": self.handoff, "summary": summarize(self.rows), "runs": self.rows}
        a.json.write_text(json.dumps(out, indent=1))

    def cleanup(self) -> None:
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
            modes[mode] = {
                "runs": len(rs), "saves": sum(r["saves"] for r in rs), "archived": sum(r["archived"] for r in rs),
                "rpo_median": statistics.median(rpo) if rpo else None, "rpo_max": max(rpo) if rpo else None,
                "step_median_ms": statistics.median(r["step_median_ms"] for r in rs),
                "load": ", ".join(r["load_before"].split()[0] for r in rs),
            }  # fmt: skip
        base = {r["rep"]: r for r in mine if r["mode"] == "baseline"}
        pairs = [(r, base[r["rep"]]) for r in mine if r["mode"] == "hook" and r["rep"] in base]
        out[fw] = {
            "modes": modes,
            "hook_median_ratio": [h["step_median_ms"] / b["step_median_ms"] for h, b in pairs],
            "hook_mean_ratio": [h["step_mean_ms"] / b["step_mean_ms"] for h, b in pairs],
            "hook_cpu_median_ratio": [h["cpu_median_ms"] / b["cpu_median_ms"] for h, b in pairs],
            "hook_cpu_mean_ratio": [h["cpu_mean_ms"] / b["cpu_mean_ms"] for h, b in pairs],
        }
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def render(summary: dict[str, Any], a: argparse.Namespace) -> str:
    lines = [
        f"RPO (commit marker -> verified manifest, `ls --json` rpo_ms), {a.saves} saves a run, SeaweedFS; "
        f"scheduled: every {a.interval:g} s, settle_seconds {a.settle:g} in every mode",
        "",
        "| framework | mode | saves archived | RPO median s | RPO max s | step median ms | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for fw, s in summary.items():
        for mode, m in s["modes"].items():
            archived = "-" if mode == "baseline" else f"{m['archived']}/{m['saves']}"
            lines.append(
                f"| {fw} | {mode} | {archived} | {_s(m['rpo_median'])} | {_s(m['rpo_max'])} | "
                f"{m['step_median_ms']:.1f} | {m['load']} |"
            )
    lines += ["", "Step time with the hook / without (each interleaved pair):", ""]
    for fw, s in summary.items():
        med = ", ".join(f"{x:.3f}" for x in s["hook_median_ratio"])
        mean = ", ".join(f"{x:.3f}" for x in s["hook_mean_ratio"])
        cpu = ", ".join(f"{x:.3f}" for x in s["hook_cpu_median_ratio"])
        cpu_mean = ", ".join(f"{x:.3f}" for x in s["hook_cpu_mean_ratio"])
        lines.append(f"- {fw}: wall: median step {med}, mean {mean}; process CPU: median step {cpu}, mean {cpu_mean}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench(args.scratch, lambda: RpoBench(args))


if __name__ == "__main__":
    sys.exit(main())
