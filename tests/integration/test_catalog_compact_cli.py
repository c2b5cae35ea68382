"""`ckptvault catalog compact` on a real SeaweedFS, through the CLI process (issue [V]): a catalog in the
flat layout before partitions, compacted, interrupted with SIGINT half-way, and run again: every run's
listing equals the fold of its events at every point, nothing lost or doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Event, encode_events, fold
from ckptvault.catalog.listing import as_record
from ckptvault.config import StoreConfig
from ckptvault.store import ObjectStore, open_store
from tests.helpers import write_config

RUNS, STEPS = 240, 4


def _flat(store: ObjectStore, prefix: str) -> list[Event]:
    """A catalog written before partitions: a flat-layout file per run, every event of its saves."""
    evs: list[Event] = []
    base = time.time_ns() - 10**11
    for r in range(RUNS):
        run = f"run-{r:03d}"
        mine = [
            e
            for s in range(STEPS)
            for e in (
                Event(run, s * 100, "discovered", 1.7e9 + r * 100 + s, format="hf"),
                Event(run, s * 100, "uploaded", 1.7e9 + r * 100 + s + 0.5, bytes=10, files=2, storage_class="STANDARD"),
                Event(run, s * 100, "verified", 1.7e9 + r * 100 + s + 0.7),
            )
        ]
        store.put_bytes(f"{prefix}/_catalog/events/{base + r:020d}-{r:032x}.parquet", encode_events(mine))
        evs += mine
    return evs


def _ls(cfg: Path, env: dict[str, str]) -> Any:
    out = subprocess.run([sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), "ls", "--json"],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_catalog_compact_interrupted_half_way_then_rerun_lists_every_save_once(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    env = {**os.environ, **seaweedfs.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    store = open_store(StoreConfig(bucket=bucket, endpoint_url=seaweedfs.url, region=seaweedfs.region))
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [], prefix="t")
    want = [as_record(s) for s in fold(_flat(store, "t"))]
    assert json.loads(json.dumps(want)) == _ls(cfg, env)  # read from the flat layout, before anything

    cmd = [sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), "catalog", "compact", "--json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    snapshots = 0
    while proc.poll() is None and snapshots == 0:  # SIGINT as the first partitions' snapshots land
        snapshots = sum(1 for o in store.list("t/_catalog/") if "/snapshot/" in o.key)
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "interrupted; rerun the same command" in err and "Traceback" not in err
    parts = {o.key.split("/")[2] for o in store.list("t/_catalog/") if o.key.split("/")[2].startswith("run=")}
    snapped = {o.key.split("/")[2] for o in store.list("t/_catalog/") if "/snapshot/" in o.key}
    assert 0 < len(snapped) < RUNS and parts == snapped  # half-way: some runs moved, none without its snapshot
    assert _ls(cfg, env) == json.loads(json.dumps(want))  # half-compacted reads the same

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    done = json.loads(again.stdout)
    assert done["partitions"] == RUNS - len(snapped) and done["passes"] == 1
    keys = [o.key for o in store.list("t/_catalog/")]
    assert not any(k.startswith("t/_catalog/events/") for k in keys)  # the flat layout is gone
    assert sum("/snapshot/" in k for k in keys) == RUNS and sum("/_combined/" in k for k in keys) == 1
    assert _ls(cfg, env) == json.loads(json.dumps(want))  # every save once, as folded from its events
