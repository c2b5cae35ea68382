"""The replicate pass reading the hot copy (ckptvault/replication/hot_copy.py; docs/FORMAT.md, "Replicas",
step 3) on two MemoryStores and a real local directory: unchanged files are read from disk and not
from the primary, and every doubt (a file changed with its mtime kept, touched, gone, a symlink, a
compressed entry, a node-local save) reads that file from the primary without failing the save."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog, CheckpointState, events
from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, NodePlacement, checkpoint_prefix
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.replication import replicate
from ckptvault.replication.hot_copy import HotCopyUnusable, HotFile, hot_path
from ckptvault.store.memory import MemoryStore
from ckptvault.store.port import TransferConfig

MIB = 1024 * 1024
TRANSFER = TransferConfig(part_size=5 * MIB, multipart_threshold=5 * MIB, max_concurrency=2)
SRC = checkpoint_prefix("ck", "r1", 10)
DST = checkpoint_prefix("dr", "r1", 10)
REPLICA = ReplicaConfig(name="dr", bucket="replica", prefix="dr")
NO_LOCK = LockConfig()
SIZES = {"model.bin": 11 * MIB + 5, "sub/config.json": 300, "empty": 0}


class Setup:
    """One committed save ingested from `root` (a real directory, the manifest's `source`)."""

    def __init__(self, root: Path) -> None:
        self.root = root / "step-10"
        self.primary = MemoryStore("primary", transfer=TRANSFER)
        self.replica = MemoryStore("replica", transfer=TRANSFER)
        rng = random.Random(1)
        files = []
        for name, size in SIZES.items():
            data = rng.randbytes(size)
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            self.primary.put_bytes(SRC + name, data)
            files.append(FileEntry(name, size, path.stat().st_mtime, to_b64(crc32c_update(data))))
        self.manifest = Manifest("r1", 10, "hf", tuple(files), 1.0, 2.0, str(self.root))
        self.primary.put_bytes(SRC + MANIFEST_NAME, self.manifest.to_json())
        self.catalog = Catalog(self.primary, "ck")
        self.catalog.append([events.verified(self.manifest)])
        self.primary_reads: list[str] = []
        real = self.primary.read_range

        def counted(key: str, offset: int, length: int, *, size: int) -> bytes:
            self.primary_reads.append(key[len(SRC) :])
            return real(key, offset, length, size=size)

        self.primary.read_range = counted  # type: ignore[method-assign]

    def states(self) -> list[CheckpointState]:
        return self.catalog.current()

    def run(self, **kw: Any) -> Any:
        got = replicate(self.primary, "ck", self.replica, REPLICA, self.states(), NO_LOCK, catalog=self.catalog, **kw)
        assert got.failed == {} and len(got.copied) == 1
        return got.copied[0]

    def identical(self) -> bool:
        def objects(store: MemoryStore, prefix: str) -> dict[str, bytes]:
            return {o.key[len(prefix) :]: store.get_bytes(o.key) for o in store.list(prefix)}

        return objects(self.replica, DST) == objects(self.primary, SRC)

    def event_detail(self) -> dict[str, Any]:
        (ev,) = [e for e in self.catalog.events("r1") if e.event == "replicated"]
        return dict(json.loads(ev.detail))


def _rewrite_keeping_mtime(path: Path) -> None:
    """Other bytes of the same size, with the mtime put back: what only the CRC32C can catch."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_unchanged_hot_files_are_read_instead_of_the_primary(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    done = s.run()
    assert s.primary_reads == []  # no byte of the data files from the primary
    assert s.identical()
    assert s.replica.head(DST + "model.bin").parts == 3  # type: ignore[union-attr]  # multipart, as from the primary
    data = sum(SIZES.values())
    assert (done.hot_files, done.hot_bytes, done.fallbacks) == (3, data, ())
    assert done.primary_bytes == done.bytes - data == len(s.manifest.to_json())  # the manifest alone
    detail = s.event_detail()
    assert (detail["hot_bytes"], detail["bytes"]) == (data, done.bytes)
    assert done.as_dict()["primary_bytes"] == done.primary_bytes


def test_a_file_changed_with_its_mtime_kept_fails_its_crc_and_is_read_from_the_primary(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _rewrite_keeping_mtime(s.root / "model.bin")

    done = s.run()
    assert s.identical()  # the primary's bytes, not the changed file's
    assert list(s.replica.uploads.list("")) == []  # the hot attempt's upload was aborted
    assert set(s.primary_reads) == {"model.bin"}
    assert (done.hot_files, done.hot_bytes) == (2, SIZES["sub/config.json"])
    (why,) = done.fallbacks
    changed = "its size and mtime are the manifest's but its CRC32C is not (changed in place)"
    assert why == f"{s.root / 'model.bin'}: {changed}"


def test_a_touched_a_gone_and_a_replaced_by_symlink_file_are_read_from_the_primary(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    os.utime(s.root / "model.bin", (1.0, 1.0))  # touched: the mtime is not the manifest's
    (s.root / "sub" / "config.json").unlink()  # evicted: routine, not named
    (s.root / "empty").unlink()
    (s.root / "empty").symlink_to(tmp_path / "elsewhere")  # a symlink where the file was

    done = s.run()
    assert s.identical()
    assert (done.hot_files, done.hot_bytes) == (0, 0)
    assert sorted(s.primary_reads) == ["model.bin", "model.bin", "model.bin", "sub/config.json"]  # three parts
    whys = sorted(done.fallbacks)
    assert len(whys) == 2
    assert whys[0].startswith(str(s.root / "empty")) and "cannot be opened" in whys[0]
    assert whys[1].startswith(str(s.root / "model.bin")) and "modified since it was ingested" in whys[1]
    assert s.event_detail()["hot_bytes"] == 0


def test_a_file_touched_in_the_middle_of_its_copy_is_read_again_from_the_primary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Setup(tmp_path)
    read = HotFile.read_range

    def touch_after_the_first_part(f: HotFile, key: str, offset: int, length: int, *, size: int) -> bytes:
        data = read(f, key, offset, length, size=size)
        if offset == 0 and f.path.name == "model.bin":  # a writer comes back to the file mid-copy
            os.utime(f.path, (7.0, 7.0))
        return data

    monkeypatch.setattr(HotFile, "read_range", touch_after_the_first_part)
    done = s.run()
    assert s.identical()
    assert list(s.replica.uploads.list("")) == []  # the half-sent hot upload was aborted
    assert s.primary_reads.count("model.bin") == 3  # all three parts again, from the primary
    (why,) = done.fallbacks
    assert why.startswith(str(s.root / "model.bin")) and "modified since it was ingested" in why
    assert (done.hot_files, done.hot_bytes) == (2, SIZES["sub/config.json"])


def test_from_primary_reads_nothing_from_the_hot_copy(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    done = s.run(hot=False)
    assert s.identical()
    assert (done.hot_files, done.hot_bytes, done.fallbacks) == (0, 0, ())
    assert "model.bin" in s.primary_reads and "sub/config.json" in s.primary_reads


def test_a_file_changing_while_it_is_read_stops_the_hot_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    entry = FileEntry("f", 100, path.stat().st_mtime, to_b64(crc32c_update(b"x" * 100)))
    with HotFile(path, entry) as f:
        assert f.read_range(f.key, 10, 20, size=100) == b"x" * 20
        assert f.bucket + "/" + f.key == f"file://{path}"  # how copy_from names it
        os.utime(path, (5.0, 5.0))
        with pytest.raises(HotCopyUnusable, match="modified since it was ingested"):
            f.read_range(f.key, 30, 20, size=100)
    with pytest.raises(HotCopyUnusable, match="100 bytes, the manifest says 99"):
        HotFile(path, FileEntry("f", 99, 5.0, entry.crc32c))
    with pytest.raises(HotCopyUnusable) as gone:
        HotFile(tmp_path / "missing", entry)
    assert gone.value.gone


def test_where_the_hot_copy_is_and_when_the_primary_is_read_instead() -> None:
    plain = FileEntry("a/b.bin", 10, 1.0, "AAAAAA==")
    m = Manifest("r1", 10, "hf", (plain,), 1.0, 2.0, "/hot/r1/step-10")
    assert hot_path(m, plain) == Path("/hot/r1/step-10/a/b.bin")
    single = Manifest("r1", 10, "lightning", (FileEntry("last.ckpt", 10, 1.0, "AAAAAA=="),), 1.0, 2.0,
                      "/hot/r1/epoch=1-step=10.ckpt", single_file=True)  # fmt: skip
    assert hot_path(single, single.files[0]) == Path("/hot/r1/epoch=1-step=10.ckpt")
    # compressed: frames that re-encoding is not guaranteed to reproduce byte for byte
    packed = FileEntry("a/b.bin", 10, 1.0, "AAAAAA==", codec="shuffle-zstd", typesize=2, stored_size=8,
                       frames=((0, 8, 10, "AAAAAA=="),), stored_crc32c="AAAAAA==")  # fmt: skip
    assert hot_path(Manifest("r1", 10, "hf", (packed,), 1.0, 2.0, "/hot/r1/step-10"), packed) is None
    node_local = Manifest("r1", 10, "dcp", (plain,), 1.0, 2.0, "/hot/r1/step-10", placement=NodePlacement(2, "x"))
    assert hot_path(node_local, plain) is None  # each node's own disk, not this host's
    assert hot_path(Manifest("r1", 10, "hf", (plain,), 1.0, 2.0, "ckpts/step-10"), plain) is None  # relative
