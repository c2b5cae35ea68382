"""Downloads share one process-wide budget of range GETs across files (ckptvault/store/download.py).

Observed from outside, on the wire: the real SeaweedFS behind tests/faultproxy.py, which adds
latency to every request (so GETs overlap) and records how many GETs it served at once."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ckptvault.config import StoreConfig
from ckptvault.store import S3Store
from tests.faultproxy import FaultProxy, FaultRates
from tests.helpers import crc32c_b64

MIB = 1024 * 1024


@pytest.fixture
def slow_store(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[S3Store, FaultProxy]]:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    with FaultProxy(seaweedfs.url, FaultRates(latency=1.0, latency_s=0.15)) as proxy:
        cfg = StoreConfig(
            bucket=bucket, endpoint_url=proxy.url, region=seaweedfs.region, part_size_mb=5, max_concurrency=1
        )
        yield S3Store(cfg), proxy


def _upload(store: S3Store, proxy: FaultProxy, tmp_path: Path, sizes: list[int]) -> list[tuple[Path, str, str]]:
    out = []
    with proxy.paused():
        for i, size in enumerate(sizes):
            src = tmp_path / f"f{i}.bin"
            src.write_bytes(random.Random(i).randbytes(size))
            res = store.upload_file(src, f"dl/{src.name}")
            out.append((src, res.key, res.crc32c))
    return out


def test_a_lone_big_file_gets_every_connection(slow_store: tuple[S3Store, FaultProxy], tmp_path: Path) -> None:
    store, proxy = slow_store
    assert store.download_connections == 4  # 4 x max_concurrency (1)
    [(src, key, crc)] = _upload(store, proxy, tmp_path, [8 * 5 * MIB])  # 8 ranges
    proxy.peak_in_flight.clear()
    dest = tmp_path / "back.bin"
    store.download_file(key, dest, size=src.stat().st_size, crc32c=crc)
    assert dest.read_bytes() == src.read_bytes()
    # max_concurrency = 1 per file would have been 1 GET at a time: the lone file used the shared budget
    assert proxy.peak_in_flight["GetObject"] == 4, proxy.peak_in_flight


def test_files_downloaded_at_once_share_the_budget(slow_store: tuple[S3Store, FaultProxy], tmp_path: Path) -> None:
    store, proxy = slow_store
    files = _upload(store, proxy, tmp_path, [3 * 5 * MIB + 17 * i for i in range(4)])  # 4 files x 3 ranges
    proxy.peak_in_flight.clear()

    def fetch(item: tuple[Path, str, str]) -> Path:
        src, key, crc = item
        dest = tmp_path / f"back-{src.name}"
        store.download_file(key, dest, size=src.stat().st_size, crc32c=crc)
        return dest

    with ThreadPoolExecutor(4) as ex:
        backs = list(ex.map(fetch, files))
    for (src, _, _), back in zip(files, backs, strict=True):
        assert crc32c_b64(back) == crc32c_b64(src)
    # 12 ranges wanted at once; never more than the process-wide 4 on the wire
    assert proxy.peak_in_flight["GetObject"] == 4, proxy.peak_in_flight
