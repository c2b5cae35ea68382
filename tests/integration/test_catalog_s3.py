"""The catalog against a real S3 server (SeaweedFS) through the real S3Store: append, read, compaction
under concurrent appends, and rebuilding from the manifests in the bucket."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from ckptvault.catalog import Catalog, Event, encode_events, fold
from ckptvault.catalog.codec import _table, _to_bytes
from ckptvault.checkpoint.manifest import FileEntry, Manifest, checkpoint_prefix
from ckptvault.config import StoreConfig
from ckptvault.store import ObjectStore, open_store

PREFIX = "vault"
KEY_RE = re.compile(r"^vault/_catalog/run=[^/]+/events/\d{20}-[0-9a-f]{32}\.parquet$")


@pytest.fixture
def store(seaweedfs: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    cfg = StoreConfig(bucket=bucket_factory(seaweedfs), endpoint_url=seaweedfs.url, region=seaweedfs.region)
    return open_store(cfg)


def _catalog_keys(store: ObjectStore) -> list[str]:
    """The catalog's keys but the combined snapshot's (test_a_read_of_every_run_over_the_combined_... counts it)."""
    return [o.key for o in store.list(f"{PREFIX}/_catalog/") if "/_catalog/_combined/" not in o.key]


def test_append_then_read_back_in_time_order(store: ObjectStore) -> None:
    cat = Catalog(store, PREFIX)
    assert cat.append([]) is None and _catalog_keys(store) == []
    k1 = cat.append([Event("r", 1, "uploaded", 10.0, bytes=5, files=1), Event("r", 1, "verified", 30.0)])
    k2 = cat.append([Event("r", 1, "transitioned", 20.0, storage_class="GLACIER"), Event("q", 2, "verified", 5.0)])
    assert k1 is not None and k2 is not None and KEY_RE.match(k1) and KEY_RE.match(k2)
    assert k2.startswith("vault/_catalog/run=q/")  # one file per run: q's, then r's
    assert len(_catalog_keys(store)) == 3 and {k1, k2} < set(_catalog_keys(store))
    assert [(e.run, e.event) for e in cat.events()] == [("q", "verified"), ("r", "uploaded"), ("r", "transitioned"),
                                                       ("r", "verified")]  # fmt: skip
    assert [e.event for e in cat.events("q")] == ["verified"]
    states = cat.current()
    assert [(s.run, s.step, s.state, s.storage_class, s.verified) for s in states] == [
        ("q", 2, "verified", "", True),
        ("r", 1, "verified", "GLACIER", True),
    ]
    assert [s.run for s in cat.current("r")] == ["r"]


def test_two_concurrent_writers_lose_nothing(store: ObjectStore) -> None:
    writers = [Catalog(store, PREFIX), Catalog(store, PREFIX)]
    n = 15

    def write(w: int) -> None:
        for i in range(n):
            writers[w].append([Event(f"w{w}", i, "verified", time.time(), detail=str(i))])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = {(e.run, e.step) for e in Catalog(store, PREFIX).events()}
    assert seen == {(f"w{w}", i) for w in range(2) for i in range(n)}
    assert len(_catalog_keys(store)) == 2 * n


def test_compaction_keeps_every_event_and_survives_concurrent_appends(store: ObjectStore) -> None:
    cat = Catalog(store, PREFIX)
    for i in range(6):
        cat.append([Event("r", i, "uploaded", float(i)), Event("r", i, "verified", float(i) + 0.5)])
    before = cat.events()
    other = Catalog(store, PREFIX)
    stop = threading.Event()
    late: list[int] = []

    def append_meanwhile() -> None:
        i = 100
        while not stop.is_set():
            other.append([Event("r", i, "verified", 1000.0 + i)])
            late.append(i)
            i += 1

    t = threading.Thread(target=append_meanwhile)
    t.start()
    try:
        merged = cat.compact(older_than=time.time())
    finally:
        stop.set()
        t.join()
    assert merged >= 6
    after = cat.events()
    assert [e for e in after if e.step < 100] == before  # same events, same order
    assert {e.step for e in after if e.step >= 100} == set(late)  # no concurrent append lost
    assert cat.compact(older_than=time.time()) >= 1  # the merged file and the late ones merge again
    assert len(_catalog_keys(store)) == 2 and cat.events() == after  # merged events and their snapshot
    assert cat.current() == fold(after)


def test_compaction_interrupted_before_delete_reads_without_duplicates(store: ObjectStore) -> None:
    cat = Catalog(store, PREFIX)
    keys = [cat.append([Event("r", i, "verified", float(i))]) for i in range(3)]
    saved = {k: store.get_bytes(k) for k in keys if k is not None}
    expected = cat.events()
    assert cat.compact(older_than=time.time()) == 3
    for k, data in saved.items():  # as if the compactor died after writing the merged file
        store.put_bytes(k, data)
    assert cat.events() == expected
    assert cat.compact(older_than=time.time()) == 4
    assert cat.events() == expected and len(_catalog_keys(store)) == 2


def test_compaction_leaves_newer_files_alone(store: ObjectStore) -> None:
    cat = Catalog(store, PREFIX)
    cat.append([Event("r", 1, "verified", 1.0)])
    cutoff = time.time()
    time.sleep(0.01)
    newer = cat.append([Event("r", 2, "verified", 2.0)])
    assert cat.compact(older_than=cutoff) == 0  # a single old file: nothing to merge, only a snapshot of it
    assert newer in _catalog_keys(store) and len(_catalog_keys(store)) == 3


def _put_checkpoint(
    store: ObjectStore, seaweedfs: Any, run: str, step: int, classes: list[str], manifest: bool = True
) -> Manifest:
    base = checkpoint_prefix(PREFIX, run, step)
    client = seaweedfs.client()
    entries = []
    for i, cls in enumerate(classes):
        data = bytes([i]) * (100 + i)
        # Storage-class labels are set with the raw client: seeding the bucket as a tiering run left it.
        client.put_object(Bucket=store.bucket, Key=f"{base}shard-{i}.bin", Body=data, StorageClass=cls)
        entries.append(FileEntry(path=f"shard-{i}.bin", size=len(data), mtime=1000.0 + i, crc32c="AAAAAA=="))
    m = Manifest(
        run=run, step=step, format="dcp", files=tuple(entries), created_at=1000.0 + len(classes),
        uploaded_at=2000.0 + step, source=f"/fs/{run}/step-{step}", metrics={"loss": 0.5},
    )  # fmt: skip
    if manifest:
        store.put_bytes(f"{base}_MANIFEST.json", m.to_json())
    return m


def test_rebuild_from_manifests(store: ObjectStore, seaweedfs: Any) -> None:
    cat = Catalog(store, PREFIX)
    _put_checkpoint(store, seaweedfs, "r1", 10, ["GLACIER", "GLACIER", "STANDARD"])
    _put_checkpoint(store, seaweedfs, "r1", 20, ["STANDARD", "STANDARD"])
    _put_checkpoint(store, seaweedfs, "r2", 5, ["DEEP_ARCHIVE"], manifest=False)  # not committed: absent
    store.put_bytes(f"{checkpoint_prefix(PREFIX, 'r3', 7)}_MANIFEST.json", b"{not json")
    cat.append([Event("r1", 10, "expired", 1.0)])  # the catalog's own files are not checkpoints
    events = cat.rebuild_from_manifests()
    got = {(e.run, e.step): e for e in events}
    assert set(got) == {("r1", 10), ("r1", 20), ("r3", 7)}
    e10 = got[("r1", 10)]
    assert (e10.event, e10.storage_class, e10.files, e10.bytes, e10.format) == ("verified", "GLACIER", 3, 303, "dcp")
    assert (e10.at, e10.created_at) == (2010.0, 1003.0)
    assert got[("r1", 20)].storage_class == "STANDARD"
    assert got[("r3", 7)].event == "invalid" and "not valid JSON" in got[("r3", 7)].detail

    fresh = Catalog(store, "other-prefix")  # an empty catalog, rebuilt from the bucket's manifests
    fresh.append(events)
    states = {(s.run, s.step): s for s in fresh.current()}
    assert states[("r1", 10)].verified and states[("r1", 10)].metrics == {"loss": 0.5}
    assert states[("r1", 10)].uploaded_at == 2010.0
    assert not states[("r3", 7)].verified


def test_an_unreadable_event_file_is_named_skipped_and_set_aside_never_deleted(
    store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    cat = Catalog(store, PREFIX)
    cat.append([Event("r", 1, "verified", 1.0)])
    cat.append([Event("r", 2, "verified", 2.0)])
    junk = f"{PREFIX}/_catalog/events/{time.time_ns() - 10**9:020d}-{'0' * 32}.parquet"
    store.put_bytes(junk, b"PAR1 this is not parquet")
    with caplog.at_level("WARNING", logger="ckptvault.catalog"):
        states = Catalog(store, PREFIX).current()
    assert [s.step for s in states] == [1, 2]  # the readable events still count
    assert junk in caplog.text and "not a readable Parquet file" in caplog.text
    merged = Catalog(store, PREFIX)
    assert merged.compact(time.time() + 60) == 3
    keys = _catalog_keys(store)
    assert junk not in keys and junk.replace("/events/", "/unreadable/") in keys
    assert store.get_bytes(junk.replace("/events/", "/unreadable/")) == b"PAR1 this is not parquet"
    assert [s.step for s in Catalog(store, PREFIX).current()] == [1, 2]


def test_ls_with_an_unreadable_catalog_object_warns_and_lists_the_rest(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    import json

    from ckptvault_cli.main import main
    from tests.helpers import write_config

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [])
    store = open_store(StoreConfig(bucket=bucket, endpoint_url=seaweedfs.url, region=seaweedfs.region))
    Catalog(store, "t").append([Event("r", 1, "verified", 1.0)])
    store.put_bytes(f"t/_catalog/events/{time.time_ns():020d}-{'f' * 32}.parquet", b"garbage")
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json"]) == 0
    out = capsys.readouterr()
    assert [r["step"] for r in json.loads(out.out)] == [1]
    assert "Traceback" not in out.err


def _flat_key(ns: int, i: int) -> str:
    return f"{PREFIX}/_catalog/events/{ns:020d}-{i:032x}.parquet"


def test_the_flat_layout_is_read_migrated_once_and_read_the_same_during_migration(store: ObjectStore) -> None:
    # Written as the code before partitions did: one file per append, and a merged file with identities.
    ns = time.time_ns() - 10**10
    appended = [[Event(f"run-{i % 3}", i, "uploaded", float(i)), Event(f"run-{i % 3}", i, "verified", i + 0.5)]
                for i in range(6)]  # fmt: skip
    for i, evs in enumerate(appended):
        store.put_bytes(_flat_key(ns + i, i), encode_events(evs))
    merged = [Event("run-0", 100, "verified", 50.0), Event("run-2", 101, "expired", 51.0)]
    origins = [(_flat_key(ns - 5, 90), 0), (_flat_key(ns - 4, 91), 0)]
    store.put_bytes(_flat_key(ns - 1, 99), _to_bytes(_table(merged, origins)))
    cat = Catalog(store, PREFIX)
    before, states = cat.events(), cat.current()
    assert len(before) == 14 and len(states) == 8
    saved = {k: store.get_bytes(k) for k in _catalog_keys(store)}
    assert cat.compact(time.time()) >= 7
    assert not [k for k in _catalog_keys(store) if "/_catalog/events/" in k]
    assert cat.events() == before and cat.current() == states
    assert cat.current("run-1") == [s for s in states if s.run == "run-1"]
    for k, data in saved.items():  # a reader while the flat files are not yet deleted
        store.put_bytes(k, data)
    assert cat.events() == before and cat.current() == states
    cat.compact(time.time())
    assert cat.events() == before and not [k for k in _catalog_keys(store) if "/_catalog/events/" in k]


class _DiesAtDelete(Exception):
    pass


def test_a_compaction_killed_after_its_writes_loses_and_doubles_nothing(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    cat = Catalog(store, PREFIX)
    for i in range(4):
        cat.append([Event("r", i, "uploaded", float(i)), Event("r", i, "verified", i + 0.5)])
    expected, states = cat.events(), cat.current()

    def die(key: str) -> None:
        raise _DiesAtDelete(key)

    # the write half runs, the process dies at the first delete (one, or a DeleteObjects of many)
    monkeypatch.setattr(store, "delete", die)
    monkeypatch.setattr(store, "delete_many", die)
    with pytest.raises(_DiesAtDelete):
        cat.compact(time.time())
    monkeypatch.undo()
    keys = _catalog_keys(store)
    assert len(keys) == 6 and sum("/snapshot/" in k for k in keys) == 1  # 4 sources, merged, snapshot
    assert cat.events() == expected and cat.current() == states
    cat.append([Event("r", 9, "verified", 99.0)])
    assert cat.compact(time.time()) == 6  # sources, merged and the late one
    assert len(_catalog_keys(store)) == 2
    assert cat.events() == [*expected, Event("r", 9, "verified", 99.0)]


class _Counting:
    """The store, recording the prefixes listed and the keys read."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.listed, self.got = inner, list[str](), list[str]()

    def list(self, prefix: str) -> Any:
        self.listed.append(prefix)
        return self.inner.list(prefix)

    def get_bytes(self, key: str) -> bytes:
        self.got.append(key)
        return self.inner.get_bytes(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_one_runs_read_touches_only_its_partition(store: ObjectStore) -> None:
    cat = Catalog(store, PREFIX)
    for r in ("a", "b", "c/d"):
        for i in range(3):
            cat.append([Event(r, i, "verified", float(i))])
    cat.compact(time.time())
    cat.append([Event("c/d", 7, "verified", 70.0)])
    counting = _Counting(store)
    states = Catalog(counting, PREFIX).current("c/d")
    assert [s.step for s in states] == [0, 1, 2, 7]
    assert sorted(counting.listed) == [f"{PREFIX}/_catalog/events/", f"{PREFIX}/_catalog/run=c%2Fd/"]
    assert counting.got and all(k.startswith(f"{PREFIX}/_catalog/run=c%2Fd/") for k in counting.got)


def test_a_read_of_every_run_over_the_combined_snapshot_is_one_get_and_always_right(
    store: ObjectStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Compaction writes one combined snapshot; a read of every run takes one GET and answers what the
    partitions answer; a run with newer events, a garbage combined snapshot and a bucket without one
    read right (docs/FORMAT.md, "The combined snapshot")."""
    from ckptvault.catalog.table_view import current_table
    from tests.helpers import render_json_table

    cat = Catalog(store, PREFIX)
    for r in ("a", "b", "c/d"):
        for i in range(3):
            cat.append([Event(r, i, "uploaded", float(i), bytes=10, storage_class="STANDARD"),
                        Event(r, i, "verified", i + 0.5)])  # fmt: skip
    cat.compact(time.time())
    combined = [o.key for o in store.list(f"{PREFIX}/_catalog/_combined/")]
    assert len(combined) == 1
    counting = _Counting(store)
    assert Catalog(counting, PREFIX).current() == fold(cat.events())
    assert counting.got == combined and counting.listed == [f"{PREFIX}/_catalog/"]
    over_combined = render_json_table(current_table(Catalog(store, PREFIX)))
    saved = store.get_bytes(combined[0])
    store.delete(combined[0])  # a bucket from before combined snapshots: every partition, the same answer
    assert render_json_table(current_table(Catalog(store, PREFIX))) == over_combined
    assert over_combined.count('"state": "verified"') == 9
    store.put_bytes(combined[0], saved)

    cat.append([Event("b", 1, "expired", 50.0)])  # newer than the combined snapshot: b read from its partition
    assert Catalog(store, PREFIX).current() == fold(cat.events())
    assert [s.state for s in Catalog(store, PREFIX).current() if s.run == "b"] == ["verified", "expired", "verified"]

    garbage = f"{PREFIX}/_catalog/_combined/{time.time_ns():020d}-{'e' * 32}.parquet"
    store.put_bytes(garbage, b"not parquet")
    fresh = Catalog(store, PREFIX)
    with caplog.at_level("WARNING", logger="ckptvault.catalog"):
        assert fresh.current() == fold(cat.events())
    assert garbage in caplog.text and garbage in fresh.unreadable
    fresh.compact(time.time())  # a new one, then the garbage set aside and the old one deleted
    keys = [o.key for o in store.list(f"{PREFIX}/_catalog/")]
    assert garbage not in keys and f"{PREFIX}/_catalog/unreadable/_combined/{garbage.rsplit('/', 1)[1]}" in keys
    assert [k for k in keys if "/_catalog/_combined/" in k] != combined
    assert len([k for k in keys if "/_catalog/_combined/" in k]) == 1
    counting = _Counting(store)
    assert Catalog(counting, PREFIX).current() == fold(cat.events()) and len(counting.got) == 1
