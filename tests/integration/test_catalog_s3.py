"""The catalog against a real S3 server (SeaweedFS) through the real S3Store: append, read, compaction
under concurrent appends, and rebuilding from the manifests in the bucket."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from ckptvault.catalog import Catalog, Event
from ckptvault.config import StoreConfig
from ckptvault.manifest import FileEntry, Manifest, checkpoint_prefix
from ckptvault.store import ObjectStore, open_store

PREFIX = "vault"
KEY_RE = re.compile(r"^vault/_catalog/events/\d{20}-[0-9a-f]{32}\.parquet$")


@pytest.fixture
def store(seaweedfs: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    cfg = StoreConfig(bucket=bucket_factory(seaweedfs), endpoint_url=seaweedfs.url, region=seaweedfs.region)
    return open_store(cfg)


def _catalog_keys(store: ObjectStore) -> list[str]:
    return [o.key for o in store.list(f"{PREFIX}/_catalog/")]


def test_append_then_read_back_in_time_order(store: ObjectStore) -> None:
    cat = Catalog(store, PREFIX)
    assert cat.append([]) is None and _catalog_keys(store) == []
    k1 = cat.append([Event("r", 1, "uploaded", 10.0, bytes=5, files=1), Event("r", 1, "verified", 30.0)])
    k2 = cat.append([Event("r", 1, "transitioned", 20.0, storage_class="GLACIER"), Event("q", 2, "verified", 5.0)])
    assert k1 is not None and k2 is not None and KEY_RE.match(k1) and KEY_RE.match(k2)
    assert sorted(_catalog_keys(store)) == sorted([k1, k2])
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
    assert len(_catalog_keys(store)) == 1 and cat.events() == after


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
    assert cat.events() == expected and len(_catalog_keys(store)) == 1


def test_compaction_leaves_newer_files_alone(store: ObjectStore) -> None:
    cat = Catalog(store, PREFIX)
    cat.append([Event("r", 1, "verified", 1.0)])
    cutoff = time.time()
    time.sleep(0.01)
    newer = cat.append([Event("r", 2, "verified", 2.0)])
    assert cat.compact(older_than=cutoff) == 0  # a single old file: nothing to merge
    assert newer in _catalog_keys(store) and len(_catalog_keys(store)) == 2


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
