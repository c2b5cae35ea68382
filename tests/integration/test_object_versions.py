"""The store port's versions calls on every real server (SeaweedFS, Ceph RGW, moto), through S3Store:
what point-in-time reads and the tamper check read (docs/object-lock.md, "After an attack"). One key
written, overwritten and deleted without a version id in a bucket with Object Lock: the listing has
both versions and the delete marker, newest first, and the history module reads the first version as
current before the overwrite; a bucket that never had versioning says so."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.history.versions import ChangeKind, by_key, changes_since, current_at
from ckptvault.store import StoreError
from ckptvault.store.memory import MemoryStore
from tests.helpers import open_test_store
from tests.servers import S3Endpoint


def test_versions_deletes_and_overwrites_are_listed_and_read_as_they_were(
    any_s3: S3Endpoint, locked_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = locked_bucket(any_s3)
    store = open_test_store(tmp_path, any_s3, bucket, monkeypatch)
    client = any_s3.client()
    first = client.put_object(Bucket=bucket, Key="run/k.bin", Body=b"first", ContentMD5=_md5(b"first"))["VersionId"]
    client.put_object(Bucket=bucket, Key="run/other.bin", Body=b"kept", ContentMD5=_md5(b"kept"))
    time.sleep(1.1)  # the moment read at lies between the two writes, at the servers' one-second resolution
    moment = time.time()
    time.sleep(1.1)
    client.put_object(Bucket=bucket, Key="run/k.bin", Body=b"junk!", ContentMD5=_md5(b"junk!"))
    client.delete_object(Bucket=bucket, Key="run/k.bin")

    assert store.versioning() == "Enabled"
    listed = list(store.list_versions("run/"))
    assert [(v.key, v.delete_marker, v.latest) for v in listed] == [
        ("run/k.bin", True, True),
        ("run/k.bin", False, False),
        ("run/k.bin", False, False),
        ("run/other.bin", False, True),
    ]
    assert listed[2].version_id == first and listed[2].size == 5
    entries = by_key(listed)
    assert current_at(entries["run/k.bin"], moment).version_id == first  # type: ignore[union-attr]
    assert current_at(entries["run/k.bin"], time.time()) is None
    changes = changes_since(listed, moment)
    assert [(c.key, c.kind) for c in changes] == [("run/k.bin", ChangeKind.OVERWRITTEN)]


def test_a_point_in_time_view_reads_every_object_as_it_was_and_writes_nothing(
    any_s3: S3Endpoint, locked_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the port as the restore and the catalog read it: list, head, whole and ranged reads, a
    multi-range download; a key deleted since reads as it was, one overwritten since reads its old bytes,
    one created since is absent."""
    bucket = locked_bucket(any_s3)
    store = open_test_store(tmp_path, any_s3, bucket, monkeypatch)
    old = bytes(range(256)) * 4096  # 1 MiB: the download takes several ranges at the store's part size
    store.put_bytes("run/a.bin", old)
    store.put_bytes("run/b.bin", b"b as it was")
    time.sleep(1.1)
    moment = time.time()
    time.sleep(1.1)
    store.put_bytes("run/a.bin", b"junk" * 1000)
    store.delete("run/b.bin")
    store.put_bytes("run/c.bin", b"new since")

    view = store.as_of(moment)
    assert [(o.key, o.size) for o in view.list("run/")] == [("run/a.bin", len(old)), ("run/b.bin", 11)]
    assert view.head("run/c.bin") is None and view.head("run/b.bin").size == 11  # type: ignore[union-attr]
    assert view.get_bytes("run/b.bin") == b"b as it was"
    assert view.read_range("run/a.bin", 256, 4, size=len(old)) == bytes([0, 1, 2, 3])
    dest = tmp_path / "a.bin"
    view.download_file("run/a.bin", dest, size=len(old), crc32c=crc(old))
    assert dest.read_bytes() == old
    # a view asked for a key first (no listing yet) resolves it alone
    fresh = store.as_of(moment)
    assert fresh.get_bytes("run/b.bin") == b"b as it was"
    with pytest.raises(StoreError, match="only reads"):
        view.put_bytes("run/d.bin", b"x")
    with pytest.raises(StoreError, match="only reads"):
        view.delete("run/a.bin")
    assert store.get_bytes("run/a.bin") == b"junk" * 1000  # the store itself still reads what is current


def test_a_bucket_without_versioning_says_so(
    any_s3: S3Endpoint, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = bucket_factory(any_s3)
    store = open_test_store(tmp_path, any_s3, bucket, monkeypatch)
    any_s3.client().put_object(Bucket=bucket, Key="run/k.bin", Body=b"x")
    assert store.versioning() is None
    # the servers still answer the listing, each object once as its `null` version: why versioning() decides
    assert [(v.key, v.version_id, v.latest) for v in store.list_versions("run/")] == [("run/k.bin", "null", True)]


def test_the_memory_store_keeps_no_versions_and_lists_as_an_unversioned_bucket() -> None:
    store = MemoryStore("b")
    store.put_bytes("run/k.bin", b"x")
    assert store.versioning() is None
    assert [(v.key, v.version_id, v.latest, v.size) for v in store.list_versions("run/")] == [
        ("run/k.bin", "null", True, 1)
    ]
    with pytest.raises(StoreError, match="keeps no versions"):
        store.as_of(time.time())


def crc(data: bytes) -> str:
    return to_b64(crc32c_update(data))


def _md5(data: bytes) -> str:
    from ckptvault.store import object_lock

    return object_lock.content_md5(data)
