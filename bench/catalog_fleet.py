"""The catalog at fleet scale on a real SeaweedFS (issue [K]): `bench/catalog.py --store seaweedfs`.

Starts SeaweedFS the way bench/run.py does (bench/servers.py: infra/local/seaweedfs.sh with bench-only
state and ports), builds RUNS runs x CKPTS saves x 5 events through the library's own `Catalog.append`
(one call per run, as the in-memory mode) and `Catalog.compact`, then times, each in a fresh process
(bench/measure.py's `measure`: wall, and peak RSS of the process tree):

    ls --json            `ckptvault ls --json` of every run, stdout to /dev/null (the Arrow table path);
                         again with the combined snapshot set aside (every partition read, as before it)
    ls --run R           `ckptvault ls --run R` (the table a person reads) and `ls --run R --json`
    restore read         what `ckptvault restore R` reads of the catalog before the flow starts
                         (`from_manifests.run_events` + `fold`)
    ingest read          what an ingest pass reads per `[[sources]]` entry (`known_states`)
    compaction of a day  DAY_SAVES new saves in every run, as the flows append them: one file per save
                         by ingest (discovered, uploaded, verified), one per save by tier (transitioned),
                         one per run by drill (drilled); then `Catalog.compact(now)` of every run, as
                         `tier --apply` calls it (without its 60 s time box, to see the whole cost)
    rebuild              `ckptvault catalog rebuild --json` over MANIFESTS manifests (12 files each) in a
                         prefix of their own, written in parallel through the store port

    .venv/bin/python bench/catalog.py --store seaweedfs [--runs 1000] [--ckpts 200] [--reps 3]
                     [--manifests 100000] [--day-saves 6] [--json bench/results/catalog-fleet.json]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import bucket, measure, paths, servers, units

PREFIX = "fleet"
REBUILD_PREFIX = "manifests"


def _run_name(r: int) -> str:
    return f"team/run-{r:04d}"


def _config(path: Path, server: servers.Server, prefix: str) -> Path:
    path.write_text(
        f'[store]\nbucket = "{bucket.BUCKET}"\nprefix = "{prefix}"\nendpoint_url = "{server.url}"\n'
        f'region = "{server.region}"\n'
    )
    return path


def _store(cfg_path: Path) -> Any:
    from ckptvault.config import load_config
    from ckptvault.store import open_store

    return open_store(load_config(str(cfg_path)).store), load_config(str(cfg_path)).store.prefix


def build(cfg_path: Path, runs: int, ckpts: int) -> dict[str, float]:
    from bench.catalog import _life
    from ckptvault.catalog import Catalog

    store, prefix = _store(cfg_path)
    cat = Catalog(store, prefix)
    t0 = time.perf_counter()

    def one(r: int) -> None:
        run = _run_name(r)
        cat.append([e for s in range(ckpts) for e in _life(run, s * 100, 1.7e9 + r * 1e5 + s * 10)])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(runs)))
    t1 = time.perf_counter()
    cat.compact(time.time() + 10)
    t2 = time.perf_counter()
    return {"append_s": t1 - t0, "compact_s": t2 - t1}


def build_flat(cfg_path: Path, runs: int, ckpts: int) -> float:
    """A catalog as versions before partitions wrote it: every event in the flat `_catalog/events/`, a
    file per run (RUNS files, 5 x CKPTS events each), written 8 at a time; returns the seconds."""
    from bench.catalog import _life
    from ckptvault.catalog import encode_events

    store, prefix = _store(cfg_path)
    base = time.time_ns() - 10**12
    t0 = time.perf_counter()

    def one(r: int) -> None:
        run = _run_name(r)
        evs = [e for s in range(ckpts) for e in _life(run, s * 100, 1.7e9 + r * 1e5 + s * 10)]
        store.put_bytes(f"{prefix}/_catalog/events/{base + r:020d}-{r:032x}.parquet", encode_events(evs))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(runs)))
    return time.perf_counter() - t0


def _flat_left(cfg_path: Path) -> int:
    store, prefix = _store(cfg_path)
    return sum(1 for _ in store.list(f"{prefix}/_catalog/events/"))


_Setup = tuple[Path, Path, servers.Server, dict[str, str], str, list[str], dict[str, Any]]


def _bench_setup(a: argparse.Namespace) -> _Setup:
    """A scratch directory of this run's own (two runs never share a server), its SeaweedFS (not yet up),
    the environment and commands the children run with, and the result record."""
    scratch: Path = paths.BENCH / f".scratch-catalog-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "logs").mkdir(parents=True)
    server = servers.Server(a.store, scratch, 8 * units.GiB)
    os.environ.update(AWS_ACCESS_KEY_ID=servers.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=servers.SECRET_KEY,
                      AWS_REGION=server.region, AWS_EC2_METADATA_DISABLED="true")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE", "CKPTVAULT_CONFIG")}
    env["PYTHONPATH"] = str(paths.REPO)
    py = [sys.executable, str(Path(__file__).resolve())]
    res: dict[str, Any] = {"store": a.store, "runs": a.runs, "ckpts": a.ckpts, "events": a.runs * a.ckpts * 5,
                           "rows": {}}  # fmt: skip
    return scratch, scratch / "logs" / "catalog.log", server, env, str(paths.VENV_BIN / "ckptvault"), py, res


def upgrade_main(a: argparse.Namespace) -> None:
    """The catalog right after an upgrade (issue [V]): RUNS x CKPTS x 5 events in the flat layout, then
    (1) the ingest passes of one run (`compact(runs=[R], max_seconds=60)`, as the ingest flow calls it)
    until no flat file is left, then `ls --json` and `ls --run R --json`; (2) the same catalog written
    afresh under another prefix, one `ckptvault catalog compact`, then `ls --json`, `ls --run R --json`
    and `metrics --textfile`. On SeaweedFS or moto (`--store`)."""
    scratch, log, server, env, ckv, py, res = _bench_setup(a)
    rows = res["rows"]
    one = _run_name(a.runs // 2)
    try:
        server.up()
        bucket.s3_client(server).create_bucket(Bucket=bucket.BUCKET)
        cfg = _config(scratch / "upgrade.toml", server, "upgrade")
        res["flat_write_s"] = build_flat(cfg, a.runs, a.ckpts)
        measure.log(f"flat layout: {a.runs} files, {res['events']} events in {res['flat_write_s']:.1f} s")
        passes: list[dict[str, Any]] = []
        while _flat_left(cfg):
            passes.append(_measure([*py, "child", "compact-runs", str(cfg), one], env, log, 1))
            measure.log(f"ingest pass {len(passes)}: {passes[-1]}")
        res["ingest_passes"] = len(passes)
        store, _ = _store(cfg)  # what the passes' time boxes left without a snapshot is folded by every read
        res["snapshots_after_passes"] = sum("/snapshot/" in o.key for o in store.list("upgrade/_catalog/"))
        res["combined_after_passes"] = sum(1 for _ in store.list("upgrade/_catalog/_combined/"))
        measure.log(f"after the passes: {res['snapshots_after_passes']} run snapshots, "
                    f"{res['combined_after_passes']} combined")  # fmt: skip
        rows[f"the ingest passes that migrate it ({len(passes)}), together"] = {
            "seconds": sum(p["seconds"] for p in passes), "all_seconds": [p["seconds"] for p in passes],
            "max_rss_mib": max(p["max_rss_mib"] for p in passes),
            "in_process_seconds": sum(p["in_process_seconds"] or 0 for p in passes),
        }  # fmt: skip
        full = scratch / "ls.json"
        with full.open("wb") as f:
            subprocess.run([ckv, "--config", str(cfg), "ls", "--json"], env=env, stdout=f, check=True)
        listed = len(json.loads(full.read_bytes()))
        assert listed == a.runs * a.ckpts, listed
        full.unlink()
        base = [ckv, "--config", str(cfg)]
        rows["ls --json, after the passes"] = _measure([*base, "ls", "--json"], env, log, a.reps, Path(os.devnull))
        rows["ls --run R --json, after the passes"] = _measure([*base, "ls", "--run", one, "--json"], env, log, a.reps)
        cfg2 = _config(scratch / "upgrade2.toml", server, "upgrade2")
        build_flat(cfg2, a.runs, a.ckpts)
        rows["catalog compact (the same flat layout)"] = _measure(
            [ckv, "--config", str(cfg2), "catalog", "compact", "--json"], env, log, 1)  # fmt: skip
        assert _flat_left(cfg2) == 0
        rows["ls --json, after catalog compact"] = _measure([ckv, "--config", str(cfg2), "ls", "--json"], env, log,
                                                            a.reps, Path(os.devnull))  # fmt: skip
        rows["ls --run R --json, after catalog compact"] = _measure(
            [ckv, "--config", str(cfg2), "ls", "--run", one, "--json"], env, log, a.reps)  # fmt: skip
        # the [Q] metrics over the same 1M-event catalog, compacted (issue [Q]'s Done-when)
        got = metrics_rows(cfg2, env, log, a.reps, scratch)
        rows.update({f"{k}, after catalog compact": v for k, v in got.items()})
        for name, row in rows.items():
            measure.log(f"{name}: {row}")
    finally:
        server.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(render(res))
    if a.json:
        a.json.write_text(json.dumps({"cpus": os.cpu_count(), **res}, indent=1))


def day(cfg_path: Path, runs: int, ckpts: int, saves: int, first: int = 0, tier: bool = True) -> int:
    """A day's events in every run, appended as the flows append them; returns how many files."""
    from ckptvault.catalog import Catalog, Event

    store, prefix = _store(cfg_path)
    cat = Catalog(store, prefix)
    t = time.time()

    def one(r: int) -> int:
        run = _run_name(r)
        steps = [(ckpts + i) * 100 for i in range(saves)]
        m = json.dumps({"metrics": {"loss": 0.5 / (r + 1)}})
        for s in steps:  # ingest: one append per checkpoint
            cat.append([Event(run, s, "discovered", t, format="hf", created_at=t - 5),
                        Event(run, s, "uploaded", t + 1, bytes=10 << 20, files=12, storage_class="STANDARD",
                              detail=m),
                        Event(run, s, "verified", t + 2, detail=m)])  # fmt: skip
        if not tier:
            return saves
        for s in steps:  # tier: one append per action
            cat.append([Event(run, s, "transitioned", t + 3, storage_class="GLACIER_IR")])
        cat.append([Event(run, s, "drilled", t + 4, ok=True) for s in steps])  # drill: one per pass
        return 2 * saves + 1

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(one, range(first, first + runs)))


def write_manifests(cfg_path: Path, n: int, start: int = 0, per_run: int = 1000) -> float:
    """Manifests number `start` to `n` (runs of `per_run` saves), 12 files each, 32 PUTs at a time."""
    from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix

    store, prefix = _store(cfg_path)
    files = tuple(FileEntry(f"model-{i:05d}-of-00012.safetensors", 1 << 30, 1.7e9, "AAAAAA==") for i in range(12))
    t0 = time.perf_counter()

    def one(i: int) -> None:
        run, step = f"run-{i // per_run:04d}", (i % per_run + 1) * 100
        m = Manifest(run=run, step=step, format="hf", files=files, created_at=1.7e9 + i, uploaded_at=1.7e9 + i + 60,
                     source=f"/ckpt/{run}", metrics={"loss": 1.0 / (i + 1)})  # fmt: skip
        store.put_bytes(checkpoint_prefix(prefix, run, step) + MANIFEST_NAME, m.to_json())

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(start, n)))
    return time.perf_counter() - t0


# --- the children, one library call each (their RSS is theirs) -------------------------------------


def child(op: str, cfg_path: Path, args: list[str]) -> None:
    from ckptvault.catalog import Catalog, fold

    store, prefix = _store(cfg_path)
    cat = Catalog(store, prefix)
    t0 = time.perf_counter()
    if op == "restore-read":
        from ckptvault.restore import from_manifests

        events, bad = from_manifests.run_events(cat, args[0])
        print(f"{len(fold(events))} saves of {args[0]} from {len(events)} events, {len(bad)} unreadable")
    elif op == "ingest-read":
        from ckptvault.ingest.steps import known_states

        n = sum(len(known_states(cat, r)) for r in args)
        print(f"{n} known steps in {len(args)} runs")
    elif op == "ls-json":  # what cmd_ls --json runs, without the CLI's start-up
        from ckptvault.catalog.table_view import current_table, select_table, write_json_table

        with open(os.devnull, "wb") as out:
            write_json_table(select_table(current_table(cat, args[0] if args else None), None, None, None), out)
    elif op == "ls-run":  # what cmd_ls runs for the table
        from ckptvault.catalog.listing import render_table, select

        print(render_table(select(cat.current(args[0]), None, None)).count("\n"), "lines")
    elif op == "metrics":  # what `ckptvault metrics` computes, without the CLI's start-up
        from ckptvault.config import load_config
        from ckptvault.observe.metrics import compute, exposition, options_for

        got = compute(cat, options_for(load_config(str(cfg_path))))
        print(f"{len(exposition(got))} bytes of metrics, catalog read {'ok' if got.up else got.error}")
    elif op == "compact":
        print(f"compacted {cat.compact(time.time())} event files")
    elif op == "compact-runs":  # what an ingest pass compacts after itself: its sources' runs
        from ckptvault.catalog import COMPACT_SECONDS

        print(f"compacted {cat.compact(time.time(), runs=args, max_seconds=COMPACT_SECONDS)} event files")
    else:
        raise SystemExit(f"unknown child op {op}")
    took = time.perf_counter() - t0
    print(f"in-process {took:.3f} s")
    if os.environ.get("CATALOG_BENCH_TIMES"):
        with open(os.environ["CATALOG_BENCH_TIMES"], "a") as f:
            f.write(f"{took}\n")


# --- the driver ------------------------------------------------------------------------------------


def _measure(cmd: list[str], env: dict[str, str], log: Path, reps: int, out: Path | None = None) -> dict[str, Any]:
    times = log.parent / "inproc.txt"
    times.unlink(missing_ok=True)
    got = [measure.measure(cmd, {**env, "CATALOG_BENCH_TIMES": str(times)}, out or log) for _ in range(reps)]
    inproc = [float(x) for x in times.read_text().split()] if times.exists() else []
    bad = [g for g in got if g["rc"] != 0]
    if bad:
        raise SystemExit(f"failed (rc {bad[0]['rc']}): {' '.join(cmd)}; see {log}")
    return {
        "seconds": statistics.median(g["seconds"] for g in got),
        "all_seconds": [round(g["seconds"], 3) for g in got],
        "max_rss_mib": max(g["max_rss_mib"] for g in got),
        # the library call alone, timed inside the child: the rest is the process's start-up and imports
        "in_process_seconds": statistics.median(inproc) if inproc else None,
    }


def metrics_rows(cfg: Path, env: dict[str, str], log: Path, reps: int, scratch: Path) -> dict[str, Any]:
    """`ckptvault metrics --textfile` (docs/metrics.md) over the fleet, and its library calls alone."""
    prom = scratch / "ckptvault.prom"
    cmd = [str(paths.VENV_BIN / "ckptvault"), "--config", str(cfg), "metrics", "--textfile", str(prom)]
    rows = {
        "metrics --textfile": _measure(cmd, env, log, reps),
        "metrics: its library calls": _measure(
            [sys.executable, str(Path(__file__).resolve()), "child", "metrics", str(cfg)], env, log, reps
        ),
    }
    assert "ckptvault_catalog_up 1.0" in prom.read_text()
    return rows


def fleet_main(a: argparse.Namespace) -> None:
    scratch, log, server, env, ckv, py, res = _bench_setup(a)
    rows = res["rows"]
    try:
        server.up()
        bucket.s3_client(server).create_bucket(Bucket=bucket.BUCKET)
        cfg = _config(scratch / "fleet.toml", server, PREFIX)
        one = _run_name(a.runs // 2)
        if a.runs:
            res["build"] = build(cfg, a.runs, a.ckpts)
            measure.log(f"built {a.runs} runs x {a.ckpts} saves x 5 events: {res['build']}")
            # once with its output kept: every save listed
            full = scratch / "ls.json"
            with full.open("wb") as f:
                subprocess.run([ckv, "--config", str(cfg), "ls", "--json"], env=env, stdout=f, check=True)
            listed = len(json.loads(full.read_bytes()))
            assert listed == a.runs * a.ckpts, listed
            full.unlink()
            base = [ckv, "--config", str(cfg)]
            # the floor under every command: the interpreter and the CLI's imports, no catalog read
            rows["ckptvault --version (start-up)"] = _measure([ckv, "--version"], env, log, a.reps)
            rows["ls --json"] = _measure([*base, "ls", "--json"], env, log, a.reps, Path(os.devnull))
            rows["ls --json: its library calls"] = _measure([*py, "child", "ls-json", str(cfg)], env, log, a.reps)
            # the same catalog without its combined snapshot: every partition read, as before there was one
            store, _ = _store(cfg)
            combined = {o.key: store.get_bytes(o.key) for o in store.list(f"{PREFIX}/_catalog/_combined/")}
            res["combined_snapshot_bytes"] = sum(len(v) for v in combined.values())
            for k in combined:
                store.delete(k)
            rows["ls --json, no combined snapshot"] = _measure([*base, "ls", "--json"], env, log, a.reps,
                                                               Path(os.devnull))  # fmt: skip
            rows["ls --json, no combined snapshot: its library calls"] = _measure(
                [*py, "child", "ls-json", str(cfg)], env, log, a.reps)  # fmt: skip
            for k, v in combined.items():
                store.put_bytes(k, v)
            rows["ls --run R"] = _measure([*base, "ls", "--run", one], env, log, a.reps)
            rows["ls --run R: its library calls"] = _measure([*py, "child", "ls-run", str(cfg), one], env, log, a.reps)
            rows["ls --run R --json"] = _measure([*base, "ls", "--run", one, "--json"], env, log, a.reps)
            rows["restore's catalog read"] = _measure([*py, "child", "restore-read", str(cfg), one], env, log, a.reps)
            rows["ingest's catalog read"] = _measure([*py, "child", "ingest-read", str(cfg), one], env, log, a.reps)
            rows.update(metrics_rows(cfg, env, log, a.reps, scratch))
            for name, row in rows.items():
                measure.log(f"{name}: {row}")
            t = time.perf_counter()
            res["day_files"] = day(cfg, a.runs, a.ckpts, a.day_saves)
            measure.log(f"a day: {res['day_files']} event files in {time.perf_counter() - t:.1f} s")
            rows["compaction of a day"] = _measure([*py, "child", "compact", str(cfg)], env, log, 1)
            measure.log(f"compaction of a day: {rows['compaction of a day']}")
            # what ingest does after each pass: its run's new file (one save) folded into the snapshot
            day(cfg, 1, a.ckpts + 100, 1, first=a.runs // 2, tier=False)
            rows["compaction after an ingest pass (1 run)"] = _measure([*py, "child", "compact-runs", str(cfg), one],
                                                                       env, log, 1)  # fmt: skip
            # after it, the listing is one snapshot per run again
            rows["ls --json, after"] = _measure([*base, "ls", "--json"], env, log, 1, Path(os.devnull))
        written = 0
        for n in sorted({int(x) for x in str(a.manifests).split(",") if int(x) > 0}):
            # one prefix, grown to each size in turn: rebuild reads every manifest under it
            rcfg = _config(scratch / "rebuild.toml", server, REBUILD_PREFIX)
            res[f"manifests_write_s_{n}"] = write_manifests(rcfg, n, start=written)
            written = n
            measure.log(f"wrote manifests up to {n} in {res[f'manifests_write_s_{n}']:.1f} s")
            cmd = [ckv, "--config", str(rcfg), "catalog", "rebuild", "--json"]
            rows[f"catalog rebuild, {n} manifests"] = _measure(cmd, env, log, 1)
            measure.log(f"rebuild of {n}: {rows[f'catalog rebuild, {n} manifests']}")
    finally:
        server.down()
        if a.keep_logs:
            shutil.copytree(scratch / "logs", paths.BENCH / ".catalog-logs", dirs_exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    print(render(res))
    if a.json:
        a.json.write_text(json.dumps({"cpus": os.cpu_count(), **res}, indent=1))


def render(res: dict[str, Any]) -> str:
    out = ["| operation | wall s (median) | each rep | in-process s | peak RSS MiB |",
           "| --- | ---: | --- | ---: | ---: |"]  # fmt: skip
    for name, r in res["rows"].items():
        inproc = "" if r["in_process_seconds"] is None else f"{r['in_process_seconds']:.2f}"
        out.append(f"| {name} | {r['seconds']:.2f} | {', '.join(f'{s:.2f}' for s in r['all_seconds'])} "
                   f"| {inproc} | {r['max_rss_mib']:.0f} |")  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child(sys.argv[2], Path(sys.argv[3]), sys.argv[4:])
