"""The replicate pass on two MemoryStores (ckptvault/replication; docs/FORMAT.md, "Replicas"): what is
copied, what a rerun keeps, what a corrupt primary object stops, and that the manifest goes last. The
opening of a replica's S3 store (profile, storage class) needs no server: nothing is sent."""

from __future__ import annotations

import json
import random
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from ckptvault.catalog import Catalog, CheckpointState, events
from ckptvault.checkpoint.manifest import MANIFEST_NAME, VALIDATION_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.replication import replicate
from ckptvault.store import StoreError, TransientStoreError, open_store
from ckptvault.store.memory import MemoryStore
from ckptvault.store.port import Retention, TransferConfig

MIB = 1024 * 1024
TRANSFER = TransferConfig(part_size=5 * MIB, multipart_threshold=5 * MIB, max_concurrency=2)
SRC = checkpoint_prefix("ck", "r1", 10)
DST = checkpoint_prefix("dr", "r1", 10)
REPLICA = ReplicaConfig(name="dr", bucket="replica", prefix="dr")
NO_LOCK = LockConfig()


def _primary() -> tuple[MemoryStore, Catalog, list[CheckpointState]]:
    """One committed save: a multipart-sized file, a small one, an empty one, and _VALIDATION.json."""
    primary = MemoryStore("primary", transfer=TRANSFER)
    rng = random.Random(1)
    files = []
    for name, size in (("model.bin", 11 * MIB + 5), ("config.json", 300), ("empty", 0)):
        data = rng.randbytes(size)
        primary.put_bytes(SRC + name, data)
        files.append(FileEntry(name, size, 1.0, to_b64(crc32c_update(data))))
    m = Manifest("r1", 10, "hf", tuple(files), 1.0, 2.0, "/hot/r1/step-10")
    primary.put_bytes(SRC + VALIDATION_NAME, b'{"ok": true}')
    primary.put_bytes(SRC + MANIFEST_NAME, m.to_json())
    catalog = Catalog(primary, "ck")
    catalog.append([events.verified(m)])
    return primary, catalog, catalog.current()


def _objects(store: MemoryStore, prefix: str) -> dict[str, bytes]:
    return {o.key[len(prefix) :]: store.get_bytes(o.key) for o in store.list(prefix)}


def test_copies_every_object_byte_for_byte_records_it_and_a_rerun_copies_nothing() -> None:
    primary, catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER)

    got = replicate(primary, "ck", replica, REPLICA, states, NO_LOCK, catalog=catalog)

    assert got.failed == {} and got.present == 0 and len(got.copied) == 1
    done = got.copied[0]
    assert (done.store, done.run, done.step, done.save, done.key) == ("dr", "r1", 10, 1, DST + MANIFEST_NAME)
    assert (done.copied, done.kept) == (5, 0)  # three files, _VALIDATION.json, the manifest
    assert _objects(replica, DST) == _objects(primary, SRC)
    assert replica.head(DST + "model.bin").parts == 3  # type: ignore[union-attr]  # streamed as multipart
    rules = [r for r in replica.get_lifecycle() if "AbortIncompleteMultipartUpload" in r]
    assert [r["AbortIncompleteMultipartUpload"] for r in rules] == [{"DaysAfterInitiation": 1}]  # a kill's uploads end
    ev = [e for e in catalog.events("r1") if e.event == "replicated"]
    assert len(ev) == 1 and (ev[0].bytes, ev[0].storage_class) == (0, "")
    detail = json.loads(ev[0].detail)
    assert (detail["store"], detail["key"], detail["bytes"]) == ("dr", DST + MANIFEST_NAME, done.bytes)
    (state,) = catalog.current("r1")
    assert state.state == "verified" and state.bytes == states[0].bytes  # the fold's size stays the primary's

    again = replicate(primary, "ck", replica, REPLICA, catalog.current(), NO_LOCK, catalog=catalog)
    assert (again.copied, again.present, again.failed) == ([], 1, {})
    assert len([e for e in catalog.events("r1") if e.event == "replicated"]) == 1


def test_a_failure_mid_save_commits_nothing_and_the_rerun_keeps_what_was_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    primary, catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER)
    real = primary.read_range

    def flaky(key: str, offset: int, length: int, *, size: int) -> bytes:
        if key.endswith("model.bin") and offset > 0:  # the primary drops the connection mid-object
            raise TransientStoreError(f"reading {key}: connection reset (injected)")
        return real(key, offset, length, size=size)

    monkeypatch.setattr(primary, "read_range", flaky)
    got = replicate(primary, "ck", replica, REPLICA, states, NO_LOCK, catalog=catalog)
    assert got.copied == [] and "connection reset" in got.failed["r1 step 10 save 1"]
    assert replica.head(DST + MANIFEST_NAME) is None and replica.head(DST + "model.bin") is None
    assert replica.head(DST + "config.json") is not None  # the other files of the save went
    assert list(replica.uploads.list("")) == []  # the broken upload was aborted
    assert not [e for e in catalog.events("r1") if e.event == "replicated"]

    monkeypatch.setattr(primary, "read_range", real)
    replica.uploads.create(DST + "model.bin")  # as a SIGKILLed pass leaves one: the rerun aborts it
    later = time.time() + 7 * 3600  # the rerun comes after the stale-upload age
    again = replicate(primary, "ck", replica, REPLICA, states, NO_LOCK, catalog=catalog, clock=lambda: later)
    (done,) = again.copied
    assert (done.copied, done.kept) == (3, 2)  # model.bin, _VALIDATION.json, the manifest; two files kept
    assert list(replica.uploads.list("")) == []
    assert _objects(replica, DST) == _objects(primary, SRC)


def test_a_corrupt_primary_object_aborts_its_copy_and_commits_nothing() -> None:
    primary, catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER)
    size = primary.head(SRC + "model.bin").size  # type: ignore[union-attr]
    primary.put_bytes(SRC + "model.bin", random.Random(9).randbytes(size))  # same size, other bytes (bit rot)

    got = replicate(primary, "ck", replica, REPLICA, states, NO_LOCK, catalog=catalog)
    why = got.failed["r1 step 10 save 1"]
    assert re.search(re.escape(f"primary/{SRC}model.bin") + r": its bytes' CRC32C is \S+, the manifest says", why)
    assert replica.head(DST + "model.bin") is None and replica.head(DST + MANIFEST_NAME) is None
    assert list(replica.uploads.list("")) == []
    assert not [e for e in catalog.events("r1") if e.event == "replicated"]


def test_the_manifest_is_written_last_and_byte_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    primary, _catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER)
    order: list[str] = []
    put, commit = replica.put_bytes, replica.commit

    def spy_put(key: str, data: bytes, **kw: Any) -> None:
        put(key, data, **kw)
        order.append(key)

    def spy_commit(key: str, *a: Any, **kw: Any) -> None:  # a completed multipart upload
        commit(key, *a, **kw)
        order.append(key)

    monkeypatch.setattr(replica, "put_bytes", spy_put)
    monkeypatch.setattr(replica, "commit", spy_commit)
    replicate(primary, "ck", replica, REPLICA, states, NO_LOCK)
    assert order[-1] == DST + MANIFEST_NAME and len(order) == 5
    assert replica.get_bytes(DST + MANIFEST_NAME) == primary.get_bytes(SRC + MANIFEST_NAME)


def test_a_replica_with_lock_writes_every_object_locked() -> None:
    primary, catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER, object_lock=True)
    got = replicate(primary, "ck", replica, REPLICA, states, LockConfig(mode="governance", days=7), catalog=catalog)
    (done,) = got.copied
    assert done.retain_until is not None
    for o in replica.list(DST):
        info = replica.head(o.key)
        assert info is not None
        if o.key == DST + VALIDATION_NAME:  # mutable, as on the primary (FORMAT.md, "Object Lock")
            assert info.retention is None
        else:
            assert info.retention is not None and info.retention.until_ts == done.retain_until
    (ev,) = [e for e in catalog.events("r1") if e.event == "replicated"]
    assert json.loads(ev.detail)["retain_until"] == done.retain_until
    assert catalog.current("r1")[0].locked_until is None  # the primary's lock state is not the replica's


def _fail_mid_model_bin(monkeypatch: pytest.MonkeyPatch, primary: MemoryStore) -> None:
    real = primary.read_range

    def flaky(key: str, offset: int, length: int, *, size: int) -> bytes:
        if key.endswith("model.bin") and offset > 0:  # the pass dies mid-object, as a kill would stop it
            raise TransientStoreError(f"reading {key}: connection reset (injected)")
        return real(key, offset, length, size=size)

    monkeypatch.setattr(primary, "read_range", flaky)


def _retention(store: MemoryStore, key: str) -> Retention | None:
    info = store.head(key)
    assert info is not None, key
    return info.retention


def test_the_rerun_raises_the_lock_of_what_a_killed_pass_copied_to_its_own_date(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    primary, catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER, object_lock=True)
    lock = LockConfig(mode="governance", days=7)
    first = time.time()
    _fail_mid_model_bin(monkeypatch, primary)
    got = replicate(primary, "ck", replica, REPLICA, states, lock, catalog=catalog, clock=lambda: first)
    assert got.copied == [] and replica.head(DST + MANIFEST_NAME) is None
    early = _retention(replica, DST + "config.json")
    assert early is not None  # the killed pass's objects carry its own date

    monkeypatch.undo()
    later = first + 3 * 86_400  # the rerun, three days on: its date is three days later
    (done,) = replicate(primary, "ck", replica, REPLICA, states, lock, catalog=catalog, clock=lambda: later).copied
    assert done.kept == 2 and done.retain_until is not None and done.retain_until > early.until_ts
    for name in ("config.json", "empty", "model.bin", MANIFEST_NAME):  # kept, kept, copied, the commit
        r = _retention(replica, DST + name)
        assert r is not None and (r.mode, r.until_ts) == ("GOVERNANCE", done.retain_until), name
    (ev,) = [e for e in catalog.events("r1") if e.event == "replicated"]
    assert json.loads(ev.detail)["retain_until"] == done.retain_until
    assert _objects(replica, DST) == _objects(primary, SRC)


def test_the_rerun_never_shortens_or_weakens_a_lock_it_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    primary, _catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER, object_lock=True)
    now = time.time()
    _fail_mid_model_bin(monkeypatch, primary)
    replicate(primary, "ck", replica, REPLICA, states, LockConfig(mode="compliance", days=7), clock=lambda: now)
    far = Retention("GOVERNANCE", datetime.fromtimestamp(now + 400 * 86_400, UTC))
    replica.extend_retention(DST + "empty", far)  # a later date, set by hand
    monkeypatch.undo()

    lock = LockConfig(mode="governance", days=7)
    (done,) = replicate(primary, "ck", replica, REPLICA, states, lock, clock=lambda: now + 86_400).copied
    assert done.retain_until is not None
    config = _retention(replica, DST + "config.json")  # COMPLIANCE stays COMPLIANCE, raised to the new date
    assert config is not None and (config.mode, config.until_ts) == ("COMPLIANCE", done.retain_until)
    empty = _retention(replica, DST + "empty")  # a later date than the rerun's is left as it is
    assert empty is not None and empty.until_ts == far.until_ts > done.retain_until


class _Killed(BaseException):
    """The process dies here (nothing catches it, as nothing catches a SIGKILL)."""


def test_a_save_committed_by_a_pass_killed_before_its_event_is_recorded_by_the_rerun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    primary, catalog, states = _primary()
    replica = MemoryStore("replica", transfer=TRANSFER, object_lock=True)
    lock = LockConfig(mode="governance", days=7)

    def killed(_events: Any) -> None:
        raise _Killed

    with monkeypatch.context() as m:
        m.setattr(catalog, "append", killed)  # the manifest is on the replica, the event never written
        with pytest.raises(_Killed):
            replicate(primary, "ck", replica, REPLICA, states, lock, catalog=catalog)
    assert replica.head(DST + MANIFEST_NAME) is not None
    assert not [e for e in catalog.events("r1") if e.event == "replicated"]

    again = replicate(primary, "ck", replica, REPLICA, states, lock, catalog=catalog)
    assert again.copied == [] and again.present == 1 and len(again.recorded) == 1
    (ev,) = [e for e in catalog.events("r1") if e.event == "replicated"]
    detail = json.loads(ev.detail)
    until = _retention(replica, DST + MANIFEST_NAME)
    assert until is not None and (detail["store"], detail["key"]) == ("dr", DST + MANIFEST_NAME)
    assert detail["retain_until"] == until.until_ts  # the killed pass's date, that its objects were raised to
    for o in replica.list(DST):
        r = _retention(replica, o.key)
        assert o.key == DST + VALIDATION_NAME or (r is not None and r.until_ts >= until.until_ts), o.key
    third = replicate(primary, "ck", replica, REPLICA, catalog.current(), lock, catalog=catalog)
    assert (third.present, third.recorded) == (1, [])  # recorded once
    assert len([e for e in catalog.events("r1") if e.event == "replicated"]) == 1
    other = REPLICA.model_copy(update={"name": "dr2"})  # another replica's event is not this one's

    def unwritable(_events: Any) -> None:
        raise StoreError("writing the catalog: connection reset (injected)")

    with monkeypatch.context() as m:  # the copy stands; the pass says it is not recorded, and fails
        m.setattr(catalog, "append", unwritable)
        failed = replicate(primary, "ck", replica, other, states, lock, catalog=catalog)
    assert failed.present == 1 and failed.recorded == []
    why = failed.failed["r1 step 10 save 1"]
    assert "copied by an earlier pass, but not recorded (the next run records it): writing the catalog" in why
    assert len(replicate(primary, "ck", replica, other, states, lock, catalog=catalog).recorded) == 1


def test_every_data_object_goes_in_the_replicas_storage_class_the_manifests_stay_readable() -> None:
    primary, catalog, states = _primary()
    deep = REPLICA.model_copy(update={"storage_class": "DEEP_ARCHIVE"})
    replica = MemoryStore.for_config(deep)
    got = replicate(primary, "ck", replica, deep, states, NO_LOCK, catalog=catalog)
    assert len(got.copied) == 1
    classes = {o.key[len(DST) :]: replica.head(o.key).storage_class for o in replica.list(DST)}  # type: ignore[union-attr]
    hot = {MANIFEST_NAME, VALIDATION_NAME}
    assert {c for k, c in classes.items() if k not in hot} == {"DEEP_ARCHIVE"}
    assert {c for k, c in classes.items() if k in hot} == {"STANDARD"}  # read without a thaw, as the primary's
    assert replica.get_bytes(DST + MANIFEST_NAME) == primary.get_bytes("ck/r1/step-0000000010/" + MANIFEST_NAME)
    (ev,) = [e for e in catalog.events("r1") if e.event == "replicated"]
    assert json.loads(ev.detail)["storage_class"] == "DEEP_ARCHIVE"
    assert catalog.current("r1")[0].storage_class == "STANDARD"  # the primary's class, as the fold keeps it


def test_opening_a_replica_store_honours_its_profile_and_storage_class() -> None:
    with pytest.raises(StoreError, match=r"replica dr: the credentials profile 'nope' does not exist.*named dr"):
        open_store(REPLICA.model_copy(update={"profile": "nope", "endpoint_url": "http://127.0.0.1:9"}))
    cold = open_store(REPLICA.model_copy(update={"storage_class": "COLD", "endpoint_url": "http://127.0.0.1:9"}))
    assert cold._put_args()["StorageClass"] == "COLD"
    assert "StorageClass" not in cold.writing_in(None)._put_args() and cold._put_args()["StorageClass"] == "COLD"
    assert cold.section == "[[replicas]] dr"
    assert (
        "StorageClass" not in open_store(REPLICA.model_copy(update={"endpoint_url": "http://127.0.0.1:9"}))._put_args()
    )
