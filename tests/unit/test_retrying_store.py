"""The one retry policy of store I/O (ckptvault/store/retrying.py) on the in-memory store with injected
errors: a transient error is retried the policy's number of times after its delays, any other error
passes through at once, each retry is a log line and a count in the ledger, and a listing that fails
part-way gives each key once."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from ckptvault.config import StoreConfig
from ckptvault.observe import ledger
from ckptvault.store import (
    POLICY,
    NotFoundError,
    ObjectInfo,
    ObjectStore,
    ObjectVersion,
    RetryingStore,
    RetryPolicy,
    S3Store,
    TransientStoreError,
    open_store,
    retrying,
)
from ckptvault.store.memory import MemoryStore
from ckptvault.transfer.submitter import Threads

NO_JITTER = RetryPolicy(retries=3, delays=(2.0, 4.0, 8.0), jitter=0.0)


class Flaky(MemoryStore):
    """A MemoryStore whose named calls fail with TransientStoreError the next `fails[name]` times."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("flaky", **kwargs)
        self.fails: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.list_fails_after: int | None = None

    def _maybe_fail(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.fails.get(name, 0) > 0:
            self.fails[name] -= 1
            raise TransientStoreError(f"{name}: injected 503")

    def get_bytes(self, key: str) -> bytes:
        self._maybe_fail("get_bytes")
        return super().get_bytes(key)

    def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> None:
        self._maybe_fail("put_bytes")
        super().put_bytes(key, data, **kwargs)

    def upload_file(self, path: Path, key: str, **kwargs: Any) -> Any:
        self._maybe_fail("upload_file")
        return super().upload_file(path, key, **kwargs)

    def writing_in(self, storage_class: str | None) -> Flaky:
        return self  # MemoryStore's would be a plain MemoryStore: the faults stay injected

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.calls["list"] = self.calls.get("list", 0) + 1
        for i, info in enumerate(super().list(prefix)):
            if self.list_fails_after is not None and i == self.list_fails_after:
                self.list_fails_after = None  # once: the listing again goes through
                raise TransientStoreError("list: injected reset after a page")
            yield info


@pytest.fixture(autouse=True)
def no_leftover_counts() -> Iterator[None]:
    # the counts are per process: what these tests retry must not reach another test's ledger
    retrying.take_counts()
    yield
    retrying.take_counts()


def _wrapped(inner: ObjectStore) -> tuple[RetryingStore, list[float]]:
    naps: list[float] = []
    return RetryingStore(inner, NO_JITTER, sleep=naps.append), naps


def test_a_transient_error_is_retried_after_the_policys_delays_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    inner = Flaky()
    inner.put_bytes("k", b"v")
    store, naps = _wrapped(inner)
    inner.fails["get_bytes"] = 3
    with caplog.at_level(logging.WARNING, logger="ckptvault.store.retry"):
        assert store.get_bytes("k") == b"v"
    assert inner.calls["get_bytes"] == 4 and naps == [2.0, 4.0, 8.0]
    lines = [r.getMessage() for r in caplog.records if r.name == "ckptvault.store.retry"]
    assert len(lines) == 3 and all("store call get_bytes failed" in line and "injected 503" in line for line in lines)
    assert "retry 1 of 3 in 2.0 s" in lines[0] and "retry 3 of 3 in 8.0 s" in lines[2]
    assert retrying.counts() == {"get_bytes": 3}


def test_the_error_that_outlives_the_retries_is_raised_after_every_attempt() -> None:
    inner = Flaky()
    store, naps = _wrapped(inner)
    inner.fails["put_bytes"] = 10
    with pytest.raises(TransientStoreError, match="injected 503"):
        store.put_bytes("k", b"v", if_none_match=True)
    assert inner.calls["put_bytes"] == NO_JITTER.attempts == 4 and len(naps) == 3
    assert inner.head("k") is None


def test_an_error_that_is_not_transient_passes_through_at_once(caplog: pytest.LogCaptureFixture) -> None:
    inner = Flaky()
    store, naps = _wrapped(inner)
    with caplog.at_level(logging.WARNING, logger="ckptvault.store.retry"), pytest.raises(NotFoundError):
        store.get_bytes("absent")
    assert inner.calls["get_bytes"] == 1 and naps == [] and retrying.counts() == {}
    assert not [r for r in caplog.records if r.name == "ckptvault.store.retry"]


def test_a_retried_upload_reads_its_file_again_from_the_start(tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(bytes(range(256)) * 1000)
    inner = Flaky()
    store, _ = _wrapped(inner)
    inner.fails["upload_file"] = 2
    result = store.upload_file(src, "f.bin")
    assert inner.calls["upload_file"] == 3 and inner.get_bytes("f.bin") == src.read_bytes()
    assert result.size == src.stat().st_size


def test_a_listing_that_fails_part_way_gives_each_key_once() -> None:
    inner = Flaky(page_size=2)
    for i in range(7):
        inner.put_bytes(f"p/{i}", b"x")
    store, naps = _wrapped(inner)
    inner.list_fails_after = 4
    got = [o.key for o in store.list("p/")]
    assert got == [f"p/{i}" for i in range(7)]  # each key once, in order
    assert inner.calls["list"] == 2 and naps == [2.0] and retrying.counts() == {"list": 1}


def test_the_stores_it_derives_retry_too() -> None:
    inner = Flaky()
    store, naps = _wrapped(inner)
    other = store.writing_in(None)
    assert isinstance(other, RetryingStore) and other.policy is store.policy
    inner.put_bytes("k", b"v")
    inner.fails["get_bytes"] = 1
    assert other.get_bytes("k") == b"v" and naps == [2.0]
    assert store.bucket == "flaky" and store.transfer is inner.transfer


def test_the_policy_is_three_retries_after_2_4_8_s_with_half_jitter() -> None:
    assert (POLICY.retries, POLICY.delays, POLICY.jitter, POLICY.attempts) == (3, (2.0, 4.0, 8.0), 0.5, 4)
    delays = [POLICY.delay(2) for _ in range(200)]
    assert all(4.0 <= d <= 12.0 for d in delays) and max(delays) - min(delays) > 1.0
    assert RetryPolicy(retries=5, delays=(1.0,)).delay(4) == pytest.approx(1.0, abs=0.5)


def test_the_retries_count_in_the_next_ledger_record_and_are_kept_when_it_fails() -> None:
    inner = Flaky()
    inner.put_bytes("k", b"v")
    store, _ = _wrapped(inner)
    inner.fails["get_bytes"] = 2
    store.get_bytes("k")
    bucket = MemoryStore("ledger")

    class Refusing(MemoryStore):
        def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> None:
            raise TransientStoreError("PUT ledger: injected")

    with pytest.raises(TransientStoreError):
        ledger.record_ledger(Refusing("refusing"), "vault", None, "ingest", delete=True)
    assert retrying.counts() == {"get_bytes": 2}  # not lost with the record that failed
    assert ledger.record_ledger(bucket, "vault", {"restore_bytes": 5.0}, None, delete=True)
    assert ledger.load(bucket, "vault").totals() == {"restore_bytes": 5.0, "store_retries|get_bytes": 2.0}
    assert retrying.counts() == {}


def test_open_store_retries_and_pickles_with_its_adapter() -> None:
    store = open_store(StoreConfig(bucket="bkt", endpoint_url="http://127.0.0.1:9"))
    assert isinstance(store, RetryingStore) and isinstance(store.inner, S3Store)
    assert retrying.unretried(store) is store.inner and retrying.unretried(store.inner) is store.inner
    assert RetryingStore(store).inner is store.inner  # never one policy inside another
    back = pickle.loads(pickle.dumps(store))  # as it travels to a Dask worker
    assert isinstance(back, RetryingStore) and isinstance(back.inner, S3Store) and back.policy == POLICY
    assert back.bucket == "bkt" and back.section == store.inner.section  # the adapter's own attributes


def test_plain_threads_leave_retries_to_the_store() -> None:
    inner = Flaky()
    inner.put_bytes("k", b"v")
    store, naps = _wrapped(inner)
    inner.fails["get_bytes"] = 3
    with Threads(workers=2) as submit:
        [mapped] = submit.map([partial(store.get_bytes, "k")])
        assert mapped.result() == b"v" and inner.calls["get_bytes"] == 4 and len(naps) == 3
        inner.fails["get_bytes"] = 4
        with pytest.raises(TransientStoreError):
            submit(store.get_bytes, "k")  # what outlived the store's retries is not retried again
        assert inner.calls["get_bytes"] == 8


def test_a_listing_out_of_byte_order_is_given_whole() -> None:
    # SeaweedFS lists a folder's objects before a sibling object whose name sorts first ("a/" > "a.json")
    class FolderFirst(Flaky):
        def list(self, prefix: str) -> Iterator[ObjectInfo]:
            yield from sorted(super().list(prefix), key=lambda o: o.key.replace("/", "\0"))

    inner = FolderFirst()
    for key in ("s/alerts.json", "s/alerts/1.json", "s/alerts/2.json"):
        inner.put_bytes(key, b"x")
    store, _ = _wrapped(inner)
    assert [o.key for o in store.list("s/alerts")] == ["s/alerts/1.json", "s/alerts/2.json", "s/alerts.json"]


def test_a_version_listing_that_fails_part_way_gives_each_version_once_and_a_view_retries_too() -> None:
    class FlakyVersions(Flaky):
        def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
            self.calls["list_versions"] = self.calls.get("list_versions", 0) + 1
            for i, v in enumerate(super().list_versions(prefix)):
                if self.list_fails_after is not None and i == self.list_fails_after:
                    self.list_fails_after = None
                    raise TransientStoreError("list_versions: injected reset")
                yield v

        def as_of(self, at: float) -> Flaky:
            return self  # the memory store has no past; the wrapping is what is tested

    inner = FlakyVersions()
    for i in range(5):
        inner.put_bytes(f"p/{i}", b"x")
    store, naps = _wrapped(inner)
    inner.list_fails_after = 3
    assert [v.key for v in store.list_versions("p/")] == [f"p/{i}" for i in range(5)]
    assert inner.calls["list_versions"] == 2 and naps == [2.0] and retrying.counts() == {"list_versions": 1}
    view = store.as_of(0.0)
    assert isinstance(view, RetryingStore) and view.policy is store.policy
