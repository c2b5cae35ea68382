"""One conformance suite for the ObjectStore port: the S3 adapter against every real server
(SeaweedFS, Ceph RGW, moto) over HTTP with the real boto3 client, and the in-memory adapter
(ckptvault.store.memory). Fixtures `any_store` and `bucket_factory` come from tests/conftest.py.

Where servers differ, the test states what each one does (and the adapter's capability probe must
agree). Where a test is about something a server has and the memory store deliberately has not (a
missing bucket, credentials, S3's UploadPartCopy path), its memory branch asserts what the memory
store does instead. Nothing here replaces store code with a fake.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checksum import crc32c_combine, crc32c_update, file_crc32c, from_b64, to_b64
from ckptvault.config import StoreConfig
from ckptvault.errors import InvalidArgumentError
from ckptvault.store import (
    ABORT_MPU_RULE_NAME,
    CRC_TAG,
    ChecksumMismatchError,
    NotFoundError,
    ObjectFrozenError,
    ObjectStore,
    PreconditionFailedError,
    S3Store,
    StoreError,
    UploadResult,
)
from ckptvault.store.lifecycle import rule_id, rule_prefix
from ckptvault.store.limits import DELETE_BATCH
from ckptvault.store.memory import MemoryStore
from ckptvault.store.upload import copy_in_place
from ckptvault.tiering.apply import install_lifecycle, lifecycle_rules
from tests.helpers import crc32c_b64
from tests.integration.store_backends import Backend, server_store
from tests.servers import S3Endpoint

MIB = 1024 * 1024

EXPECTED_CAPS = {
    # kind: (checksums_validated, conditional_writes, restore_object, full_object_checksums, transitions)
    "seaweedfs": (True, True, False, True, False),
    "ceph": (False, True, False, False, True),
    "moto": (False, True, True, False, True),
    # validates part and whole-object CRC32Cs; keeps lifecycle rules but runs none (no clock ages objects)
    "memory": (True, True, True, True, False),
}


@pytest.fixture
def backend(
    any_store: S3Endpoint | None, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch
) -> Backend:
    return Backend(any_store.kind if any_store else "memory", any_store, bucket_factory, monkeypatch)


@pytest.fixture
def store(backend: Backend) -> Any:
    return backend.store()


def _blocks(path: Path) -> tuple[int, ...]:
    """The file's 4 MiB block CRC32Cs computed here, independently of the upload's hashing; () for a
    file of at most 8 MiB, which gets none (docs/FORMAT.md, "Block checksums")."""
    data = path.read_bytes()
    if len(data) <= 8 * MIB:
        return ()
    return tuple(crc32c_update(data[i : i + 4 * MIB]) for i in range(0, len(data), 4 * MIB))


def _file(tmp_path: Path, size: int, name: str = "data.bin", seed: int = 7) -> Path:
    p = tmp_path / name
    p.write_bytes(random.Random(seed).randbytes(size))
    return p


# -- the conformance suite ------------------------------------------------------------------------


def test_capabilities_as_measured(store: ObjectStore, backend: Backend) -> None:
    caps = store.capabilities()
    assert caps.kind == backend.kind
    got = (
        caps.checksums_validated,
        caps.conditional_writes,
        caps.restore_object,
        caps.full_object_checksums,
        caps.lifecycle_transitions,
    )
    assert got == EXPECTED_CAPS[backend.kind]
    assert not caps.integrity_header  # no default retention here: no write pays a Content-MD5
    assert store.capabilities() is caps  # probed once per store
    assert list(store.list("_ckptvault_probe/")) == []  # probe objects cleaned up


@pytest.mark.parametrize(
    "size",
    [0, 1234, 5 * MIB, 5 * MIB + 1, 12 * MIB + 4321],
    ids=["empty", "small", "one-part", "part-plus-1", "three-parts"],
)
def test_upload_download_round_trip(store: ObjectStore, backend: Backend, tmp_path: Path, size: int) -> None:
    src = _file(tmp_path, size)
    tags = {"run": "r 1/α", "step": "100", "format": "hf"}
    seen: list[int] = []
    res = store.upload_file(src, "ck/run/step-1/model.bin", tags=tags, sha256=True, progress=seen.append)

    assert res.crc32c == crc32c_b64(src)  # independent computation over the file
    assert res.blocks == _blocks(src)  # from the same read pass, parts of 5 MiB across blocks of 4
    assert res.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert res.size == size and sum(seen) == size
    multipart = size > 5 * MIB
    assert res.parts == (-(-size // (5 * MIB)) if multipart else 0)
    assert res.server_verified == store.capabilities().checksums_validated

    info = store.head(res.key)
    assert info is not None and info.size == size and info.storage_class == "STANDARD"
    assert info.parts == res.parts
    if not multipart:
        assert info.metadata["crc32c"] == res.crc32c
    if multipart and backend.kind in ("seaweedfs", "memory"):
        assert info.crc32c == res.crc32c  # server-checked FULL_OBJECT checksum
    if info.crc32c is not None:
        assert info.crc32c == res.crc32c
    assert store.get_tags(res.key) == _tagged(tags, res)

    assert store.read_crc32c(res.key) == res.crc32c  # read back: what a rerun does without a recorded CRC32C

    dest = tmp_path / "out.bin"
    got: list[int] = []
    store.download_file(res.key, dest, size=size, crc32c=res.crc32c, progress=got.append)
    assert dest.read_bytes() == src.read_bytes()
    assert sum(got) == size


def _tagged(tags: dict[str, str], res: UploadResult) -> dict[str, str]:
    """The tags an upload leaves: the caller's, and on a multipart object the server keeps no CRC32C
    of (Ceph RGW 16.2) CRC_TAG, the CRC32C of its bytes, by which a rerun recognises it."""
    return tags | ({CRC_TAG: res.crc32c} if res.parts and not res.server_verified else {})


def test_download_detects_changed_bytes(store: ObjectStore, backend: Backend, tmp_path: Path) -> None:
    src = _file(tmp_path, 6 * MIB + 99)
    res = store.upload_file(src, "ck/corrupt.bin")
    # Same size, different bytes, written behind the adapter's back (the raw client on a server).
    backend.overwrite(store, res.key, random.Random(99).randbytes(res.size))
    dest = tmp_path / "out.bin"
    with pytest.raises(ChecksumMismatchError) as err:
        store.download_file(res.key, dest, size=res.size, crc32c=res.crc32c)
    msg = str(err.value)
    assert res.key in msg and res.crc32c in msg and "expected" in msg
    assert not dest.exists()  # no corrupt file left behind looking whole

    backend.overwrite(store, res.key, b"short")
    with pytest.raises(ChecksumMismatchError, match="bytes"):
        store.download_file(res.key, dest, size=res.size, crc32c=res.crc32c)


def test_split_upload_ranges_in_any_order_complete_once(store: ObjectStore, backend: Backend, tmp_path: Path) -> None:
    # 3 parts of 5 MiB and a short 4th, sent by two "tasks" (ranges of parts), the later range first:
    # the object is the file, its CRC32C combined from the parts' in order, the tags on it
    size = 15 * MIB + 4321
    src = _file(tmp_path, size, seed=11)
    st = src.stat()
    tags = {"run": "r 1/α", "step": "100"}
    up = store.begin_upload(src, "ck/split.bin", size=size, mtime=st.st_mtime, tags=tags)
    assert (up.parts, up.part_size) == (4, 5 * MIB)
    seen: list[int] = []
    later = store.upload_parts(up, 3, 2, progress=seen.append)
    store.upload_parts(up, 1, 2)
    earlier = store.upload_parts(up, 1, 2)  # a range run again (a retry, a lost worker's) replaces its parts
    assert [p.number for p in earlier + later] == [1, 2, 3, 4] and sum(seen) == size - 10 * MIB
    assert store.head("ck/split.bin") is None  # nothing readable before completion
    res = store.complete_upload(up, later + earlier)
    assert res.crc32c == crc32c_b64(src) and (res.size, res.parts) == (size, 4)
    # each range hashed the block pieces it read (its parts start inside blocks); joined at completion
    assert len(res.blocks) == 4 and res.blocks == _blocks(src)
    assert res.server_verified == store.capabilities().checksums_validated
    info = store.head("ck/split.bin")
    assert info is not None and info.size == size and info.parts == 4
    if backend.kind in ("seaweedfs", "memory"):
        assert info.crc32c == res.crc32c  # the combined CRC32C, checked by the server as FULL_OBJECT
    assert store.get_tags("ck/split.bin") == _tagged(tags, res)
    dest = tmp_path / "out.bin"
    store.download_file("ck/split.bin", dest, size=size, crc32c=res.crc32c)
    assert dest.read_bytes() == src.read_bytes()
    assert backend.incomplete_uploads(store, "ck/") == []


def test_split_upload_refuses_parts_of_two_files_renamed_over_each_other(
    store: ObjectStore, backend: Backend, tmp_path: Path
) -> None:
    # same size, same mtime, other bytes, renamed over the file between two ranges (cp -p, rsync -t):
    # size and mtime cannot tell, the file each range read can
    src = _file(tmp_path, 12 * MIB, seed=13)
    st = src.stat()
    up = store.begin_upload(src, "ck/mixed.bin", size=st.st_size, mtime=st.st_mtime)
    first = store.upload_parts(up, 1, 1)
    other = _file(tmp_path, 12 * MIB, name="other.bin", seed=14)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    other.rename(src)
    rest = store.upload_parts(up, 2, 2)
    with pytest.raises(StoreError, match="replaced or rewritten between two of its ranges"):
        store.complete_upload(up, first + rest)
    assert store.head("ck/mixed.bin") is None and backend.incomplete_uploads(store, "ck/") == []


def test_split_upload_refuses_a_changed_file_and_an_incomplete_set(
    store: ObjectStore, backend: Backend, tmp_path: Path
) -> None:
    src = _file(tmp_path, 12 * MIB, seed=12)
    st = src.stat()
    up = store.begin_upload(src, "ck/torn.bin", size=st.st_size, mtime=st.st_mtime)
    first = store.upload_parts(up, 1, 1)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # written again since it was listed
    with pytest.raises(StoreError, match="changed since it was listed"):
        store.upload_parts(up, 2, 2)
    with pytest.raises(StoreError, match=r"parts absent \[2, 3\]"):
        store.complete_upload(up, first)
    assert backend.incomplete_uploads(store, "ck/") == []  # a failed completion aborts the upload
    assert store.head("ck/torn.bin") is None
    with pytest.raises(StoreError, match=r"not in 1\.\.3"):
        store.upload_parts(up, 3, 2)


def test_download_range_writes_its_span_in_place_and_the_ranges_crcs_combine(
    store: ObjectStore, backend: Backend, tmp_path: Path
) -> None:
    """One range of a split restore: written at its offset into a file made by the caller (never
    truncated, nothing outside the span touched), its CRC32C combining with the others' into the
    whole object's, so the caller detects a changed object from the ranges alone."""
    size, part = 12 * MIB, 5 * MIB
    src = _file(tmp_path, size)
    data = src.read_bytes()
    res = store.upload_file(src, "ck/split.bin")
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"\xaa" * size)  # made at its full size by the caller, as ranged.allocate does
    seen: list[int] = []
    tail = store.download_range(res.key, dest, offset=part, length=size - part, size=size, progress=seen.append)
    assert (tail.key, tail.offset, tail.length) == (res.key, part, size - part)
    assert tail.crc32c == to_b64(crc32c_update(data[part:]))  # two GETs (5 + 2 MiB), one CRC
    got = dest.read_bytes()
    assert got[part:] == data[part:] and got[:part] == b"\xaa" * part  # only its own span written
    assert sum(seen) == size - part
    head = store.download_range(res.key, dest, offset=0, length=part, size=size)
    assert dest.read_bytes() == data and head.etag == tail.etag
    combined = crc32c_combine(from_b64(head.crc32c), from_b64(tail.crc32c), tail.length)
    assert to_b64(combined) == res.crc32c

    # Same size, different bytes behind the adapter's back: each range reads fine, but the combined
    # CRC32C is wrong, and the new ETag tells a caller the ranges came from two versions.
    backend.overwrite(store, res.key, random.Random(99).randbytes(size))
    again = store.download_range(res.key, dest, offset=part, length=size - part, size=size)
    assert again.etag != head.etag
    assert to_b64(crc32c_combine(from_b64(head.crc32c), from_b64(again.crc32c), again.length)) != res.crc32c
    backend.overwrite(store, res.key, b"short")
    with pytest.raises(ChecksumMismatchError, match="bytes"):
        store.download_range(res.key, dest, offset=0, length=part, size=size)
    with pytest.raises(InvalidArgumentError, match="not a non-empty range"):
        store.download_range(res.key, dest, offset=part, length=size, size=size)
    with pytest.raises(FileNotFoundError):  # never created: the caller makes the file
        store.download_range(res.key, tmp_path / "absent.bin", offset=0, length=5, size=5)
    assert not (tmp_path / "absent.bin").exists()


def test_small_objects_and_conditional_write(store: ObjectStore) -> None:
    key = "ck/run/step-1/_MANIFEST.json"
    store.put_bytes(key, b'{"v": 1}', if_none_match=True, content_type="application/json")
    with pytest.raises(PreconditionFailedError, match=key):
        store.put_bytes(key, b'{"v": 2}', if_none_match=True)
    assert store.get_bytes(key) == b'{"v": 1}'
    store.put_bytes(key, b'{"v": 3}')  # unconditional overwrite is allowed
    assert store.get_bytes(key) == b'{"v": 3}'
    with pytest.raises(NotFoundError, match="nothing-here"):
        store.get_bytes("ck/nothing-here")
    with pytest.raises(NotFoundError, match="nothing-here"):
        store.read_crc32c("ck/nothing-here")
    assert store.head("ck/nothing-here") is None

    store.put_bytes("ck/a", b"1")
    store.put_bytes("ck/b/c", b"2")
    assert [o.key for o in store.list("ck/")] == ["ck/a", "ck/b/c", key]
    store.delete("ck/a")
    store.delete("ck/a")  # absent is fine
    assert [o.key for o in store.list("ck/")] == ["ck/b/c", key]


def test_delete_many_deletes_in_batches_and_absent_keys_are_no_error(store: ObjectStore) -> None:
    # more than one DeleteObjects request's worth (DELETE_BATCH): a store that sent them in one
    # request would be refused (S3 allows 1,000 keys)
    keys = [f"dm/{i:05d}" for i in range(DELETE_BATCH + 5)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.put_bytes(k, b"x"), [*keys, "dm-kept"]))
    assert store.delete_many([*keys, "dm/absent"]) == {}
    assert [o.key for o in store.list("dm")] == ["dm-kept"]
    assert store.delete_many([]) == {}
    assert store.delete_many(keys[:3]) == {}  # already gone: still no error
    assert store.get_bytes("dm-kept") == b"x"


def test_failed_multipart_upload_is_aborted(store: ObjectStore, backend: Backend, tmp_path: Path) -> None:
    src = _file(tmp_path, 12 * MIB)

    def boom(_: int) -> None:
        raise RuntimeError("injected failure after a part")

    with pytest.raises(RuntimeError, match="injected"):
        store.upload_file(src, "ck/aborted.bin", progress=boom)
    assert backend.incomplete_uploads(store, "ck/") == []
    assert store.head("ck/aborted.bin") is None


def test_copy_from_streams_another_stores_object_checked_before_completion(
    store: ObjectStore, backend: Backend, tmp_path: Path
) -> None:
    # The replica's copy (docs/FORMAT.md, "Replicas"): the source here is the same backend, so its
    # read_range is exercised on the server too. One multipart object (three parts) and one small one.
    big = store.upload_file(_file(tmp_path, 2 * store.transfer.part_size + 77), "src/big.bin")
    small = store.upload_file(_file(tmp_path, 1000, "small.bin", seed=3), "src/small.bin")
    assert store.read_range(big.key, 5, 10, size=big.size) == _file(tmp_path, big.size).read_bytes()[5:15]
    with pytest.raises(ChecksumMismatchError, match=re.escape("src/big.bin")):
        store.read_range(big.key, 0, 10, size=big.size + 1)  # not the object the caller expects

    for res, parts in ((big, 3), (small, 0)):
        dst = "dst/" + res.key.rpartition("/")[2]
        got = store.copy_from(store, res.key, dst, size=res.size, crc32c=res.crc32c, tags={"k": "v"})
        assert (got.size, got.crc32c, got.parts) == (res.size, res.crc32c, parts)
        info = store.head(dst)
        assert info is not None and info.size == res.size and info.parts == parts
        assert store.read_crc32c(dst) == res.crc32c
        assert store.get_tags(dst) == _tagged({"k": "v"}, got)

    # A source whose bytes are not the expected ones: aborted before completion, nothing written
    bad = "AAAAAA=="
    for res in (big, small):
        with pytest.raises(ChecksumMismatchError, match=re.escape(res.key)):
            store.copy_from(store, res.key, "dst/bad.bin", size=res.size, crc32c=bad)
    assert store.head("dst/bad.bin") is None
    assert backend.incomplete_uploads(store, "dst/") == []


def test_abort_stale_uploads_and_lifecycle_rule_merge(store: ObjectStore, backend: Backend) -> None:
    backend.start_upload(store, "ck/stale.bin")
    if backend.kind != "moto":  # moto reports every upload as initiated on 2010-11-10
        assert store.abort_multipart_uploads("ck/", older_than=time.time() - 3600) == 0  # too young
    assert store.abort_multipart_uploads("ck/") == 1
    assert backend.incomplete_uploads(store, "") == []

    theirs = {"ID": "users-own", "Status": "Enabled", "Filter": {"Prefix": "tmp/"}, "Expiration": {"Days": 7}}
    store.put_lifecycle([theirs])
    assert store.ensure_abort_incomplete_mpu_rule(days=1) is True
    assert store.ensure_abort_incomplete_mpu_rule(days=1) is False  # idempotent
    rules = {r["ID"]: r for r in store.get_lifecycle()}
    ours = rule_id(ABORT_MPU_RULE_NAME, "")
    assert set(rules) == {"users-own", ours}  # merged, not overwritten
    assert rules[ours]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    store.put_lifecycle([])
    assert store.get_lifecycle() == []


def test_stores_under_different_prefixes_of_one_bucket_keep_their_own_rules(backend: Backend) -> None:
    bucket = backend.bucket()
    prod, dev = (backend.store(bucket, prefix=p) for p in ("prod", "dev"))
    # A rule an older version wrote for prod under the plain ID, and one it wrote for another prefix.
    plain = rule_id(ABORT_MPU_RULE_NAME, "")
    old = {"Status": "Enabled", "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 3}}
    prod.put_lifecycle([{"ID": plain, "Filter": {"Prefix": "prod/"}, **old}])
    assert prod.ensure_abort_incomplete_mpu_rule(days=1) is True
    assert dev.ensure_abort_incomplete_mpu_rule(days=1) is True
    assert prod.ensure_abort_incomplete_mpu_rule(days=1) is False  # dev's rule did not displace prod's
    assert dev.ensure_abort_incomplete_mpu_rule(days=1) is False
    covered = {r["ID"]: rule_prefix(r) for r in prod.get_lifecycle()}
    assert covered == {rule_id(ABORT_MPU_RULE_NAME, "prod"): "prod/", rule_id(ABORT_MPU_RULE_NAME, "dev"): "dev/"}
    if backend.kind == "seaweedfs":
        return  # no transition rules there (PutBucketLifecycleConfiguration with tags: NotImplemented)
    # tier rules too: dev's server-mode rules leave prod's in place
    install_lifecycle(prod, lifecycle_rules("prod", {"cold": "GLACIER"}, ["cold"]))
    install_lifecycle(dev, lifecycle_rules("dev", {"cold": "GLACIER"}, ["cold"]))
    ids = {r["ID"] for r in dev.get_lifecycle()}
    assert {"ckptvault-tier-cold-prod", "ckptvault-tier-cold-dev"} <= ids, ids
    assert len(ids) == 4, ids


def test_copy_storage_class_and_restore(store: ObjectStore, backend: Backend, tmp_path: Path) -> None:
    src = _file(tmp_path, 1500)
    tags = {"run": "r1", "step": "5"}
    res = store.upload_file(src, "ck/cold.bin", tags=tags)
    assert store.restore_object(res.key, 1, "Standard") == "not_needed"
    target = {"ceph": "COLD", "moto": "GLACIER", "seaweedfs": "STANDARD_IA", "memory": "GLACIER"}[backend.kind]
    store.copy_storage_class(res.key, target, res.size)
    store.copy_storage_class(res.key, target, res.size)  # already there: a no-op, not an error

    info = store.head(res.key)
    assert info is not None and info.storage_class == target
    assert info.metadata.get("crc32c") == res.crc32c  # metadata kept
    if backend.kind != "moto":  # moto refuses GetObjectTagging on a GLACIER object (AWS allows it)
        assert store.get_tags(res.key) == tags  # tags kept
    dest = tmp_path / "out.bin"
    if target != "GLACIER":
        assert not info.frozen
        store.download_file(res.key, dest, size=res.size, crc32c=res.crc32c)
        assert dest.read_bytes() == src.read_bytes()
        return

    assert info.frozen
    with pytest.raises(ObjectFrozenError) as err:
        store.download_file(res.key, dest, size=res.size, crc32c=res.crc32c)
    assert res.key in str(err.value) and "RestoreObject" in str(err.value)
    assert store.restore_object(res.key, 1, "Expedited") in ("requested", "restored")
    deadline = time.time() + 30
    while (info := store.head(res.key)) is not None and info.frozen and time.time() < deadline:
        time.sleep(0.5)
    assert info is not None and not info.frozen
    assert store.restore_object(res.key, 1, "Expedited") == "restored"
    assert store.get_tags(res.key) == tags
    store.download_file(res.key, dest, size=res.size, crc32c=res.crc32c)
    assert dest.read_bytes() == src.read_bytes()


def test_multipart_copy_keeps_metadata_and_tags(store: Any, backend: Backend, tmp_path: Path) -> None:
    # The >5 GiB path (UploadPartCopy) exercised on a small object by lowering the single-copy limit.
    src = _file(tmp_path, 7 * MIB + 5)
    res = store.upload_file(src, "ck/big.bin", tags={"run": "r2"})
    target = "COLD" if backend.kind == "ceph" else "STANDARD_IA"
    if backend.kind == "memory":
        # No 5 GiB CopyObject limit in memory, so no UploadPartCopy path: one in-place copy at any
        # size, whose ETag, like a CopyObject's, no longer says how many parts were uploaded.
        assert res.parts == 2
        store.copy_storage_class(res.key, target, res.size)
        copied = store.head(res.key)
        assert copied is not None and copied.parts == 0
    else:
        assert copy_in_place(store.client, store.bucket, res.key, target, {}, store.transfer, single_limit=0)
    info = store.head(res.key)
    assert info is not None and info.storage_class == target and info.size == res.size
    assert store.get_tags(res.key) == _tagged({"run": "r2"}, res)
    dest = tmp_path / "out.bin"
    store.download_file(res.key, dest, size=res.size, crc32c=res.crc32c)
    assert file_crc32c(dest) == res.crc32c


def test_missing_bucket_message(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend.endpoint is None:
        # A MemoryStore is its bucket: there is no bucket to be missing, and check_bucket says so by
        # passing on a store nothing was ever written to.
        empty = MemoryStore("ckptvault-no-such-bucket")
        empty.check_bucket()
        assert list(empty.list("")) == []
        return
    store = server_store(backend.endpoint, "ckptvault-no-such-bucket", monkeypatch)
    with pytest.raises(NotFoundError) as err:
        store.check_bucket()
    msg = str(err.value)
    assert "bucket ckptvault-no-such-bucket does not exist at" in msg and backend.endpoint.url in msg
    assert "aws s3 mb s3://ckptvault-no-such-bucket" in msg and "[store].bucket" in msg


def test_wrong_credentials_message(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend.kind == "moto":
        pytest.skip("moto accepts any credentials")
    store = backend.store()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-0123456789")
    if backend.endpoint is None:
        # No credentials in memory: whatever the environment holds, the store is reachable.
        store.check_bucket()
        store.put_bytes("ck/still-writable", b"1")
        assert store.get_bytes("ck/still-writable") == b"1"
        return
    with pytest.raises(StoreError) as err:
        store.check_bucket()
    msg = str(err.value)
    assert "AWS_ACCESS_KEY_ID" in msg and "denied" in msg
    assert "not-the-secret-0123456789" not in msg and backend.endpoint.secret_key not in msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)  # a watchdog against a hang, not a timing assertion
def test_endpoint_down_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead endpoint is reported after at most three tries: check_bucket's own client (attempts=2,
    which botocore counts as retries after the first), not the data client's six with backoff. That
    bound holds however slow the machine; bench/micro.py endpoint-down measures how fast it is."""
    from ckptvault.store import s3_client

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-that-must-not-leak")
    url = f"http://127.0.0.1:{_free_port()}"
    attempts: list[str] = []
    real_make_client = s3_client.make_client

    def counting_client(*args: Any, **kwargs: Any) -> Any:
        client = real_make_client(*args, **kwargs)
        # before-send fires once per HTTP attempt, retries included, before the connection is tried
        client.meta.events.register("before-send.s3", lambda request, **_: attempts.append(request.url))
        return client

    monkeypatch.setattr(s3_client, "make_client", counting_client)
    store = S3Store(StoreConfig(bucket="anything", endpoint_url=url))
    with pytest.raises(StoreError) as err:
        store.check_bucket()
    assert 1 <= len(attempts) <= 3, attempts  # fails fast, no long retry ladder
    assert all(a.startswith(url) for a in attempts), attempts
    msg = str(err.value)
    assert f"cannot reach the object store at {url} (connection refused)" in msg
    assert "Is the server running? Check [store].endpoint_url" in msg
    assert "secret-that-must-not-leak" not in msg


def test_store_module_boundaries() -> None:
    # Only ckptvault/store may import boto3/botocore; checksum.py must not. Read as imports (ast), so a
    # config description saying "from boto3's credential chain" is not taken for one.
    import ast

    def imports_aws(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] in ("boto3", "botocore") for n in names):
                return True
        return False

    root = Path(__file__).resolve().parents[2] / "ckptvault"
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "store" not in p.relative_to(root).parts and imports_aws(p)
    ]
    assert offenders == []


def test_concurrent_uploads_share_one_buffer_budget(backend: Backend, tmp_path: Path) -> None:
    """Four multipart files at once, 2 parts each in flight, under a budget of 3 parts: the process
    never holds more than the budget, and every file still arrives whole."""
    from ckptvault.store.buffers import shared

    # 17 MiB holds three 5 MiB parts, not four. Not 15: the pools are per process and per budget, and 15 is
    # the default of part_size_mb 5 x (max_concurrency 2 + 1), which a pytest-xdist worker's other tests
    # share; one of their uploads still running when this test starts would show in in_use here.
    budget_mb = 17
    store = backend.store(buffer_mb=budget_mb)
    pool = shared(budget_mb * MIB)
    srcs = [_file(tmp_path, 11 * MIB + i * 977, name=f"f{i}.bin", seed=i) for i in range(4)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda p: store.upload_file(p, f"budget/{p.name}"), srcs))
    assert pool.peak <= budget_mb * MIB, f"part buffers peaked at {pool.peak / MIB:.0f} MiB"
    assert pool.peak >= 2 * 5 * MIB, "the uploads never overlapped; the test proves nothing"
    assert pool.in_use == 0
    for src, res in zip(srcs, results, strict=True):
        assert res.crc32c == crc32c_b64(src) and res.parts == 3
        dest = tmp_path / f"back-{src.name}"
        store.download_file(res.key, dest, size=res.size, crc32c=res.crc32c)
        assert dest.read_bytes() == src.read_bytes()
