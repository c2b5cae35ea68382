"""A compaction SIGKILLed at each point between its writes and its deletes (the combined snapshot's
among them), in a separate process, on SeaweedFS: afterwards nothing is lost and nothing doubled (the
events and the fold are the ones before), and the next compaction converges (one snapshot, one event
file, one combined snapshot, then nothing left to do)."""

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

from ckptvault.catalog import Catalog, Event
from ckptvault.config import StoreConfig
from ckptvault.store import ObjectStore, open_store

PREFIX = "vault"
ROOT = Path(__file__).resolve().parents[2]

# The child compacts run r and stops the world after its K-th write or delete: it says so on stdout and
# waits, so the parent kills it exactly there (no timing decides where).
CHILD = """
import sys, time
from ckptvault.catalog import Catalog
from ckptvault.config import StoreConfig
from ckptvault.store import open_store

bucket, url, region, stop_after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = open_store(StoreConfig(bucket=bucket, endpoint_url=url, region=region))
calls = []

def counted(name):
    real = getattr(store, name)
    def call(key, *a, **kw):
        out = real(key, *a, **kw)
        calls.append(f"{name} {key if isinstance(key, str) else ' '.join(key)}")
        if len(calls) == stop_after:
            print("\\n".join(calls), flush=True)
            print("PAUSED", flush=True)
            time.sleep(600)
        return out
    return call

store.put_bytes = counted("put_bytes")
store.delete = counted("delete")
store.delete_many = counted("delete_many")
Catalog(store, "vault").compact(time.time() + 60, runs=["r"])
print("\\n".join(calls), flush=True)
print("DONE", flush=True)
"""


@pytest.fixture
def bucket_store(seaweedfs: Any, bucket_factory: Callable[[Any], str],
                 monkeypatch: pytest.MonkeyPatch) -> tuple[str, ObjectStore]:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    return bucket, open_store(StoreConfig(bucket=bucket, endpoint_url=seaweedfs.url, region=seaweedfs.region))


def _keys(store: ObjectStore, kind: str) -> list[str]:
    return sorted(o.key for o in store.list(f"{PREFIX}/_catalog/run=r/{kind}/"))


def _combined(store: ObjectStore) -> list[str]:
    return sorted(o.key for o in store.list(f"{PREFIX}/_catalog/_combined/"))


def _build(cat: Catalog) -> None:
    """Run r with a snapshot (of a first compaction) and four event files written after it: the next
    compaction merges five event files, writes a snapshot, then deletes the five and the old snapshot."""
    for i in range(3):
        detail = json.dumps({"metrics": {"loss": i / 10}})
        cat.append([Event("r", i, "uploaded", 100.0 + i, bytes=10, storage_class="STANDARD"),
                    Event("r", i, "verified", 100.5 + i, detail=detail)])  # fmt: skip
    cat.compact(time.time() + 60, runs=["r"])
    for i in range(4):
        cat.append([Event("r", i, "drilled", 200.0 + i, ok=i != 2), Event("r", 10 + i, "discovered", 300.0 + i)])
    cat.append([Event("q", 1, "verified", 1.0)])  # another run's partition, untouched by a compaction of r


@pytest.mark.parametrize(
    "stop_after,where",
    [
        (1, "after the merged event file is written, before the snapshot"),
        (2, "after the snapshot is written, before any delete"),
        (3, "after the merged sources are deleted (one DeleteObjects), before the old snapshot"),
        (4, "after the old snapshot is deleted, before the combined snapshot is written"),
        (5, "after the combined snapshot is written, before the old one is deleted"),
    ],
)
def test_sigkill_mid_compaction_loses_nothing_doubles_nothing_and_the_next_converges(
    seaweedfs: Any, bucket_store: tuple[str, ObjectStore], stop_after: int, where: str
) -> None:
    bucket, store = bucket_store
    cat = Catalog(store, PREFIX)
    _build(cat)
    assert (len(_keys(store, "events")), len(_keys(store, "snapshot"))) == (5, 1)
    assert len(_combined(store)) == 1  # the first compaction's
    events_before, current_before, q_before = cat.events("r"), cat.current("r"), cat.current("q")
    assert len(events_before) == 14

    env = {**os.environ, **seaweedfs.env(), "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, bucket, seaweedfs.url, seaweedfs.region, str(stop_after)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    assert child.stdout is not None
    calls = []
    for line in child.stdout:
        if line.strip() in ("PAUSED", "DONE"):
            assert line.strip() == "PAUSED", (calls, where)
            break
        calls.append(line.strip())
    else:
        err = child.stderr.read() if child.stderr else ""
        raise AssertionError(f"the child ended before pausing: exit {child.wait()}, {err}")
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    # the writes come first, then the deletes: the kill landed where the parameter says
    kinds = [c.split(" ", 1)[0] for c in calls]
    assert kinds == ["put_bytes", "put_bytes", "delete_many", "delete", "put_bytes", "delete"][:stop_after]
    assert ("/snapshot/" in calls[-1]) == (stop_after in (2, 4))
    assert ("/_combined/" in calls[-1]) == (stop_after == 5)
    assert stop_after != 3 or calls[-1].count("/events/") == 5  # the five merged sources, in one request

    fresh = Catalog(store, PREFIX)
    assert fresh.events("r") == events_before, where  # nothing lost, nothing doubled
    assert fresh.current("r") == current_before, where
    assert fresh.current() == [*q_before, *current_before]  # sorted by run
    assert fresh.unreadable == {}

    # the next compaction converges: one event file and one snapshot, the same answers, then nothing to do
    fresh.compact(time.time() + 60, runs=["r"])
    assert (len(_keys(store, "events")), len(_keys(store, "snapshot"))) == (1, 1), where
    again = Catalog(store, PREFIX)
    assert again.events("r") == events_before
    assert again.current("r") == current_before
    assert again.compact(time.time() + 60, runs=["r"]) == 0
    assert (len(_keys(store, "events")), len(_keys(store, "snapshot"))) == (1, 1)
    assert len(_combined(store)) == 1, where  # the older one deleted once a newer one is there
    assert Catalog(store, PREFIX).current() == [*q_before, *current_before]
