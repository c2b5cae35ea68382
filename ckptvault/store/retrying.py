"""The one retry policy of store I/O, as a wrapper around the port (restic's RetryBackend).

Every store `open_store` opens is a `RetryingStore`: each port call that fails with
`TransientStoreError` (a timeout, a reset, a 5xx, throttling: ckptvault/store/errors.py) is made again
after a backoff, the same way wherever it runs: the command line's direct mode, a Prefect task, a Dask
worker (the wrapper pickles with the adapter it wraps) or a plain thread of a flow's transfer. Any other
error is an answer (missing, a lost conditional write, bad bytes, archived): retrying it wastes time and
hides the problem, so it is raised at once.

Retrying one call rather than the step around it is safe because each port call is restartable by its
contract (ckptvault/store/port.py): an upload reads its file or its parts from the path again, a
download truncates or rewrites its range, a conditional PUT that the server applied before the response
was lost is "ours" on the retry, a range of parts sent again replaces them, a completion left open on a
transient failure is completed by the retry. `list` is the one call that streams its answer to its
caller: a listing that fails part-way is listed again and skips the keys it already gave, so nothing is
given twice. (Not by key order: SeaweedFS lists "a/b" before "a.json", so "after the last key" would skip.)

botocore's own retries (standard mode, s3_client.py) sit below this, per HTTP request; this policy is
for what outlives them.

A retry stays visible, as Prefect's task retries were in the UI: each one logs a warning naming the call
and the error, and counts by operation in this process until the next ledger record takes the counts
(`take_counts`; ckptvault/observe/ledger.py, `ckptvault_store_retries_total` in docs/metrics.md).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ckptvault.store.errors import TransientStoreError
from ckptvault.store.port import (
    Capabilities,
    FetchedRange,
    LifecycleRules,
    LockStatus,
    ObjectInfo,
    ObjectStore,
    ObjectVersion,
    ProgressFn,
    RangeSource,
    RestoreState,
    Retention,
    SentPart,
    SplitUpload,
    TransferConfig,
    UploadResult,
)

log = logging.getLogger("ckptvault.store.retry")

R = TypeVar("R")


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and after how long, a transient store error is retried: `retries` more attempts
    after the first, the n-th after `delays[n]` seconds (the last delay repeats), each delay scaled by a
    random factor in [1 - jitter, 1 + jitter] so that many callers failing together do not retry
    together."""

    retries: int = 3
    delays: tuple[float, ...] = (2.0, 4.0, 8.0)
    jitter: float = 0.5

    @property
    def attempts(self) -> int:
        """Attempts in all, the first included."""
        return 1 + self.retries

    def delay(self, retry: int) -> float:
        """The wait before retry number `retry` (0-based), jitter applied."""
        base = self.delays[min(retry, len(self.delays) - 1)] if self.delays else 0.0
        return base * (1 + random.uniform(-self.jitter, self.jitter))


# The policy of every store call: what Prefect's exponential_backoff(backoff_factor=2) gives for three
# retries, spelled out so that nothing on the library's side imports Prefect.
POLICY = RetryPolicy()

_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()


def _count(op: str) -> None:
    with _counts_lock:
        _counts[op] += 1


def counts() -> dict[str, int]:
    """The retries made in this process since the last `take_counts`, by operation (port method name)."""
    with _counts_lock:
        return dict(_counts)


def take_counts() -> dict[str, int]:
    """`counts()`, and start counting again from 0: for the ledger record that stores them."""
    with _counts_lock:
        out = dict(_counts)
        _counts.clear()
        return out


def give_back_counts(taken: Mapping[str, int]) -> None:
    """Counts that `take_counts` gave to a record that could not be written: kept for the next one."""
    with _counts_lock:
        _counts.update(taken)


def unretried(store: ObjectStore) -> ObjectStore:
    """The adapter under a RetryingStore (any other store as it is): for a probe whose caller decides
    at once what a failure means, e.g. the command line's preflight reporting a dead endpoint."""
    return store.inner if isinstance(store, RetryingStore) else store


class RetryingStore:
    """An ObjectStore that makes each call of the store it wraps again on TransientStoreError, under one
    RetryPolicy (see the module docstring). `sleep` is how it waits (tests pass a recorder)."""

    def __init__(
        self, inner: ObjectStore, policy: RetryPolicy = POLICY, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        # a store wrapped twice would make each attempt of the outer policy a whole run of the inner one
        self.inner, self.policy, self._sleep = unretried(inner), policy, sleep

    def __getattr__(self, name: str) -> Any:
        # What only the adapter has (S3Store's client and section, a MemoryStore's helpers), for
        # diagnostics and tests that look at the store they opened. Dunders are not forwarded: copy and
        # pickle probe them on an instance whose `inner` is not set yet.
        if name.startswith("__") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"RetryingStore({self.inner!r})"

    def _wait(self, op: str, retry: int, error: TransientStoreError) -> None:
        """After the failed attempt before retry number `retry`: raise `error` if the policy has no retry
        left, else log the retry, count it and sleep."""
        if retry >= self.policy.retries:
            raise error
        delay = self.policy.delay(retry)
        log.warning(
            "store call %s failed (%s); retry %d of %d in %.1f s", op, error, retry + 1, self.policy.retries, delay
        )
        _count(op)
        self._sleep(delay)

    def _call(self, op: str, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        retry = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except TransientStoreError as e:
                self._wait(op, retry, e)
                retry += 1

    # -- attributes of the port: the wrapped store's -------------------------------------------------

    @property
    def bucket(self) -> str:
        return self.inner.bucket

    @bucket.setter
    def bucket(self, value: str) -> None:
        self.inner.bucket = value

    @property
    def transfer(self) -> TransferConfig:
        return self.inner.transfer

    @transfer.setter
    def transfer(self, value: TransferConfig) -> None:
        self.inner.transfer = value

    @property
    def retention(self) -> Retention | None:
        return self.inner.retention

    @retention.setter
    def retention(self, value: Retention | None) -> None:
        self.inner.retention = value

    # -- the store and its bucket --------------------------------------------------------------------

    def kind(self) -> str:
        return self._call("kind", self.inner.kind)

    def capabilities(self) -> Capabilities:
        return self._call("capabilities", self.inner.capabilities)

    def check_bucket(self) -> None:
        self._call("check_bucket", self.inner.check_bucket)

    def with_retention(self, retention: Retention | None) -> ObjectStore:
        return RetryingStore(self.inner.with_retention(retention), self.policy, self._sleep)

    def writing_in(self, storage_class: str | None) -> ObjectStore:
        return RetryingStore(self.inner.writing_in(storage_class), self.policy, self._sleep)

    def lock_status(self) -> LockStatus:
        return self._call("lock_status", self.inner.lock_status)

    def probe_lock_enforced(self) -> str | None:
        return self._call("probe_lock_enforced", self.inner.probe_lock_enforced)

    def put_legal_hold(self, key: str, on: bool) -> None:
        self._call("put_legal_hold", self.inner.put_legal_hold, key, on)

    def extend_retention(self, key: str, retention: Retention) -> bool:
        return self._call("extend_retention", self.inner.extend_retention, key, retention)

    # -- versions ------------------------------------------------------------------------------------

    def as_of(self, at: float) -> ObjectStore:
        return RetryingStore(self.inner.as_of(at), self.policy, self._sleep)

    def pinned(self, chosen: Iterable[ObjectVersion]) -> ObjectStore:
        return RetryingStore(self.inner.pinned(chosen), self.policy, self._sleep)

    def remove_delete_marker(self, key: str, version_id: str) -> None:
        # idempotent: a retry after a lost response finds the marker gone, which is not an error
        self._call("remove_delete_marker", self.inner.remove_delete_marker, key, version_id)

    def versioning(self) -> str | None:
        return self._call("versioning", self.inner.versioning)

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        given: set[tuple[str, str]] = set()
        retry = 0
        while True:
            try:
                for v in self.inner.list_versions(prefix):
                    # listed again from the start after a failure, as `list` is: what was given is skipped
                    if (v.key, v.version_id) in given:
                        continue
                    given.add((v.key, v.version_id))
                    yield v
                return
            except TransientStoreError as e:
                self._wait("list_versions", retry, e)
                retry += 1

    # -- objects -------------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        return self._call("head", self.inner.head, key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        given: set[str] = set()
        retry = 0
        while True:
            try:
                for info in self.inner.list(prefix):
                    # a listing again after a failure starts from the first key: what was given is skipped
                    if info.key in given:
                        continue
                    given.add(info.key)
                    yield info
                return
            except TransientStoreError as e:
                self._wait("list", retry, e)
                retry += 1

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        tags: Mapping[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        self._call(
            "put_bytes",
            self.inner.put_bytes,
            key,
            data,
            if_none_match=if_none_match,
            tags=tags,
            content_type=content_type,
        )

    def get_bytes(self, key: str) -> bytes:
        return self._call("get_bytes", self.inner.get_bytes, key)

    def read_crc32c(self, key: str) -> str:
        return self._call("read_crc32c", self.inner.read_crc32c, key)

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes:
        return self._call("read_range", self.inner.read_range, key, offset, length, size=size)

    def copy_from(
        self,
        source: RangeSource,
        source_key: str,
        key: str,
        *,
        size: int,
        crc32c: str,
        tags: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
    ) -> UploadResult:
        return self._call(
            "copy_from",
            self.inner.copy_from,
            source,
            source_key,
            key,
            size=size,
            crc32c=crc32c,
            tags=tags,
            progress=progress,
        )

    def upload_file(
        self,
        path: Path,
        key: str,
        *,
        tags: Mapping[str, str] | None = None,
        sha256: bool = False,
        progress: ProgressFn | None = None,
        typesize: int | None = None,
    ) -> UploadResult:
        return self._call(
            "upload_file",
            self.inner.upload_file,
            path,
            key,
            tags=tags,
            sha256=sha256,
            progress=progress,
            typesize=typesize,
        )

    def begin_upload(
        self, path: Path, key: str, *, size: int, mtime: float, tags: Mapping[str, str] | None = None
    ) -> SplitUpload:
        return self._call("begin_upload", self.inner.begin_upload, path, key, size=size, mtime=mtime, tags=tags)

    def upload_parts(
        self, upload: SplitUpload, first: int, count: int, *, progress: ProgressFn | None = None
    ) -> tuple[SentPart, ...]:
        return self._call("upload_parts", self.inner.upload_parts, upload, first, count, progress=progress)

    def complete_upload(self, upload: SplitUpload, parts: Sequence[SentPart]) -> UploadResult:
        return self._call("complete_upload", self.inner.complete_upload, upload, parts)

    def abort_upload(self, upload: SplitUpload) -> None:
        self._call("abort_upload", self.inner.abort_upload, upload)

    def download_file(
        self,
        key: str,
        dest: Path,
        *,
        size: int,
        crc32c: str,
        progress: ProgressFn | None = None,
        frames: Sequence[tuple[int, int, int, str]] = (),
    ) -> None:
        self._call(
            "download_file",
            self.inner.download_file,
            key,
            dest,
            size=size,
            crc32c=crc32c,
            progress=progress,
            frames=frames,
        )

    def download_range(
        self,
        key: str,
        dest: Path,
        *,
        offset: int,
        length: int,
        size: int,
        progress: ProgressFn | None = None,
    ) -> FetchedRange:
        return self._call(
            "download_range",
            self.inner.download_range,
            key,
            dest,
            offset=offset,
            length=length,
            size=size,
            progress=progress,
        )

    def delete(self, key: str) -> None:
        self._call("delete", self.inner.delete, key)

    def delete_many(self, keys: Sequence[str]) -> dict[str, str]:
        return self._call("delete_many", self.inner.delete_many, keys)

    def abort_multipart_uploads(self, prefix: str, older_than: float | None = None) -> int:
        return self._call("abort_multipart_uploads", self.inner.abort_multipart_uploads, prefix, older_than)

    def copy_storage_class(self, key: str, storage_class: str, size: int) -> None:
        self._call("copy_storage_class", self.inner.copy_storage_class, key, storage_class, size)

    def restore_object(self, key: str, days: int, tier: str) -> RestoreState:
        return self._call("restore_object", self.inner.restore_object, key, days, tier)

    def put_tags(self, key: str, tags: Mapping[str, str]) -> None:
        self._call("put_tags", self.inner.put_tags, key, tags)

    def get_tags(self, key: str) -> dict[str, str]:
        return self._call("get_tags", self.inner.get_tags, key)

    def put_lifecycle(self, rules: LifecycleRules) -> None:
        self._call("put_lifecycle", self.inner.put_lifecycle, rules)

    def get_lifecycle(self) -> LifecycleRules:
        return self._call("get_lifecycle", self.inner.get_lifecycle)

    def ensure_abort_incomplete_mpu_rule(self, days: int = 1) -> bool:
        return self._call("ensure_abort_incomplete_mpu_rule", self.inner.ensure_abort_incomplete_mpu_rule, days)
