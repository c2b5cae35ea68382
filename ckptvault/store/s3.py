"""The S3 adapter: `ObjectStore` on boto3, for AWS S3 and S3-compatible servers (Ceph RGW,
SeaweedFS, MinIO, moto). The client, its settings and the probe of the server are
ckptvault/store/s3_client.py; the transfers are upload.py, download.py and framed.py.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Self

from botocore.exceptions import ClientError

from ckptvault.checksum import crc32c_update, from_b64, to_b64
from ckptvault.config import StoreConfig
from ckptvault.errors import InvalidArgumentError
from ckptvault.store import copy_stream, download, lifecycle, multipart, object_lock, split_upload, upload, versions
from ckptvault.store.botocore_errors import error_code, http_status, translate
from ckptvault.store.errors import ChecksumMismatchError, NotFoundError, PreconditionFailedError, StoreError
from ckptvault.store.limits import DELETE_BATCH
from ckptvault.store.port import (
    ARCHIVE_CLASSES,
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
    UploadResult,
)
from ckptvault.store.retrying import RetryingStore
from ckptvault.store.s3_client import S3Connection
from ckptvault.store.upload_request import UploadRequest

# A read-back streams the object through the CRC in chunks of this size: memory stays one chunk.
_READ_BACK_CHUNK = 8 * 1024 * 1024


class S3Store(S3Connection):
    """One bucket of an S3-like store (see ckptvault.store.port.ObjectStore for the contract)."""

    # Set on the view `as_of` returns: every read names the version current at that moment.
    _as_of: versions.PointInTime | None = None

    # -- a point in time (docs/object-lock.md, "After an attack") ----------------------------------

    def as_of(self, at: float) -> Self:
        other = self.with_retention(self.retention)
        other._as_of = versions.PointInTime(at)
        return other

    def pinned(self, chosen: Iterable[ObjectVersion]) -> Self:
        other = self.with_retention(self.retention)
        other._as_of = versions.PointInTime.fixed(chosen)
        return other

    def _pinned(self, key: str) -> dict[str, Any]:
        """The VersionId argument of a read of `key` in a point-in-time view ({} outside one)."""
        if self._as_of is None:
            return {}
        try:
            v = self._as_of.version(self.client, self.bucket, key)
        except Exception as e:
            raise self._err(e, "listing the versions of", key) from e
        if v is None:
            raise NotFoundError(f"s3://{self.bucket}/{key}: {self._as_of.absent_why()}")
        return {"VersionId": v.version_id}

    def _writable(self, op: str, key: str = "") -> None:
        if self._as_of is not None:
            where = f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"
            raise StoreError(f"{op} {where}: a point-in-time view of the store only reads")

    # -- objects ------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        try:
            pinned = self._pinned(key)
        except NotFoundError:
            return None
        try:
            h = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED", **pinned)
        except ClientError as e:
            if http_status(e) == 404:
                return None
            raise self._err(e, "reading metadata of", key) from e
        except Exception as e:
            raise self._err(e, "reading metadata of", key) from e
        etag = str(h.get("ETag", ""))
        retention, hold = object_lock.from_head(h)
        server = h.get("ChecksumCRC32C")
        whole_object = h.get("ChecksumType") == "FULL_OBJECT" or "-" not in etag
        return ObjectInfo(
            key=key,
            size=int(h["ContentLength"]),
            etag=etag,
            storage_class=h.get("StorageClass") or "STANDARD",
            last_modified=h["LastModified"].timestamp(),
            metadata=dict(h.get("Metadata", {})),
            restore=h.get("Restore"),
            server_crc32c=server if server and whole_object and "-" not in server else None,
            archive_status=h.get("ArchiveStatus"),
            retention=retention,
            legal_hold=hold,
        )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if self._as_of is not None:
            try:
                current = self._as_of.listing(self.client, self.bucket, prefix)
            except Exception as e:
                raise self._err(e, f"listing the versions under {prefix!r} in") from e
            for v in current:
                yield ObjectInfo(v.key, v.size, v.etag, v.storage_class or "STANDARD", v.last_modified)
            return
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        try:
            for page in pages:
                for o in page.get("Contents", []):
                    yield ObjectInfo(
                        key=o["Key"],
                        size=int(o["Size"]),
                        etag=str(o.get("ETag", "")),
                        storage_class=o.get("StorageClass") or "STANDARD",
                        last_modified=o["LastModified"].timestamp(),
                    )
        except Exception as e:
            raise self._err(e, f"listing {prefix!r} in") from e

    def _put_args(self, content_type: str = "application/octet-stream") -> dict[str, Any]:
        args: dict[str, Any] = {"ContentType": content_type}
        if self.cfg.sse != "none":
            args["ServerSideEncryption"] = self.cfg.sse
            if self.cfg.sse == "aws:kms" and self.cfg.sse_kms_key_id:
                args["SSEKMSKeyId"] = self.cfg.sse_kms_key_id
        # A replica's storage class (ReplicaConfig): every object it writes goes straight there, but
        # what `writing_in` keeps in another (its manifests)
        if self.write_class:
            args["StorageClass"] = self.write_class
        return args | object_lock.put_args(self.retention)

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        tags: Mapping[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        self._writable("writing", key)
        crc = to_b64(crc32c_update(data))
        args: dict[str, Any] = {**self._put_args(content_type), "Metadata": {"crc32c": crc}}
        caps = self.capabilities()
        if caps.checksums_validated:
            args["ChecksumCRC32C"] = crc
        elif object_lock.needs_content_md5(caps, self.retention):
            args["ContentMD5"] = object_lock.content_md5(data)
        if tags:
            args["Tagging"] = urllib.parse.urlencode(dict(tags), quote_via=urllib.parse.quote)
        if if_none_match:
            if caps.conditional_writes:
                args["IfNoneMatch"] = "*"
            elif self.head(key) is not None:
                # Without server-side conditional writes this check-then-put is racy: two writers
                # can both see "absent". Acceptable for manifests: same content from a rerun.
                raise PreconditionFailedError(f"writing s3://{self.bucket}/{key}: the object already exists")
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **args)
        except Exception as e:
            err = self._err(e, "writing", key)
            if isinstance(err, PreconditionFailedError) and self._is_our_write(key, len(data), crc):
                # botocore retried a conditional PUT whose first attempt the server applied but whose
                # response was lost (connection reset): the object there is ours, byte for byte.
                return
            raise err from e

    def _is_our_write(self, key: str, size: int, crc: str) -> bool:
        info = self.head(key)
        return info is not None and info.size == size and info.metadata.get("crc32c") == crc

    def get_bytes(self, key: str) -> bytes:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key, **self._pinned(key))
            data = resp["Body"].read()
        except Exception as e:
            raise self._err(e, "reading", key) from e
        stored = resp.get("Metadata", {}).get("crc32c")
        if stored and from_b64(stored) != crc32c_update(data):
            got = to_b64(crc32c_update(data))
            raise ChecksumMismatchError(
                f"reading s3://{self.bucket}/{key}: CRC32C mismatch: expected {stored}, got {got}"
            )
        return bytes(data)

    def read_crc32c(self, key: str) -> str:
        crc = 0
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key, **self._pinned(key))["Body"]
            for chunk in body.iter_chunks(_READ_BACK_CHUNK):
                crc = crc32c_update(chunk, crc)
        except Exception as e:
            raise self._err(e, "reading back", key) from e
        return to_b64(crc)

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes:
        if length < 1 or offset < 0 or offset + length > size:
            raise InvalidArgumentError(f"reading s3://{self.bucket}/{key}: range {offset}+{length} is not in 0..{size}")
        try:
            rng = f"bytes={offset}-{offset + length - 1}"
            resp = self.client.get_object(Bucket=self.bucket, Key=key, Range=rng, **self._pinned(key))
            data = resp["Body"].read()
        except Exception as e:
            raise self._err(e, "reading", key) from e
        total = str(resp.get("ContentRange", "")).rpartition("/")[2]
        if len(data) != length or (total.isdigit() and int(total) != size):
            raise ChecksumMismatchError(
                f"reading s3://{self.bucket}/{key}: expected {length} bytes at {offset} of an object of {size}, "
                f"got {len(data)} of {total or '?'}"
            )
        return bytes(data)

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
        self._writable("copying to", key)
        where = f"{source.bucket}/{source_key}"
        req = self._upload_request(Path(where), key, tags=tags, progress=progress)

        def read(offset: int, length: int) -> bytes:
            return source.read_range(source_key, offset, length, size=size)

        return copy_stream.copy_object(req, read, size=size, crc32c=crc32c, source=f"s3://{where}")

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
        self._writable("uploading to", key)
        req = self._upload_request(Path(path), key, tags=tags, sha256=sha256, progress=progress)
        if typesize is not None:
            from ckptvault.store import framed  # imports the codec library: only when compressing

            return framed.upload_framed(req, typesize)
        return upload.upload_file(req)

    def _upload_request(
        self,
        path: Path,
        key: str,
        *,
        tags: Mapping[str, str] | None = None,
        sha256: bool = False,
        progress: ProgressFn | None = None,
    ) -> UploadRequest:
        return UploadRequest(
            client=self.client,
            bucket=self.bucket,
            key=key,
            path=path,
            transfer=self.transfer,
            caps=self.capabilities(),
            put_args=self._put_args(),
            tags=tags,
            sha256=sha256,
            progress=progress,
            endpoint=self.endpoint,
            content_md5=object_lock.needs_content_md5(self.capabilities(), self.retention),
            bucket_lock=self._bucket_lock_if_defaulted(),
        )

    def _bucket_lock_if_defaulted(self) -> LockStatus | None:
        """The bucket's Object Lock configuration, read once per store, where the probe found the bucket
        asking for an integrity header (a default retention; upload_request.verify applies it where the
        server drops it) and the store writes without a lock of its own. None elsewhere: no call."""
        if self.retention is not None or not self.capabilities().integrity_header:
            return None
        if self._bucket_lock is None:
            self._bucket_lock = self.lock_status()
        return self._bucket_lock

    def begin_upload(
        self, path: Path, key: str, *, size: int, mtime: float, tags: Mapping[str, str] | None = None
    ) -> SplitUpload:
        self._writable("uploading to", key)
        return split_upload.begin(self._upload_request(Path(path), key, tags=tags), size, mtime)

    def upload_parts(
        self, upload: SplitUpload, first: int, count: int, *, progress: ProgressFn | None = None
    ) -> tuple[SentPart, ...]:
        self._writable("uploading to", upload.key)
        req = self._upload_request(Path(upload.path), upload.key, progress=progress)
        return split_upload.send(req, upload, first, count)

    def complete_upload(self, upload: SplitUpload, parts: Sequence[SentPart]) -> UploadResult:
        self._writable("completing an upload to", upload.key)
        req = self._upload_request(Path(upload.path), upload.key, tags=dict(upload.tags))
        return split_upload.finish(req, upload, parts)

    def abort_upload(self, upload: SplitUpload) -> None:
        self._writable("aborting an upload to", upload.key)
        multipart.abort(self._upload_request(Path(upload.path), upload.key), upload.upload_id)

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
        req = self.download_request(key, dest, size=size, crc32c=crc32c, progress=progress)
        if frames:
            from ckptvault.codec import Frame
            from ckptvault.store import framed

            framed.download_framed(req, [Frame(*f) for f in frames])
        else:
            download.download_file(req)

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
        req = self.download_request(key, dest, size=size, crc32c="", progress=progress)
        return download.download_range(req, offset, length)

    def download_request(
        self, key: str, dest: Path, *, size: int, crc32c: str, progress: ProgressFn | None = None
    ) -> download.DownloadRequest:
        """What download_file hands to ckptvault.store.download: this store's client, part size,
        shared connection budget and direct-I/O setting."""
        return download.DownloadRequest(
            client=self.client,
            bucket=self.bucket,
            key=key,
            dest=Path(dest),
            size=size,
            crc32c=crc32c,
            part_size=self.transfer.part_size,
            connections=self.download_connections,
            progress=progress,
            endpoint=self.endpoint,
            direct_io=self.cfg.direct_io,
            version_id=self._pinned(key).get("VersionId"),
        )

    def delete(self, key: str) -> None:
        self._writable("deleting", key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if http_status(e) != 404:
                raise self._err(e, "deleting", key) from e
        except Exception as e:
            raise self._err(e, "deleting", key) from e

    def delete_many(self, keys: Sequence[str]) -> dict[str, str]:
        # DeleteObjects: one round trip per DELETE_BATCH keys, where `delete` costs one per key
        self._writable("deleting in")
        failed: dict[str, str] = {}
        for i in range(0, len(keys), DELETE_BATCH):
            batch = list(keys[i : i + DELETE_BATCH])
            try:
                got = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            except Exception as e:
                raise self._err(e, f"deleting {len(batch)} objects from", batch[0]) from e
            for err in got.get("Errors", []):
                if err.get("Code") != "NoSuchKey":  # absent is not an error, as for `delete`
                    failed[str(err.get("Key"))] = f"{err.get('Code')}: {err.get('Message') or ''}".strip(": ")
        return failed

    def abort_multipart_uploads(self, prefix: str, older_than: float | None = None) -> int:
        self._writable("aborting uploads in")
        aborted = 0
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for u in page.get("Uploads", []):
                    started: datetime | None = u.get("Initiated")
                    if older_than is not None and started is not None and started.timestamp() >= older_than:
                        continue
                    try:
                        self.client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"])
                        aborted += 1
                    except ClientError as e:
                        if error_code(e) != "NoSuchUpload":  # completed or aborted meanwhile
                            raise
        except Exception as e:
            raise self._err(e, f"aborting incomplete uploads under {prefix!r} in") from e
        return aborted

    # -- Object Lock (docs/FORMAT.md, "Object Lock") ------------------------------------------------

    def lock_status(self) -> LockStatus:
        try:
            return object_lock.status(self.client, self.bucket)
        except Exception as e:
            raise self._err(e, "reading the Object Lock configuration of") from e

    def probe_lock_enforced(self) -> str | None:
        self._writable("probing Object Lock in")
        key = self._probe_prefix
        try:
            return object_lock.probe_enforced(
                self.client,
                self.bucket,
                key,
                validated_checksums=self.capabilities().checksums_validated,
                cleanup=self.cfg.flows_delete,
            )
        except Exception as e:
            raise self._err(e, "probing Object Lock at", key) from e

    def put_legal_hold(self, key: str, on: bool) -> None:
        self._writable("setting the legal hold of", key)
        try:
            self.client.put_object_legal_hold(Bucket=self.bucket, Key=key, LegalHold={"Status": "ON" if on else "OFF"})
        except Exception as e:
            raise self._err(e, "setting the legal hold of" if on else "clearing the legal hold of", key) from e

    def extend_retention(self, key: str, retention: Retention) -> bool:
        self._writable("extending the retention of", key)
        try:
            return object_lock.extend(self.client, self.bucket, key, retention)
        except Exception as e:
            raise self._err(e, f"extending the retention to {retention.until:%Y-%m-%d %H:%M} UTC of", key) from e

    # -- versions (docs/object-lock.md, "After an attack") -----------------------------------------

    def versioning(self) -> str | None:
        try:
            return versions.versioning_status(self.client, self.bucket)
        except Exception as e:
            raise self._err(e, "reading the versioning of") from e

    def list_versions(self, prefix: str) -> Iterator[ObjectVersion]:
        try:
            yield from versions.list_versions(self.client, self.bucket, prefix)
        except Exception as e:
            raise self._err(e, f"listing the versions under {prefix!r} in") from e

    def remove_delete_marker(self, key: str, version_id: str) -> None:
        self._writable("removing a delete marker of", key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key, VersionId=version_id)
        except ClientError as e:
            if http_status(e) == 404 or error_code(e) in ("NoSuchVersion", "NoSuchKey"):
                return  # removed by a run that was killed before it said so
            raise self._err(e, f"removing the delete marker {version_id} of", key) from e
        except Exception as e:
            raise self._err(e, f"removing the delete marker {version_id} of", key) from e

    # -- tiering, restore, tags, lifecycle --------------------------------------------------------

    def copy_storage_class(self, key: str, storage_class: str, size: int) -> None:
        # `size` is only a hint: the copy decides single vs multipart from the HEAD it makes anyway.
        self._writable("moving", key)
        try:
            upload.copy_in_place(self.client, self.bucket, key, storage_class, self._put_args(), self.transfer)
        except Exception as e:
            raise self._err(e, f"moving to storage class {storage_class}:", key) from e

    def restore_object(self, key: str, days: int, tier: str) -> RestoreState:
        info = self.head(key)
        if info is None:
            raise NotFoundError(f"restoring s3://{self.bucket}/{key}: not found")
        if info.restore and 'ongoing-request="true"' in info.restore:
            return "in_progress"
        if not info.frozen:
            archived = info.storage_class in ARCHIVE_CLASSES or info.archive_status is not None
            return "restored" if archived else "not_needed"
        request: Any = {"GlacierJobParameters": {"Tier": tier}}
        if info.archive_status is None:
            request["Days"] = days  # Intelligent-Tiering archive tiers refuse Days
        try:
            resp = self._signing_client().restore_object(
                Bucket=self.bucket, Key=key, RestoreRequest=request, **self._pinned(key)
            )
        except ClientError as e:
            if error_code(e) == "RestoreAlreadyInProgress":
                return "in_progress"
            if error_code(e) in ("NotImplemented", "MethodNotAllowed") or http_status(e) in (405, 501):
                raise StoreError(
                    f"restoring s3://{self.bucket}/{key}: the store at {self._at} does not implement "
                    "RestoreObject, so it cannot serve archival storage classes"
                ) from e
            raise self._err(e, "restoring", key) from e
        except Exception as e:
            raise self._err(e, "restoring", key) from e
        # 202: a new restore job; 200: a restored copy already exists (its expiry is extended).
        return "restored" if resp["ResponseMetadata"]["HTTPStatusCode"] == 200 else "requested"

    def put_tags(self, key: str, tags: Mapping[str, str]) -> None:
        self._writable("tagging", key)
        tagset: Any = [{"Key": k, "Value": v} for k, v in tags.items()]
        try:
            self.client.put_object_tagging(Bucket=self.bucket, Key=key, Tagging={"TagSet": tagset})
        except Exception as e:
            raise self._err(e, "tagging", key) from e

    def get_tags(self, key: str) -> dict[str, str]:
        try:
            resp = self.client.get_object_tagging(Bucket=self.bucket, Key=key)
        except Exception as e:
            raise self._err(e, "reading tags of", key) from e
        return {t["Key"]: t["Value"] for t in resp.get("TagSet", [])}

    def put_lifecycle(self, rules: LifecycleRules) -> None:
        self._writable("writing the lifecycle of")
        try:
            if rules:
                conf: Any = {"Rules": rules}
                self.client.put_bucket_lifecycle_configuration(Bucket=self.bucket, LifecycleConfiguration=conf)
            else:
                self.client.delete_bucket_lifecycle(Bucket=self.bucket)
        except Exception as e:
            raise self._err(e, "writing the lifecycle configuration of") from e

    def get_lifecycle(self) -> LifecycleRules:
        try:
            resp = self.client.get_bucket_lifecycle_configuration(Bucket=self.bucket)
        except ClientError as e:
            if error_code(e) == "NoSuchLifecycleConfiguration" or http_status(e) == 404:
                return []
            raise self._err(e, "reading the lifecycle configuration of") from e
        except Exception as e:
            raise self._err(e, "reading the lifecycle configuration of") from e
        return [dict(r) for r in resp.get("Rules", [])]

    def ensure_abort_incomplete_mpu_rule(self, days: int = 1) -> bool:
        self._writable("writing the lifecycle of")
        merged = lifecycle.with_abort_mpu_rule(self.get_lifecycle(), self.cfg.prefix, days)
        if merged is None:
            return False  # already in place: do not rewrite the bucket config
        self.put_lifecycle(merged)
        return True


def open_store(cfg: StoreConfig) -> ObjectStore:
    """The store of `cfg`: its adapter under the one retry policy of store I/O (ckptvault/store/retrying.py),
    so that every caller, in whichever process it runs, retries transient errors the same way."""
    return RetryingStore(S3Store(cfg))


def ensure_bucket(cfg: StoreConfig) -> S3Store:
    """Create the bucket if it does not exist (the demo's and a first user's convenience); an existing
    bucket is left exactly as it is."""
    store = S3Store(cfg)
    try:
        store.check_bucket()
        return store
    except NotFoundError:
        pass
    try:
        if cfg.region and cfg.region != "us-east-1":
            store.client.create_bucket(Bucket=cfg.bucket, CreateBucketConfiguration={"LocationConstraint": cfg.region})  # type: ignore[typeddict-item]
        else:
            store.client.create_bucket(Bucket=cfg.bucket)
    except Exception as e:
        raise translate(e, op="creating", bucket=cfg.bucket, key=None, endpoint=store.endpoint) from e
    return store
