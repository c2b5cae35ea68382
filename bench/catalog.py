"""The catalog's read of every run from snapshots: against an in-memory store (no server, the decode and
fold alone; the default), or with `--store seaweedfs` the fleet-scale bench of bench/catalog_fleet.py.

    .venv/bin/python bench/catalog.py [--runs 1000] [--ckpts 200] [--reps 3] [--path states|table]
                                      [--save FILE | --load FILE]
    .venv/bin/python bench/catalog.py --store seaweedfs [--runs 1000] [--ckpts 200] [--reps 3]
                                      [--manifests 100000] [--day-saves 6] [--json FILE] [--keep-logs]

Builds RUNS runs x CKPTS checkpoints x 5 events (discovered, uploaded and verified with metrics, distinct
in every checkpoint, and a fingerprint in `detail`, transitioned, drilled) through the library's own
`Catalog.append` (one call per run: one event file per partition) and `Catalog.compact` (one snapshot per
partition), in the in-memory store of tests/unit/test_catalog_layout.py. Then times `Catalog.current()`
(every run), `render_json` of it (what `ls --json` printed before) and `Catalog.current(run)` (one run), REPS
times each, and prints one line per measurement, then peak RSS (`resource.getrusage`, the whole process:
the catalog built in memory included). `--path table` times what `ls --json` runs now instead
(`table_view.current_table` and `write_json_table` to /dev/null, no `CheckpointState`); `states` the states and
`render_json`; `--path metrics` what `ckptvault metrics` computes (ckptvault/observe/metrics.py: the read, the
sums, the exposition text). `--save` pickles the built catalog's objects, `--load` reads them instead of building, so
an A/B compares fresh processes on one catalog and peak RSS is the read's, not the build's.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import sys
import time
from pathlib import Path

from prometheus_client import generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptvault.catalog import Catalog, Event
from ckptvault.catalog.listing import render_json
from ckptvault.catalog.table_view import current_table, write_json_table
from ckptvault.observe.metrics import MetricsOptions, registry_for
from ckptvault.pricing import load_prices
from tests.unit.test_catalog_layout import MemStore


def _life(run: str, step: int, t: float) -> list[Event]:
    # metrics differ in every checkpoint of every run, so no reader can get them from a cache
    m = json.dumps({"metrics": {"loss": t % 1000 / (step + 1), "acc": step / 1000}, "fingerprint": f"{run}:{step}"})
    return [
        Event(run, step, "discovered", t, format="hf", created_at=t - 5),
        Event(run, step, "uploaded", t + 1, bytes=10 << 20, files=12, storage_class="STANDARD", detail=m),
        Event(run, step, "verified", t + 2, detail=m),
        Event(run, step, "transitioned", t + 3, storage_class="GLACIER_IR"),
        Event(run, step, "drilled", t + 4, ok=step % 7 != 0),
    ]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_main(a: argparse.Namespace) -> None:
    store = MemStore()
    cat = Catalog(store, "bench")  # type: ignore[arg-type]
    if a.load:
        store.objects = pickle.loads(a.load.read_bytes())
        print(f"loaded {len(store.objects)} objects, rss {_rss_mib():.0f} MiB")
    else:
        t0 = time.perf_counter()
        for r in range(a.runs):
            run = f"team/run-{r:04d}"
            cat.append([e for s in range(a.ckpts) for e in _life(run, s * 100, 1.7e9 + r * 1e5 + s * 10)])
        t1 = time.perf_counter()
        cat.compact(time.time() + 10)
        t2 = time.perf_counter()
        snaps = sum("/snapshot/" in k for k in store.objects)
        print(f"build: {a.runs} runs x {a.ckpts} checkpoints x 5 events: append {t1 - t0:.1f} s, "
              f"compact {t2 - t1:.1f} s, {snaps} snapshots, rss {_rss_mib():.0f} MiB")  # fmt: skip
    if a.save:
        a.save.write_bytes(pickle.dumps(store.objects))
    store.got.clear()
    n = 0
    options = MetricsOptions(cover_days=30, prices=load_prices())
    for i in range(a.reps):
        t = time.perf_counter()
        if a.path == "metrics":
            # `ckptvault metrics`: a fresh Catalog read, summed and rendered as the exposition text
            text = generate_latest(registry_for(lambda: Catalog(store, "bench"), options))  # type: ignore[arg-type]
            t_read = time.perf_counter() - t
            n = a.runs * a.ckpts
            t = time.perf_counter()
            print(f"metrics: rep {i + 1}: {t_read:.3f} s for {n} saves, {len(text)} bytes of text")
            store.got.clear()
            continue
        if a.path == "table":
            table = current_table(cat)
            n = table.num_rows
            t_read = time.perf_counter() - t
            t = time.perf_counter()
            with open(os.devnull, "wb") as out:
                write_json_table(table, out)  # what `ls --json` writes to stdout
            del table
        else:
            states = cat.current()
            n = len(states)
            t_read = time.perf_counter() - t
            t = time.perf_counter()
            render_json(states)  # what `ls --json` printed before the table path
            del states
        t_render = time.perf_counter() - t
        print(f"{a.path}: read all runs, rep {i + 1}: {t_read:.3f} s, {n} saves; render {t_render:.3f} s, "
              f"both {t_read + t_render:.3f} s")  # fmt: skip
        store.got.clear()
    one = f"team/run-{a.runs // 2:04d}"
    for i in range(a.reps):
        t = time.perf_counter()
        m = len(cat.current(one))
        print(f"current(run), rep {i + 1}: {(time.perf_counter() - t) * 1000:.1f} ms, {m} states")
    print(f"peak rss: {_rss_mib():.0f} MiB")
    assert n == a.runs * a.ckpts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=["memory", "seaweedfs", "moto"], default="memory",
                    help="memory: the decode and fold alone; seaweedfs (or moto): bench/catalog_fleet.py")  # fmt: skip
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--ckpts", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--path", choices=["states", "table", "metrics"], default="states", help="memory only")
    ap.add_argument("--save", type=Path, help="memory only")
    ap.add_argument("--load", type=Path, help="memory only")
    ap.add_argument(
        "--manifests",
        default="100000",
        help="seaweedfs only: manifests for catalog rebuild, or sizes to grow through (10000,30000)",
    )
    ap.add_argument("--day-saves", type=int, default=6, help="seaweedfs only: new saves per run in a day")
    ap.add_argument("--json", type=Path, help="seaweedfs only: the results as JSON")
    ap.add_argument("--keep-logs", action="store_true", help="seaweedfs only: keep the logs in bench/.catalog-logs")
    ap.add_argument("--upgrade", action="store_true",
                    help="seaweedfs only: the catalog right after an upgrade from the flat layout")  # fmt: skip
    a = ap.parse_args()
    if a.store != "memory" and a.upgrade:
        from catalog_fleet import upgrade_main

        upgrade_main(a)
    elif a.store != "memory":
        from catalog_fleet import fleet_main

        fleet_main(a)
    else:
        memory_main(a)


if __name__ == "__main__":
    main()
