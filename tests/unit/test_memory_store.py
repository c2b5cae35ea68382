"""The in-memory ObjectStore's own contracts, beyond the conformance suite it shares with the real
servers (tests/integration/test_store_conformance.py): restore timing and expiry on a clock,
paginated listings, atomic conditional creates under threads, S3's multipart rules and limits."""

from __future__ import annotations

import pickle
import random
import threading
from pathlib import Path

import pytest

from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.store import (
    ChecksumMismatchError,
    NotFoundError,
    ObjectFrozenError,
    ObjectStore,
    PreconditionFailedError,
    StoreError,
)
from ckptvault.store.memory import MemoryStore

MIB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_it_is_an_object_store() -> None:
    store: ObjectStore = MemoryStore("b")  # mypy holds it to the port's Protocol
    assert store.kind() == "memory" and store.capabilities().conditional_writes


def test_an_archived_object_thaws_after_the_restore_time_and_freezes_again_when_the_copy_expires() -> None:
    clock = Clock()
    store = MemoryStore("b", restore_seconds=3600, clock=clock)
    store.put_bytes("k", b"cold bytes")
    store.copy_storage_class("k", "DEEP_ARCHIVE", 10)
    with pytest.raises(ObjectFrozenError, match="memory://b/k"):
        store.get_bytes("k")
    assert store.restore_object("k", 2, "Bulk") == "requested"
    assert store.restore_object("k", 2, "Bulk") == "in_progress"
    info = store.head("k")
    assert info is not None and info.frozen and info.restore == 'ongoing-request="true"'

    clock.now += 3600
    info = store.head("k")
    assert info is not None and not info.frozen and 'ongoing-request="false"' in (info.restore or "")
    assert store.get_bytes("k") == b"cold bytes"
    assert store.restore_object("k", 2, "Bulk") == "restored"  # extends the copy: 2 days from now

    clock.now += 2 * 86400
    info = store.head("k")
    assert info is not None and info.frozen and info.restore is None
    with pytest.raises(ObjectFrozenError):
        store.get_bytes("k")
    assert store.restore_object("k", 1, "Expedited") == "requested"


def test_restore_refuses_what_s3_refuses() -> None:
    store = MemoryStore("b")
    with pytest.raises(NotFoundError, match="memory://b/absent"):
        store.restore_object("absent", 1, "Standard")
    store.put_bytes("k", b"x")
    with pytest.raises(StoreError, match="tier"):
        store.restore_object("k", 1, "Instant")
    with pytest.raises(StoreError, match="InvalidStorageClass"):
        store.copy_storage_class("k", "COLD", 1)
    assert MemoryStore("c", storage_classes={"COLD"}).storage_classes >= {"COLD", "STANDARD"}


def test_listing_pages_in_key_order_and_sees_keys_written_after_its_cursor() -> None:
    store = MemoryStore("b", page_size=2)
    for k in ["p/c", "p/a", "q/z", "p/b", "o/x"]:
        store.put_bytes(k, k.encode())
    listing = store.list("p/")
    assert next(listing).key == "p/a"
    store.put_bytes("p/d", b"late")  # after the cursor: a paginated listing reaches it
    store.put_bytes("p/0", b"early")  # before it: not seen, as with ListObjectsV2
    assert [o.key for o in listing] == ["p/b", "p/c", "p/d"]
    assert [o.key for o in store.list("")] == ["o/x", "p/0", "p/a", "p/b", "p/c", "p/d", "q/z"]
    assert all(o.metadata == {} for o in store.list(""))  # as the port says: only head() fills it


def test_one_conditional_create_wins_among_threads_and_a_retried_identical_write_is_no_conflict() -> None:
    store = MemoryStore("b")
    won: list[int] = []
    lost: list[int] = []
    start = threading.Barrier(8)

    def commit(i: int) -> None:
        start.wait()
        try:
            store.put_bytes("m/_MANIFEST.json", f'{{"writer": {i}}}'.encode(), if_none_match=True)
            won.append(i)
        except PreconditionFailedError:
            lost.append(i)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 7
    winner = f'{{"writer": {won[0]}}}'.encode()
    assert store.get_bytes("m/_MANIFEST.json") == winner
    store.put_bytes("m/_MANIFEST.json", winner, if_none_match=True)  # the same bytes again: the port's retry rule


def test_multipart_rules_part_crc_minimum_size_listed_parts_and_the_full_object_checksum() -> None:
    store = MemoryStore("b")
    small, big = b"s" * 1000, random.Random(3).randbytes(5 * MIB)
    up = store.uploads.create("k", tags={"run": "r"})
    with pytest.raises(ChecksumMismatchError, match="BadDigest"):
        store.uploads.upload_part("k", up, 1, big, to_b64(crc32c_update(small)))
    first = store.uploads.upload_part("k", up, 1, small, to_b64(crc32c_update(small)))
    last = store.uploads.upload_part("k", up, 2, big)
    with pytest.raises(StoreError, match="EntityTooSmall"):
        store.uploads.complete("k", up, [(1, first), (2, last)])
    first = store.uploads.upload_part("k", up, 1, big)  # replaces part 1
    with pytest.raises(StoreError, match="InvalidPart"):
        store.uploads.complete("k", up, [(1, first), (2, '"not-its-etag"')])
    with pytest.raises(StoreError, match="ascending"):
        store.uploads.complete("k", up, [(2, last), (1, first)])
    with pytest.raises(ChecksumMismatchError, match="BadDigest"):
        store.uploads.complete("k", up, [(1, first), (2, last)], crc32c=to_b64(crc32c_update(big)))
    assert store.head("k") is None and [u.upload_id for u in store.uploads.list("")] == [up]  # still open

    info = store.uploads.complete("k", up, [(1, first), (2, last)], crc32c=to_b64(crc32c_update(big + big)))
    assert info.parts == 2 and info.size == 10 * MIB and info.crc32c == to_b64(crc32c_update(big + big))
    assert store.get_tags("k") == {"run": "r"} and store.uploads.list("") == ()
    with pytest.raises(NotFoundError, match="NoSuchUpload"):
        store.uploads.upload_part("k", up, 3, small)


def test_tags_and_lifecycle_configurations_within_s3_limits() -> None:
    store = MemoryStore("b")
    with pytest.raises(StoreError, match="InvalidTag"):
        store.put_bytes("k", b"x", tags={f"t{i}": "v" for i in range(11)})
    assert store.head("k") is None  # refused before anything was written
    store.put_bytes("k", b"x")
    with pytest.raises(StoreError, match="too long"):
        store.put_tags("k", {"t": "v" * 257})
    with pytest.raises(NotFoundError):
        store.get_tags("absent")
    rule = {"ID": "r", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}}
    with pytest.raises(StoreError, match="unique"):
        store.put_lifecycle([rule, rule])
    with pytest.raises(StoreError, match="Status"):
        store.put_lifecycle([{**rule, "Status": "on"}])
    store.put_lifecycle([rule])
    got = store.get_lifecycle()
    got[0]["Status"] = "Disabled"  # a copy: changing it changes nothing stored
    assert store.get_lifecycle() == [rule]


def test_stores_of_one_bucket_share_its_objects_and_a_store_never_crosses_processes() -> None:
    prod = MemoryStore("b", prefix="prod")
    dev = prod.under("dev")
    dev.put_bytes("dev/x", b"1")
    assert prod.get_bytes("dev/x") == b"1" and (prod.prefix, dev.prefix) == ("prod", "dev")
    with pytest.raises(TypeError, match="one process"):
        pickle.dumps(prod)


def test_a_file_that_changes_while_it_is_read_is_not_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptvault.store import memory_transfer

    src = tmp_path / "grows.bin"
    src.write_bytes(b"a" * 1000)
    real = memory_transfer._identity
    calls: list[int] = []

    def growing(fd: int) -> tuple[int, int]:
        calls.append(fd)
        if len(calls) == 2:  # after the read pass: the writer appended meanwhile
            with src.open("ab") as f:
                f.write(b"b")
        return real(fd)

    monkeypatch.setattr(memory_transfer, "_identity", growing)
    store = MemoryStore("b")
    with pytest.raises(StoreError, match="changed while it was being uploaded"):
        store.upload_file(src, "k")
    assert store.head("k") is None


def test_a_compressed_object_round_trips_as_frames_and_a_bad_frame_is_named(tmp_path: Path) -> None:
    store = MemoryStore("b")
    src = tmp_path / "w.bin"
    # 9 MiB of small 16-bit values: compresses, three frames, at least two parts of 5 MiB stored
    src.write_bytes(bytes(random.Random(5).choice(range(4)) for _ in range(1024)) * 9 * 1024)
    res = store.upload_file(src, "k", typesize=2, sha256=True)
    assert res.codec == "shuffle-zstd" and res.size == src.stat().st_size and len(res.frames) == 3
    info = store.head("k")
    assert info is not None and info.size == res.stored_size < res.size and info.crc32c == res.stored_crc32c
    assert res.crc32c == to_b64(crc32c_update(src.read_bytes()))
    dest = tmp_path / "out.bin"
    store.download_file("k", dest, size=res.size, crc32c=res.crc32c, frames=res.frames)
    assert dest.read_bytes() == src.read_bytes()

    stored = bytearray(store.get_bytes("k"))
    second = res.frames[1]
    stored[second[0] + second[1] // 2] ^= 0xFF
    store.put_bytes("k", bytes(stored))
    with pytest.raises(ChecksumMismatchError, match="frame 1"):
        store.download_file("k", dest, size=res.size, crc32c=res.crc32c, frames=res.frames)
    assert not dest.exists()
