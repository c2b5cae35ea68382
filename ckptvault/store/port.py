"""The object store port: what ckptvault needs from any S3-like store, and the contract of each call.

Keys are full object keys (the adapter never adds a prefix). Every method raises `StoreError`
(or a subclass, ckptvault/store/errors.py) with a message that names the bucket and key; transient failures (timeouts,
connection resets, 5xx, SlowDown) raise `TransientStoreError` so callers can retry only those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, cast

from ckptvault.errors import InvalidArgumentError
from ckptvault.store.limits import MAX_PART, MIN_PART

# Called with the number of bytes just transferred; used for progress bars and artifacts.
ProgressFn = Callable[[int], None]
# S3 lifecycle rules as boto3 spells them (dicts with ID, Status, Filter, Transitions, ...)
LifecycleRules = list[dict[str, Any]]

# Storage classes whose objects cannot be read until RestoreObject has completed.
ARCHIVE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})

RestoreState = Literal["requested", "in_progress", "restored", "not_needed"]
# The bucket lifecycle rule aborting incomplete multipart uploads; its ID under a store prefix is
# lifecycle.rule_id(ABORT_MPU_RULE_NAME, prefix).
ABORT_MPU_RULE_NAME = "abort-incomplete-mpu"
# The tag that records the CRC32C of a multipart object's stored bytes where the server keeps no
# whole-object CRC32C (Ceph RGW 16.2): set by the upload once the object is verified, before its lock.
CRC_TAG = "crc32c"


@dataclass(frozen=True)
class Capabilities:
    """What a server supports, detected by probing (see `S3Store.capabilities`)."""

    checksums_validated: bool  # server rejects a wrong x-amz-checksum-crc32c (BadDigest)
    conditional_writes: bool  # server honours If-None-Match: * with 412
    restore_object: bool  # RestoreObject implemented (AWS, moto)
    # Transition rules accepted and executed. Not probed (that would mean writing the bucket's
    # lifecycle configuration): taken from the server kind, aws/ceph/moto True, seaweedfs False.
    lifecycle_transitions: bool
    # multipart uploads with ChecksumType=FULL_OBJECT: the server checks the whole-object CRC32C
    # at CompleteMultipartUpload and returns it on HEAD (AWS, SeaweedFS)
    full_object_checksums: bool = False
    kind: str = "unknown"  # aws | ceph | seaweedfs | minio | moto | unknown (configured or detected)
    # The bucket refuses a PUT with neither Content-MD5 nor a checksum header it takes
    # (MissingUploadObjectWithObjectLockHeaders): a bucket default retention on moto, as AWS documents.
    # Learnt by the probe's own unchecksummed PUT being refused; every write then carries Content-MD5
    # where it carries no validated CRC32C (object_lock.needs_content_md5).
    integrity_header: bool = False


LockMode = Literal["GOVERNANCE", "COMPLIANCE"]


@dataclass(frozen=True)
class Retention:
    """S3 Object Lock retention of an object version: deletable by nobody (COMPLIANCE) or only with
    s3:BypassGovernanceRetention (GOVERNANCE) until `until` (docs/FORMAT.md, "Object Lock")."""

    mode: LockMode
    until: datetime  # timezone-aware, UTC

    def __post_init__(self) -> None:
        if self.mode not in ("GOVERNANCE", "COMPLIANCE"):
            raise InvalidArgumentError(f"an Object Lock mode is GOVERNANCE or COMPLIANCE, not {self.mode!r}")
        if self.until.tzinfo is None:
            raise InvalidArgumentError(f"a retain-until date must carry its time zone: {self.until.isoformat()}")

    @property
    def until_ts(self) -> float:
        return self.until.timestamp()

    @classmethod
    def of(cls, mode: str, until: datetime) -> Retention:
        """From a server's or a config's spelling of the mode (any case); the date converted to UTC."""
        return cls(cast(LockMode, mode.upper()), until.astimezone(UTC))

    def over(self, have: Retention | None) -> Retention | None:
        """What raising an object's retention `have` to this one asks for: None when `have` already
        lasts as long (a lock is never shortened); else this date, in COMPLIANCE if `have` is. S3
        refuses to turn a COMPLIANCE retention into GOVERNANCE (nobody may weaken it), so a config
        changed from compliance to governance extends the objects already in COMPLIANCE in COMPLIANCE."""
        if have is not None and have.until >= self.until:
            return None
        if have is not None and have.mode == "COMPLIANCE" and self.mode != "COMPLIANCE":
            return Retention("COMPLIANCE", self.until)
        return self


@dataclass(frozen=True)
class LockStatus:
    """A bucket's Object Lock configuration (GetObjectLockConfiguration)."""

    enabled: bool
    default_mode: str | None = None  # the bucket's default retention, applied to writes without a lock
    default_days: int | None = None  # its period as the configuration gives it: Days,
    default_years: int | None = None  # or Years (S3 takes one or the other)
    known: bool = True  # False: the server does not implement GetObjectLockConfiguration (enabled False)


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    storage_class: str  # "STANDARD" when the server omits it
    last_modified: float  # unix seconds
    metadata: Mapping[str, str] = field(default_factory=dict)  # only filled by head()
    restore: str | None = None  # raw x-amz-restore header, only filled by head()
    # the server's own whole-object CRC32C (x-amz-checksum-crc32c) when it is a whole-object value
    # (single-part object, or multipart with ChecksumType FULL_OBJECT); only filled by head()
    server_crc32c: str | None = None
    archive_status: str | None = None  # Intelligent-Tiering ARCHIVE_ACCESS / DEEP_ARCHIVE_ACCESS
    retention: Retention | None = None  # Object Lock retention of this version; only filled by head()
    legal_hold: bool = False  # only filled by head()

    @property
    def crc32c(self) -> str | None:
        """The whole-object CRC32C (base64, as S3 spells it) if the object carries one: metadata
        `crc32c` (single PUTs) or the server's full-object checksum. None for multipart objects on
        servers without full-object checksums (Ceph): the manifest is the record of their CRC32C."""
        return self.metadata.get("crc32c") or self.server_crc32c

    @property
    def parts(self) -> int:
        """Number of parts from the ETag's "-N" suffix; 0 for a single PUT (or an in-place copy)."""
        tail = self.etag.strip('"').rpartition("-")[2]
        return int(tail) if "-" in self.etag and tail.isdigit() else 0

    @property
    def frozen(self) -> bool:
        """In an archival class (GLACIER, DEEP_ARCHIVE, Intelligent-Tiering archive tiers) and not
        (yet) restored: a GET fails with InvalidObjectState."""
        archived = self.storage_class in ARCHIVE_CLASSES or self.archive_status is not None
        return archived and not (self.restore or "").replace(" ", "").startswith('ongoing-request="false"')


@dataclass(frozen=True)
class ObjectVersion:
    """One entry of ListObjectVersions: a version of a key, or a delete marker (which holds no data)."""

    key: str
    version_id: str
    last_modified: float  # unix seconds; servers keep whole seconds (docs/object-lock.md)
    size: int = 0
    etag: str = ""
    delete_marker: bool = False
    latest: bool = False  # the server's IsLatest: what a GET without a version id reads (or 404s on)
    storage_class: str = "STANDARD"  # "" for a delete marker


@dataclass(frozen=True)
class UploadResult:
    key: str
    size: int
    crc32c: str  # base64 big-endian CRC32C of the whole object, computed in the read pass
    sha256: str | None  # hex, only when asked for
    etag: str
    parts: int  # 0 for a single PUT
    # True when the server itself checked the CRC32C of every byte (per part, and for the whole
    # object where it supports full-object checksums); False where only sizes/part counts were checked
    server_verified: bool = False
    # How the object stores the file (docs/FORMAT.md, "Compressed files"); `size`, `crc32c` and
    # `sha256` above stay the original file's whatever the codec.
    codec: str = "none"
    typesize: int | None = None
    stored_size: int | None = None  # the object's size; None: `size`
    stored_crc32c: str | None = None  # of the object's bytes (what the server checked); None: `crc32c`
    frames: tuple[tuple[int, int, int, str], ...] = ()  # the manifest's frame index
    # The CRC32C of every 4 MiB block of the file, in order (docs/FORMAT.md, "Block checksums"), from the
    # same read pass: a file stored as it is and over checksum.BLOCKS_MIN_SIZE; () otherwise.
    blocks: tuple[int, ...] = ()


@dataclass(frozen=True)
class SplitUpload:
    """A multipart upload whose parts several tasks send (`[scale] split_size_mb`): what each range
    task and the one that completes it need. Picklable, so it travels to Dask workers. `size` and
    `mtime` are the file as discovery listed it: a range refuses a file that differs, so every part of
    the object comes from one version of the file."""

    key: str
    upload_id: str
    path: str
    size: int
    mtime: float
    part_size: int
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def parts(self) -> int:
        return -(-self.size // self.part_size)


@dataclass(frozen=True)
class SentPart:
    """One part of a SplitUpload as the server took it, with the CRC32C of its bytes (read in the same
    pass that sent them): CompleteMultipartUpload lists the ETags, and the CRCs combine in order into
    the whole file's."""

    number: int
    etag: str
    crc32c: int
    size: int
    # the file the part was read from, as its range's fstat saw it (device, inode, ctime): the parts of
    # one object must all come from one file, not from a same-size, same-mtime copy renamed over it
    # between two ranges
    source: tuple[int, int, int] = (0, 0, 0)
    # the part's bytes cut at the file's 4 MiB block boundaries, (CRC32C, length) each, from the same
    # read (checksum.BlockCrcs.cut): completion joins every part's into the file's block CRCs. () where
    # the file gets none (checksum.wants_blocks), or from a version before blocks: then none are recorded.
    blocks: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class FetchedRange:
    """One range of an object written by `download_range`: what the caller needs to verify the whole
    file once every range is in (crc32c_combine of the ranges' CRCs in offset order, and one ETag)."""

    key: str
    offset: int
    length: int
    crc32c: str  # base64 big-endian CRC32C of the range's bytes
    etag: str  # the object's ETag as every GET of the range saw it


@dataclass(frozen=True)
class TransferConfig:
    """Validated transfer tuning. Upload memory is bounded by `buffer_budget` for the whole process
    (store/buffers.py); 0 means part_size * (max_concurrency + 1): one file's full pipeline."""

    part_size: int = 32 * 1024 * 1024
    multipart_threshold: int = 64 * 1024 * 1024
    max_concurrency: int = 4
    buffer_budget: int = 0

    @property
    def budget(self) -> int:
        return self.buffer_budget or self.part_size * (self.max_concurrency + 1)

    def __post_init__(self) -> None:
        if self.part_size < MIN_PART:
            raise InvalidArgumentError(f"part_size must be at least 5 MiB (S3's minimum part), got {self.part_size}")
        if self.part_size > MAX_PART:
            raise InvalidArgumentError(f"part_size must be at most 5 GiB (S3's maximum part), got {self.part_size}")
        if self.multipart_threshold < self.part_size:
            raise InvalidArgumentError("multipart_threshold must be >= part_size")
        if not 1 <= self.max_concurrency <= 64:
            raise InvalidArgumentError(f"max_concurrency must be between 1 and 64, got {self.max_concurrency}")
        if self.buffer_budget and self.buffer_budget < self.part_size:
            raise InvalidArgumentError(
                f"buffer_budget ({self.buffer_budget}) must hold at least one part ({self.part_size})"
            )


class RangeSource(Protocol):
    """What `ObjectStore.copy_from` reads from: a name for its messages (`bucket`, with the key after it)
    and ranged reads with `ObjectStore.read_range`'s contract. Every ObjectStore is one; the replicate
    pass also hands in a file of the hot copy (ckptvault/replication/hot_copy.py)."""

    bucket: str

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes: ...


class ObjectStore(Protocol):
    """One bucket of an S3-like store."""

    bucket: str
    # The transfer tuning. `part_size` is the size of one ranged GET (and upload part): a caller that
    # splits a file into ranges cuts on its multiples, so each range is whole GETs and starts aligned
    # for direct writes.
    transfer: TransferConfig

    def kind(self) -> str:
        """The server kind ("aws", "ceph", "seaweedfs", "minio", "moto"): configured, or guessed once."""
        ...

    def capabilities(self) -> Capabilities:
        """Probe once (cached): a few requests under `_ckptvault_probe/`, cleaned up after (with `[store]
        deletes = "tier-only"` left under one reused key instead)."""
        ...

    def check_bucket(self) -> None:
        """Raise StoreError naming the endpoint/bucket and the fix if it is unreachable or missing."""
        ...

    # The Object Lock retention every object version this store creates gets (PutObject,
    # CreateMultipartUpload), or None: with_retention returns a store of the same bucket writing with it.
    retention: Retention | None

    def with_retention(self, retention: Retention | None) -> ObjectStore:
        """This store (same bucket, client and probe), writing every new object with `retention`:
        the lock is on the object from its first byte, never set afterwards. Where the server does
        not validate CRC32C checksums, each locked write carries Content-MD5 (S3 requires one or the
        other on a locked write)."""
        ...

    def writing_in(self, storage_class: str | None) -> ObjectStore:
        """This store (same bucket, client, probe and retention), writing every new object in
        `storage_class` (None: the server's default, STANDARD) instead of its configured one: a
        replica writing its data in DEEP_ARCHIVE keeps its manifests readable without a thaw."""
        ...

    def lock_status(self) -> LockStatus:
        """The bucket's Object Lock configuration; `enabled` False where it has none (or the server
        has no Object Lock)."""
        ...

    def probe_lock_enforced(self) -> str | None:
        """Write one object under the probe prefix in GOVERNANCE mode for 60 s and delete that version
        by its id without the bypass: None if the server refused (it enforces the lock), else what it
        did instead. The probe object is then removed with the bypass where the credentials allow."""
        ...

    def put_legal_hold(self, key: str, on: bool) -> None:
        """Set (on) or clear the object's (current version's) legal hold: while on, no version delete
        succeeds, whatever its retention. The bucket must have Object Lock."""
        ...

    def extend_retention(self, key: str, retention: Retention) -> bool:
        """Raise the object's (current version's) retention to `retention` (PutObjectRetention);
        never shortens it: False, and nothing written, if it is already locked at least that long.
        Never weakens its mode either: an object in COMPLIANCE is extended in COMPLIANCE (`Retention.over`)."""
        ...

    def versioning(self) -> str | None:
        """The bucket's versioning: "Enabled", "Suspended", or None where it was never turned on (or the
        store keeps no versions). Point-in-time reads and recovery need "Enabled"; Object Lock implies it."""
        ...

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        """Every version and delete marker of every key under `prefix` (ListObjectVersions): keys in
        order, each key's entries newest first. On a bucket without versioning a server lists each object
        once, as its `null` version: ask `versioning` first."""
        ...

    def as_of(self, at: float) -> ObjectStore:
        """A read-only view of the store as it was at `at` (unix seconds): `list`, `head` and every read
        name the version that was current then (docs/object-lock.md, "After an attack"); a key with none
        is absent; a write raises StoreError. Needs a versioned bucket (`versioning`)."""
        ...

    def pinned(self, chosen: Iterable[ObjectVersion]) -> ObjectStore:
        """A read-only view whose reads of each chosen key name the chosen version (a save's first
        manifest, the version a recovery puts back); every other key, and a chosen delete marker, is
        absent; a write raises StoreError. Needs a versioned bucket (`versioning`)."""
        ...

    def remove_delete_marker(self, key: str, version_id: str) -> None:
        """Delete the delete marker `version_id` of `key` (DeleteObject with its VersionId): the version
        under it reads again. The caller names a version id that ListObjectVersions listed as a marker
        (a version id names one entry for ever, so it cannot have become data since); one already gone is
        not an error, which makes a rerun after a crash harmless. A marker holds no data and no lock, and
        the servers measured remove one in a locked bucket (docs/object-lock.md)."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """Metadata of one object, or None if absent."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object under prefix, paginated, in key order. Metadata is not filled."""
        ...

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        tags: Mapping[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        """Write a small object with its CRC32C. if_none_match: raise PreconditionFailedError if the key
        exists (on servers without conditional writes, a HEAD first; racy, and documented as such),
        unless what exists is byte-identical (same size and CRC32C): that is this very write, applied
        by the server on an attempt whose response was lost and then retried."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """Read a small object whole. NotFoundError if absent, ObjectFrozenError if archived."""
        ...

    def read_crc32c(self, key: str) -> str:
        """The CRC32C (base64, as S3 spells it) of the object's stored bytes, read back whole in one
        streamed GET (memory: one chunk): for an object whose CRC32C the store keeps nowhere (a multipart
        object on a server without full-object checksums, before its `crc32c` tag). NotFoundError if
        absent, ObjectFrozenError if archived."""
        ...

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes:
        """Bytes [offset, offset + length) of an object of `size` bytes: one ranged GET, held in memory
        (keep `length` to a part). ChecksumMismatchError naming the key if the object is not `size`
        bytes or the server returns fewer; NotFoundError if absent, ObjectFrozenError if archived;
        InvalidArgumentError if the range is empty or outside `size`."""
        ...

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
        """Stream `source`'s object `source_key` (another store's, or a hot file: RangeSource) into this
        store as `key`, with no local disk: ranged
        GETs of this store's part size through `source.read_range`, a few in flight (memory bounded by
        the parts in flight, never the object), into a single PUT up to the multipart threshold or a
        multipart upload above it, written exactly as `upload_file` writes (per-part CRC32C where the
        server validates them, Content-MD5 on a locked write where it does not, this store's retention
        and storage class, CRC_TAG on a multipart object the server keeps no CRC32C of, one HEAD to
        verify). The CRC32C of the bytes is computed in the same pass and compared with `crc32c` (the
        source's expected value: a manifest's) BEFORE the upload is completed: a mismatch, or an object
        that is not `size` bytes, aborts it and raises ChecksumMismatchError naming the source object;
        nothing is written under `key`. The result's `crc32c` and `size` are the object's bytes."""
        ...

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
        """Stream a file up (multipart above the threshold), computing CRC32C (and SHA-256 if asked) in
        the same read pass, sending per-part checksums where the server validates them (and the
        whole-object CRC32C as a FULL_OBJECT checksum where supported). A single PUT also stores the
        CRC32C as metadata `crc32c`; a multipart object cannot (metadata is fixed at
        CreateMultipartUpload, before the CRC is known), so the caller's manifest is the record.
        Then a HEAD verifies size, part count (ETag "-N") and any whole-object CRC32C the server
        reports. On failure the multipart upload is aborted. `tags` go on the object; a multipart
        object on a server that keeps no whole-object CRC32C (`server_verified` False) also gets the
        tag CRC_TAG, the CRC32C of its stored bytes, once verified and before its lock (a rerun after a
        kill between the two reuses the object instead of leaving a locked version behind).
        `progress` is called once per part, possibly from worker threads. With `typesize` the object is
        the file's shuffle-zstd frames (docs/FORMAT.md), always multipart, and the result carries the
        codec fields; without it the object is the file."""
        ...

    def begin_upload(
        self, path: Path, key: str, *, size: int, mtime: float, tags: Mapping[str, str] | None = None
    ) -> SplitUpload:
        """Start a multipart upload of `path` (as listed: `size`, `mtime`) whose parts are sent by
        `upload_parts` calls, possibly on other hosts, and completed by `complete_upload`. The part
        size is the store's (grown where the file would need more than 10,000 parts)."""
        ...

    def upload_parts(
        self, upload: SplitUpload, first: int, count: int, *, progress: ProgressFn | None = None
    ) -> tuple[SentPart, ...]:
        """Read parts first..first+count-1 (1-based) of the upload's file and send them, each with its
        CRC32C where the server validates part checksums. StoreError if the file's size or mtime is not
        the listed one, before or after the read (nothing of a changed file is completed). Sending a
        part again replaces it: a retried or re-run range is harmless."""
        ...

    def complete_upload(self, upload: SplitUpload, parts: Sequence[SentPart]) -> UploadResult:
        """Complete with every part 1..N exactly once (StoreError otherwise, naming what is missing).
        The whole-file CRC32C is combined in order from the parts' and sent as a FULL_OBJECT checksum
        where the server checks one; then the same HEAD check as `upload_file`, and the tags put again
        (Ceph drops those of CreateMultipartUpload), with CRC_TAG as `upload_file` sets it. A failed
        completion aborts the upload."""
        ...

    def abort_upload(self, upload: SplitUpload) -> None:
        """Abort it, best effort (the bucket's abort-incomplete-MPU rule is the backstop)."""
        ...

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
        """Parallel ranged GETs into `dest` (created or truncated), CRC32C checked against `crc32c`:
        ChecksumMismatchError naming the key if it (or the size) differs; `dest` is removed on any
        failure. ObjectFrozenError if archived. `progress` is called per range, from worker threads.
        With `frames` (a manifest's frame index) the object is decoded frame by frame, each checked
        against its CRC32C of the original bytes (a failure names the frame); `size` and `crc32c` are
        the original file's."""
        ...

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
        """Bytes [offset, offset + length) of the object into the existing file `dest` at the same
        offset, as parallel ranged GETs of `transfer.part_size`, streamed (memory bounded by the GETs in
        flight, never the range). `dest` is opened without truncation and never created: the caller
        made it at the object's full size, and other ranges of the object may be written into it at the
        same time, by other processes or hosts. Returns the range's CRC32C, for the caller to combine
        with the others' (ckptvault.checksum.crc32c_combine) and compare with the whole object's: a
        range alone has no expected value. ChecksumMismatchError if the object is not `size` bytes;
        TransientStoreError if it was replaced while the range was read; InvalidArgumentError if the
        range is empty or outside `size`; ObjectFrozenError if archived. On failure the range's bytes
        are left as they are (the caller discards the file it made). Objects stored as frames are not
        read this way: a frame decodes only from its start (use download_file)."""
        ...

    def delete(self, key: str) -> None:
        """Delete one object; absent is not an error."""
        ...

    def delete_many(self, keys: Sequence[str]) -> dict[str, str]:
        """Delete these objects in as few requests as the store allows (S3: DeleteObjects, at most
        DELETE_BATCH keys each); absent is not an error. Returns the keys it could not delete, and why;
        a request that fails as a whole raises StoreError."""
        ...

    def abort_multipart_uploads(self, prefix: str, older_than: float | None = None) -> int:
        """Abort incomplete multipart uploads under prefix (initiated before `older_than`, unix s)."""
        ...

    def copy_storage_class(self, key: str, storage_class: str, size: int) -> None:
        """Move an object to another storage class in place (server-side copy keeping metadata and
        tags; multipart copy above 5 GiB). A no-op if it is already in that class. An Object Lock
        retention or legal hold of the object is kept on the copy. On a versioned bucket the old
        version stays, billed in its old class, until a noncurrent-version rule."""
        ...

    def restore_object(self, key: str, days: int, tier: str) -> RestoreState:
        """Ask for a readable copy of an archived object (tier: Expedited | Standard | Bulk).
        "not_needed" if the object is readable as it is; StoreError if the server has no RestoreObject."""
        ...

    def put_tags(self, key: str, tags: Mapping[str, str]) -> None:
        """Replace the object's tags."""
        ...

    def get_tags(self, key: str) -> dict[str, str]: ...

    def put_lifecycle(self, rules: LifecycleRules) -> None:
        """Replace the bucket lifecycle configuration (S3 rule dicts); an empty list deletes it."""
        ...

    def get_lifecycle(self) -> LifecycleRules:
        """The bucket's lifecycle rules; [] if it has none."""
        ...

    def ensure_abort_incomplete_mpu_rule(self, days: int = 1) -> bool:
        """Merge a rule aborting incomplete multipart uploads under the store's prefix after `days` into
        the existing lifecycle rules, keeping every other rule, other prefixes' included (its ID is
        lifecycle.rule_id(ABORT_MPU_RULE_NAME, prefix); the plain ID an older version wrote for this
        prefix is replaced). Returns True if it changed the configuration. Read-modify-write: not
        atomic against another writer."""
        ...
