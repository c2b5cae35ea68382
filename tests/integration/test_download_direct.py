"""Restores write around the page cache (O_DIRECT) where the filesystem allows it, and fall back to
buffered writes where it does not (ckptvault/store/download.py). Against the real SeaweedFS.

The direct-path tests need a filesystem with O_DIRECT (ext4, xfs, btrfs; not tmpfs): tmp_path, or the
checkout's .state if TMPDIR is a tmpfs. The direct path is the default restore path, so a run that
cannot exercise it fails, it is not skipped."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import fcntl
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3.connection

from ckptvault.config import StoreConfig
from ckptvault.store import S3Store, download, preallocate
from ckptvault.store.errors import TransientStoreError
from tests.helpers import crc32c_b64

MIB = 1024 * 1024
SIZE = 3 * 5 * MIB + 4321  # three 5 MiB ranges (the last one short), and a tail that is not whole blocks


@pytest.fixture
def store(seaweedfs: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Store]:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    cfg = StoreConfig(
        bucket=bucket_factory(seaweedfs),
        endpoint_url=seaweedfs.url,
        region=seaweedfs.region,
        part_size_mb=5,
        max_concurrency=1,
    )
    yield S3Store(cfg)


def _has_o_direct(where: Path) -> bool:
    probe = where / ".o_direct_probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
        return True
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)


@pytest.fixture
def direct_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a filesystem with O_DIRECT: tmp_path, or (if TMPDIR is a tmpfs) one in the
    checkout's .state, where the test servers keep their data. Neither: the test fails, naming why."""
    if _has_o_direct(tmp_path):
        yield tmp_path
        return
    alt = Path(__file__).resolve().parents[2] / ".state" / f"direct-io-{os.getpid()}"
    alt.mkdir(parents=True, exist_ok=True)
    try:
        if not _has_o_direct(alt):
            pytest.fail(f"neither {tmp_path} nor {alt} supports O_DIRECT: run the tests on ext4, xfs or btrfs")
        yield alt
    finally:
        shutil.rmtree(alt, ignore_errors=True)


def _uploaded(store: S3Store, tmp_path: Path, size: int = SIZE) -> tuple[Path, str, str]:
    src = tmp_path / "src.bin"
    src.write_bytes(random.Random(size).randbytes(size))
    res = store.upload_file(src, "direct/src.bin")
    return src, res.key, res.crc32c


def _download(store: S3Store, key: str, dest: Path, size: int, crc: str, direct_io: bool = True) -> download.Written:
    req = store.download_request(key, dest, size=size, crc32c=crc)
    return download.download_file(dataclasses.replace(req, direct_io=direct_io))


def test_whole_blocks_are_written_direct_and_the_tail_through_the_cache(store: S3Store, direct_dir: Path) -> None:
    src, key, crc = _uploaded(store, direct_dir)
    dest = direct_dir / "back.bin"
    written = _download(store, key, dest, SIZE, crc)
    assert dest.read_bytes() == src.read_bytes()
    assert written.direct == SIZE - SIZE % download.DIRECT_ALIGN
    assert written.buffered == SIZE % download.DIRECT_ALIGN


def test_the_file_s_blocks_are_reserved_before_its_first_write(
    store: S3Store, direct_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Direct writes into reserved blocks are overwrites (ext4 runs them under a shared inode lock;
    into a hole each one would hold it exclusively until its I/O is done): ckptvault/store/preallocate.py."""
    src, key, crc = _uploaded(store, direct_dir)
    real_pwrite = os.pwrite
    allocated_at_first_write: list[int] = []

    def pwrite_noting_blocks(fd: int, data: Any, offset: int) -> int:
        if not allocated_at_first_write:
            allocated_at_first_write.append(os.fstat(fd).st_blocks * 512)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(download.os, "pwrite", pwrite_noting_blocks)
    dest = direct_dir / "back.bin"
    written = _download(store, key, dest, SIZE, crc)
    assert dest.read_bytes() == src.read_bytes()
    assert written.direct == SIZE - SIZE % download.DIRECT_ALIGN
    assert allocated_at_first_write and allocated_at_first_write[0] >= SIZE, (
        f"not reserved before the first write: is {direct_dir} on ext4 or XFS (preallocate.RESERVED_ON)?"
    )


def test_no_room_for_the_file_fails_before_its_first_get_and_leaves_nothing(
    store: S3Store, direct_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, key, crc = _uploaded(store, direct_dir)

    def fallocate_without_room(fd: int, mode: int, offset: int, length: int) -> int:
        ctypes.set_errno(errno.ENOSPC)
        return -1

    gets: list[int] = []
    real_fetch_once = download._fetch_once

    def counted_fetch_once(*args: Any) -> Any:
        gets.append(1)
        return real_fetch_once(*args)

    monkeypatch.setattr(preallocate, "_fs_type", lambda fd: preallocate.EXT4_MAGIC)
    monkeypatch.setattr(preallocate, "_fallocate", fallocate_without_room)
    monkeypatch.setattr(download, "_fetch_once", counted_fetch_once)
    dest = direct_dir / "back.bin"
    with pytest.raises(OSError) as err:
        _download(store, key, dest, SIZE, crc)
    assert err.value.errno == errno.ENOSPC
    assert "no room for the restored file" in str(err.value) and str(dest) in str(err.value)
    assert gets == []
    assert not dest.exists()


def test_direct_io_off_writes_everything_through_the_cache(store: S3Store, tmp_path: Path) -> None:
    src, key, crc = _uploaded(store, tmp_path)
    dest = tmp_path / "back.bin"
    written = _download(store, key, dest, SIZE, crc, direct_io=False)
    assert crc32c_b64(dest) == crc32c_b64(src)
    assert (written.direct, written.buffered) == (0, SIZE)


def test_a_filesystem_without_o_direct_gets_buffered_writes(
    store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, key, crc = _uploaded(store, tmp_path)
    real_open = os.open

    def open_like_tmpfs(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(download.os, "open", open_like_tmpfs)
    dest = tmp_path / "back.bin"
    written = _download(store, key, dest, SIZE, crc)
    assert dest.read_bytes() == src.read_bytes()
    assert (written.direct, written.buffered) == (0, SIZE)


def test_a_refused_direct_write_falls_back_to_the_cache(
    store: S3Store, direct_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that opens O_DIRECT but wants a bigger alignment than 4 KiB refuses the write
    itself with EINVAL: the restore goes on buffered instead of failing."""
    src, key, crc = _uploaded(store, direct_dir)
    real_pwrite = os.pwrite
    refused: list[int] = []

    def pwrite_wanting_bigger_blocks(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(download.os, "pwrite", pwrite_wanting_bigger_blocks)
    dest = direct_dir / "back.bin"
    written = _download(store, key, dest, SIZE, crc)
    assert dest.read_bytes() == src.read_bytes()
    assert refused, "the direct descriptor was never tried"
    assert (written.direct, written.buffered) == (0, SIZE)


def test_ranges_reuse_their_connections(store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the body straight from the socket must still hand each connection back to the pool:
    a TLS handshake per range would cost more than the copy it saves."""
    size = 12 * 5 * MIB  # 12 ranges
    src, key, crc = _uploaded(store, tmp_path, size)
    store.head(key)  # the pool's first connection exists before we count
    connects: list[int] = []
    real_connect = urllib3.connection.HTTPConnection.connect

    def counting_connect(self: urllib3.connection.HTTPConnection) -> None:
        connects.append(1)
        real_connect(self)

    monkeypatch.setattr(urllib3.connection.HTTPConnection, "connect", counting_connect)
    dest = tmp_path / "back.bin"
    assert store.download_connections == 4  # 4 x max_concurrency (1)
    _download(store, key, dest, size, crc)
    assert crc32c_b64(dest) == crc32c_b64(src)
    # At most one new connection per concurrent GET (4 here); 12 would mean one per range.
    assert len(connects) <= store.download_connections, connects


def test_a_body_cut_off_mid_range_is_fetched_again(
    store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after the first bytes of one range's body: that range is fetched again
    from its start, and the buffer it was reading into (a slice of which the failed attempt's
    traceback still holds) neither fails the file nor leaks into the next one."""
    src, key, crc = _uploaded(store, tmp_path)
    real_reader = download._body_reader
    cuts: list[int] = []

    def reader_that_drops_once(body: Any) -> Any:
        read_into, finish = real_reader(body)

        def read_then_drop(view: memoryview) -> int:
            n = read_into(view[:4096])
            if not cuts:
                cuts.append(n)
                raise ConnectionResetError("connection reset by peer (injected)")
            return n + read_into(view[n:])

        return read_then_drop, finish

    monkeypatch.setattr(download, "_body_reader", reader_that_drops_once)
    dest = tmp_path / "back.bin"
    written = _download(store, key, dest, SIZE, crc)
    assert cuts == [4096]
    assert dest.read_bytes() == src.read_bytes()
    assert written.direct + written.buffered == SIZE  # the dropped attempt wrote nothing


def test_a_range_that_keeps_failing_fails_the_file_with_its_own_error(
    store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every attempt at the first range drops: the caller gets the network error, named (so the
    flow's retry policy sees a transient failure), not a BufferError from releasing the buffers, and
    no partial file is left behind."""
    _, key, crc = _uploaded(store, tmp_path)
    real_reader = download._body_reader

    def reader_dropping_range_0(body: Any) -> Any:
        read_into, finish = real_reader(body)
        first = body._raw_stream.headers.get("Content-Range", "").startswith("bytes 0-")

        def read_then_drop(view: memoryview) -> int:
            n = read_into(view[:4096])
            if first:
                raise ConnectionResetError("connection reset by peer (injected)")
            return n + read_into(view[n:])

        return read_then_drop, finish

    monkeypatch.setattr(download, "_body_reader", reader_dropping_range_0)
    dest = tmp_path / "back.bin"
    with pytest.raises(TransientStoreError) as err:
        _download(store, key, dest, SIZE, crc)
    assert key in str(err.value)
    assert not dest.exists()
