"""The in-memory adapter: `ObjectStore` on a dict, one bucket in this process, for library tests and
benchmarks that need a store without a server (as restic's mem backend is for restic).

It keeps the port's contracts as S3 spells them, not as a convenience fake would: conditional
creates are atomic (If-None-Match: *), multipart uploads check each part's CRC32C and S3's
minimum part size and get "-N" ETags, GLACIER and DEEP_ARCHIVE objects refuse reads until a
RestoreObject has completed (after `restore_seconds` on `clock`) and are frozen again when the
restored copy expires, listings are paginated in key order, tags and lifecycle configurations are
validated by S3's limits, and every failure is a `StoreError` subclass naming the bucket and key.
One lock guards all state, so flows may drive it from worker threads as they drive S3.

Not emulated, on purpose: lifecycle rules are stored and returned but never executed (so
`lifecycle_transitions` is False and tiering moves objects itself), there are no credentials, no
endpoint and no missing bucket (the store is its bucket), no versioning, and no Intelligent-Tiering
archive tiers. A store cannot be pickled: a copy in another process would be another, empty, store.
Compressed objects (upload_file typesize=, download_file frames=) are in store/memory_framed.py.
The helper modules (memory_multipart, memory_transfer, memory_split, memory_framed) take this store as
a protocol declared below them (memory_multipart.Bucket, memory_bucket.MemoryBucket), never importing
it back: one adapter, its parts beneath it.

Built by constructor injection (`MemoryStore("bucket", prefix=...)`) and handed to the library
functions, which take an `ObjectStore`; there is no `memory://` endpoint in the configuration,
because a store that vanishes with its process is no store for `ckptvault` commands.
"""

from __future__ import annotations

import bisect
import copy
import email.utils
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.config import StoreConfig
from ckptvault.errors import InvalidArgumentError
from ckptvault.store import lifecycle, memory_split, memory_transfer
from ckptvault.store.errors import (
    ChecksumMismatchError,
    NotFoundError,
    ObjectFrozenError,
    PreconditionFailedError,
    StoreError,
)
from ckptvault.store.limits import MAX_PUT, MAX_TAGS
from ckptvault.store.memory_multipart import Uploads, etag
from ckptvault.store.port import (
    ARCHIVE_CLASSES,
    Capabilities,
    FetchedRange,
    LifecycleRules,
    LockStatus,
    ObjectInfo,
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
from ckptvault.store.s3_client import transfer_config  # the [store] section's tuning, not S3's

AWS_STORAGE_CLASSES = frozenset(
    {"STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE"}
)
RESTORE_TIERS = frozenset({"Expedited", "Standard", "Bulk"})
_STATUS = ("Enabled", "Disabled")
CAPABILITIES = Capabilities(
    checksums_validated=True,
    conditional_writes=True,
    restore_object=True,
    lifecycle_transitions=False,  # rules are kept, never run: nothing here ages objects
    full_object_checksums=True,
    kind="memory",
)


@dataclass
class _Object:
    data: bytes
    crc: int
    etag: str
    storage_class: str
    modified: float
    metadata: dict[str, str]
    tags: dict[str, str]
    restore_ready: float | None = None  # when the RestoreObject in flight completes
    restore_expiry: float | None = None  # until when the restored copy is readable
    retention: Retention | None = None
    legal_hold: bool = False


class MemoryStore:
    """One bucket of an in-memory store (see ckptvault.store.port.ObjectStore for the contract)."""

    def __init__(
        self,
        bucket: str = "memory",
        *,
        prefix: str = "",
        transfer: TransferConfig | None = None,
        restore_seconds: float = 0.0,
        clock: Callable[[], float] = time.time,
        storage_classes: Iterable[str] = AWS_STORAGE_CLASSES,
        page_size: int = 1000,
        object_lock: bool = False,
        default_retention: tuple[str, int] | None = None,
        write_class: str = "STANDARD",
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.transfer = transfer or TransferConfig()
        self.restore_seconds = restore_seconds
        self.clock = clock
        self.storage_classes = frozenset(storage_classes) | {"STANDARD"}
        if write_class not in self.storage_classes:
            raise InvalidArgumentError(f"write_class {write_class!r} is not one of this store's classes")
        # the class every new object is written in: a replica's `storage_class`, as S3Store sends it
        self.write_class = write_class
        self.page_size = page_size
        # A bucket created with Object Lock. There are no versions here: a delete of a locked object
        # is refused, as S3 refuses the delete of its version (a delete without a version id on S3
        # only hides the locked version behind a delete marker).
        self.object_lock = object_lock
        # (mode, days): the bucket's DefaultRetention, which locks every object written without a lock
        if default_retention is not None and not object_lock:
            raise InvalidArgumentError("a default retention needs a bucket with Object Lock (object_lock=True)")
        self.default_retention = default_retention
        self.retention: Retention | None = None
        self.lock = threading.RLock()  # one lock for all state, the multipart uploads' too
        self._objects: dict[str, _Object] = {}
        self._keys: list[str] = []  # sorted, for listings that page from a cursor as S3's do
        self._rules: LifecycleRules = []
        self.uploads = Uploads(self)

    @classmethod
    def for_config(cls, cfg: StoreConfig, **kwargs: Any) -> MemoryStore:
        """A store with the bucket, prefix and transfer tuning a [store] section names (its endpoint,
        credentials and TLS settings have nothing to apply to)."""
        storage_class: str | None = getattr(cfg, "storage_class", None)  # a ReplicaConfig's
        if storage_class:
            kwargs.setdefault("write_class", storage_class)
        return cls(cfg.bucket, prefix=cfg.prefix, transfer=transfer_config(cfg), **kwargs)

    def under(self, prefix: str) -> MemoryStore:
        """Another store of this same bucket under another store prefix, as two configurations naming
        one bucket are: the objects, uploads and lifecycle configuration are shared."""
        other = object.__new__(MemoryStore)
        other.__dict__.update(self.__dict__)  # the same lock, dicts and lists, each only mutated in place
        other.prefix = prefix.strip("/")
        return other

    def with_retention(self, retention: Retention | None) -> MemoryStore:
        other = self.under(self.prefix)
        other.retention = retention
        return other

    def writing_in(self, storage_class: str | None) -> MemoryStore:
        other = self.under(self.prefix)
        other.write_class = storage_class or "STANDARD"
        return other

    def lock_status(self) -> LockStatus:
        if self.default_retention is None:
            return LockStatus(enabled=self.object_lock)
        mode, days = self.default_retention
        return LockStatus(True, mode.upper(), days)

    def probe_lock_enforced(self) -> str | None:
        return None if self.object_lock else "the bucket has no Object Lock"

    def put_legal_hold(self, key: str, on: bool) -> None:
        with self.lock:
            obj = self._get(key, "setting the legal hold of")
            if not self.object_lock:
                raise StoreError(f"setting the legal hold of {self.where(key)}: the bucket has no Object Lock")
            obj.legal_hold = on

    def extend_retention(self, key: str, retention: Retention) -> bool:
        with self.lock:
            obj = self._get(key, "extending the retention of")
            want = retention.over(obj.retention)
            if want is None:
                return False
            self._put_retention(key, obj, want)
            return True

    def _put_retention(self, key: str, obj: _Object, want: Retention) -> None:
        """PutObjectRetention as S3 judges it (without the governance bypass, which this store's
        callers never send): a COMPLIANCE retention can be neither shortened nor turned into
        GOVERNANCE, and a GOVERNANCE one not shortened."""
        have = obj.retention
        if have is not None and have.until_ts > self.clock():
            weaker = have.mode == "COMPLIANCE" and want.mode != "COMPLIANCE"
            if weaker or want.until < have.until:
                raise StoreError(
                    f"extending the retention of {self.where(key)}: it is locked ({have.mode}) until "
                    f"{have.until:%Y-%m-%d %H:%M} UTC, and {want.mode} until {want.until:%Y-%m-%d %H:%M} UTC "
                    "would weaken it (AccessDenied)"
                )
        obj.retention = want

    def _locked(self, obj: _Object) -> bool:
        return obj.legal_hold or (obj.retention is not None and obj.retention.until_ts > self.clock())

    def __getstate__(self) -> NoReturn:
        raise TypeError(
            f"MemoryStore {self.bucket!r} lives in one process; a copy in another would be another, empty "
            "store. Use the thread task runner with it, or a real store across processes"
        )

    def where(self, key: str | None = None) -> str:
        return f"memory://{self.bucket}/{key}" if key is not None else f"memory bucket {self.bucket}"

    # -- capabilities and health ------------------------------------------------------------

    def kind(self) -> str:
        return CAPABILITIES.kind

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def check_bucket(self) -> None:
        """Always there: the store is its bucket."""

    # -- reading ----------------------------------------------------------------------------------

    def _frozen(self, obj: _Object, now: float) -> bool:
        if obj.storage_class not in ARCHIVE_CLASSES:
            return False
        ready = obj.restore_ready is not None and obj.restore_ready <= now
        return not (ready and obj.restore_expiry is not None and now < obj.restore_expiry)

    def _restore_header(self, obj: _Object, now: float) -> str | None:
        if obj.restore_ready is None or obj.restore_expiry is None or now >= obj.restore_expiry:
            return None
        if now < obj.restore_ready:
            return 'ongoing-request="true"'
        return f'ongoing-request="false", expiry-date="{email.utils.formatdate(obj.restore_expiry, usegmt=True)}"'

    def _get(self, key: str, op: str) -> _Object:
        obj = self._objects.get(key)
        if obj is None:
            raise NotFoundError(f"{op} {self.where(key)}: not found (NoSuchKey)")
        return obj

    def _readable(self, key: str, op: str) -> _Object:
        obj = self._get(key, op)
        if self._frozen(obj, self.clock()):
            raise ObjectFrozenError(
                f"{op} {self.where(key)}: the object is in the archival storage class {obj.storage_class} and "
                "cannot be read until it is restored; issue RestoreObject (ckptvault restore does) and wait "
                "for it to complete"
            )
        return obj

    def head(self, key: str) -> ObjectInfo | None:
        with self.lock:
            obj = self._objects.get(key)
            if obj is None:
                return None
            return ObjectInfo(
                key=key,
                size=len(obj.data),
                etag=obj.etag,
                storage_class=obj.storage_class,
                last_modified=obj.modified,
                metadata=dict(obj.metadata),
                restore=self._restore_header(obj, self.clock()),
                server_crc32c=to_b64(obj.crc),
                retention=obj.retention,
                legal_hold=obj.legal_hold,
            )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        # Page by page from a cursor, the lock held per page only: like ListObjectsV2, a listing sees
        # keys written after it started if they sort after the page it is on.
        after = ""
        while True:
            with self.lock:
                start = bisect.bisect_right(self._keys, after) if after else bisect.bisect_left(self._keys, prefix)
                page = []
                for k in self._keys[start : start + self.page_size]:
                    if not k.startswith(prefix):
                        break
                    o = self._objects[k]
                    page.append(ObjectInfo(k, len(o.data), o.etag, o.storage_class, o.modified))
            yield from page
            if len(page) < self.page_size:
                return
            after = page[-1].key

    def versioning(self) -> str | None:
        return None  # it keeps no versions (docs/ARCHITECTURE.md)

    def as_of(self, at: float) -> MemoryStore:
        raise StoreError(f"s3://{self.bucket}: the in-memory store keeps no versions, so it has no past to read")

    def pinned(self, chosen: Iterable[ObjectVersion]) -> MemoryStore:
        raise StoreError(f"s3://{self.bucket}: the in-memory store keeps no versions, so it has none to read")

    def remove_delete_marker(self, key: str, version_id: str) -> None:
        raise StoreError(f"s3://{self.bucket}/{key}: the in-memory store keeps no versions, nor delete markers")

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        # what the servers answer on a bucket without versioning (docs/object-lock.md): each object once
        for o in self.list(prefix):
            yield ObjectVersion(o.key, "null", o.last_modified, o.size, o.etag, latest=True)

    def get_bytes(self, key: str) -> bytes:
        with self.lock:
            return self._readable(key, "reading").data

    def read_crc32c(self, key: str) -> str:
        with self.lock:
            return to_b64(crc32c_update(self._readable(key, "reading back").data))

    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int, str]:
        """Bytes [start, end) of an object, its whole size and its ETag: one ranged GET."""
        with self.lock:
            obj = self._readable(key, "reading")
            if start >= len(obj.data) > 0:
                raise ChecksumMismatchError(
                    f"reading {self.where(key)}: range {start}-{end - 1} is past its {len(obj.data)} bytes"
                )
            return obj.data[start:end], len(obj.data), obj.etag

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes:
        if length < 1 or offset < 0 or offset + length > size:
            raise InvalidArgumentError(f"reading {self.where(key)}: range {offset}+{length} is not in 0..{size}")
        with self.lock:
            obj = self._readable(key, "reading")
            if len(obj.data) != size:
                raise ChecksumMismatchError(
                    f"reading {self.where(key)}: expected an object of {size} bytes, it has {len(obj.data)}"
                )
            return obj.data[offset : offset + length]

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
        return memory_transfer.copy_from(
            self, source, source_key, key, size=size, crc32c=crc32c, tags=tags, progress=progress
        )

    # -- writing ----------------------------------------------------------------------------------

    def check_tags(self, key: str, tags: Mapping[str, str]) -> dict[str, str]:
        bad = [k for k, v in tags.items() if not 1 <= len(k) <= 128 or len(v) > 256]
        if len(tags) > MAX_TAGS or bad:
            raise StoreError(
                f"tagging {self.where(key)}: S3 allows {MAX_TAGS} tags, keys of 1-128 and values of up to 256 "
                f"characters (InvalidTag: {len(tags)} tags{', too long: ' + ', '.join(bad) if bad else ''})"
            )
        return dict(tags)

    def _store(self, key: str, obj: _Object) -> None:
        if obj.retention is None and self.default_retention is not None:
            # as S3 applies a bucket's default to a version created without its own lock, copies included
            mode, days = self.default_retention
            obj.retention = Retention.of(mode, datetime.fromtimestamp(self.clock() + days * 86400.0, UTC))
        if key not in self._objects:
            bisect.insort(self._keys, key)
        self._objects[key] = obj

    def commit(
        self, key: str, data: bytes, crc: int, tag: str, tags: dict[str, str], retention: Retention | None = None
    ) -> None:
        """A completed multipart upload becomes the object (call with the lock held)."""
        self._store(key, _Object(data, crc, tag, self.write_class, self.clock(), {}, tags, retention=retention))

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        tags: Mapping[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        if len(data) > MAX_PUT:
            raise StoreError(f"writing {self.where(key)}: {len(data)} bytes is over S3's 5 GiB single PUT")
        crc = crc32c_update(data)
        checked = self.check_tags(key, tags or {})
        with self.lock:
            have = self._objects.get(key)
            if if_none_match and have is not None:
                if len(have.data) == len(data) and have.metadata.get("crc32c") == to_b64(crc):
                    return  # byte-identical: this very write, as the contract counts a retried one
                raise PreconditionFailedError(
                    f"writing {self.where(key)}: the object already exists (If-None-Match: *)"
                )
            meta = {"crc32c": to_b64(crc)}  # as S3Store writes it; content_type is not metadata
            obj = _Object(
                bytes(data), crc, etag(data), self.write_class, self.clock(), meta, checked, retention=self.retention
            )
            self._store(key, obj)

    def delete(self, key: str) -> None:
        with self.lock:
            obj = self._objects.get(key)
            if obj is not None and self._locked(obj):
                until = f"until {obj.retention.until:%Y-%m-%d %H:%M} UTC" if obj.retention else "by a legal hold"
                raise StoreError(f"deleting {self.where(key)}: the object is locked {until} (AccessDenied)")
            if self._objects.pop(key, None) is not None:
                del self._keys[bisect.bisect_left(self._keys, key)]

    def delete_many(self, keys: Sequence[str]) -> dict[str, str]:
        failed = {}
        for k in keys:  # one request per DELETE_BATCH keys in S3; only a lock fails one key here
            try:
                self.delete(k)
            except StoreError as e:
                failed[k] = str(e)
        return failed

    def abort_multipart_uploads(self, prefix: str, older_than: float | None = None) -> int:
        return self.uploads.abort_all(prefix, older_than)

    # -- files ------------------------------------------------------------------------------------

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
        if typesize is not None:
            from ckptvault.store import memory_framed  # imports the codec library: only when compressing

            return memory_framed.upload_framed(
                self, Path(path), key, typesize=typesize, tags=tags, sha256=sha256, progress=progress
            )
        return memory_transfer.upload_file(self, Path(path), key, tags=tags, sha256=sha256, progress=progress)

    def begin_upload(
        self, path: Path, key: str, *, size: int, mtime: float, tags: Mapping[str, str] | None = None
    ) -> SplitUpload:
        return memory_split.begin(self, Path(path), key, size=size, mtime=mtime, tags=tags)

    def upload_parts(
        self, upload: SplitUpload, first: int, count: int, *, progress: ProgressFn | None = None
    ) -> tuple[SentPart, ...]:
        return memory_split.send(self, upload, first, count, progress)

    def complete_upload(self, upload: SplitUpload, parts: Sequence[SentPart]) -> UploadResult:
        return memory_split.finish(self, upload, parts)

    def abort_upload(self, upload: SplitUpload) -> None:
        memory_split.abort(self, upload)

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
        if frames:
            from ckptvault.store import memory_framed

            memory_framed.download_framed(
                self, key, Path(dest), size=size, crc32c=crc32c, frames=frames, progress=progress
            )
            return
        memory_transfer.download_file(self, key, Path(dest), size=size, crc32c=crc32c, progress=progress)

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
        return memory_transfer.download_range(
            self, key, Path(dest), offset=offset, length=length, size=size, progress=progress
        )

    # -- tiering, restore, tags, lifecycle --------------------------------------------------------

    def copy_storage_class(self, key: str, storage_class: str, size: int) -> None:
        if storage_class not in self.storage_classes:
            raise StoreError(
                f"moving {self.where(key)} to storage class {storage_class}: not a class this store has "
                f"(InvalidStorageClass; it has {', '.join(sorted(self.storage_classes))})"
            )
        with self.lock:
            if self._get(key, "moving").storage_class == storage_class:
                return  # already there, frozen or not: nothing to copy
            obj = self._readable(key, f"moving to storage class {storage_class}:")
            # CopyObject onto itself: a new object (new ETag, no part suffix, no restored copy) with the
            # same bytes, metadata and tags.
            moved = replace(obj, etag=etag(obj.data), storage_class=storage_class, modified=self.clock())
            moved.restore_ready = moved.restore_expiry = None
            self._store(key, moved)

    def restore_object(self, key: str, days: int, tier: str) -> RestoreState:
        if tier not in RESTORE_TIERS:
            raise StoreError(f"restoring {self.where(key)}: tier {tier!r} is not one of {sorted(RESTORE_TIERS)}")
        if days < 1:
            raise StoreError(f"restoring {self.where(key)}: days must be at least 1, got {days}")
        with self.lock:
            obj = self._get(key, "restoring")
            now = self.clock()
            if obj.storage_class not in ARCHIVE_CLASSES:
                return "not_needed"
            if obj.restore_ready is not None and obj.restore_expiry is not None and now < obj.restore_expiry:
                if now < obj.restore_ready:
                    return "in_progress"
                obj.restore_expiry = now + days * 86400  # S3 extends a restored copy's expiry
                return "restored"
            obj.restore_ready = now + self.restore_seconds
            obj.restore_expiry = obj.restore_ready + days * 86400
            return "requested"

    def put_tags(self, key: str, tags: Mapping[str, str]) -> None:
        checked = self.check_tags(key, tags)
        with self.lock:
            self._get(key, "tagging").tags = checked

    def get_tags(self, key: str) -> dict[str, str]:
        with self.lock:
            return dict(self._get(key, "reading tags of").tags)

    def put_lifecycle(self, rules: LifecycleRules) -> None:
        ids = [str(r.get("ID", "")) for r in rules]
        statuses = {str(r.get("ID", "")): r.get("Status") for r in rules}
        problems = [
            f"rule {i!r}: Status must be Enabled or Disabled" for i, st in statuses.items() if st not in _STATUS
        ]
        if len(set(ids)) != len(ids):
            problems.append("rule IDs must be unique")
        if len(rules) > 1000 or any(len(i) > 255 for i in ids):
            problems.append("at most 1000 rules, IDs of up to 255 characters")
        if problems:
            raise StoreError(f"writing the lifecycle configuration of {self.where()}: {'; '.join(problems)}")
        with self.lock:
            self._rules[:] = copy.deepcopy(list(rules))  # in place: stores from under() share it

    def get_lifecycle(self) -> LifecycleRules:
        with self.lock:
            return copy.deepcopy(self._rules)

    def ensure_abort_incomplete_mpu_rule(self, days: int = 1) -> bool:
        with self.lock:  # unlike S3's read-modify-write, atomic here
            merged = lifecycle.with_abort_mpu_rule(self.get_lifecycle(), self.prefix, days)
            if merged is None:
                return False
            self.put_lifecycle(merged)
            return True
