"""S3 Object Lock on boto3: the bucket's configuration, the probe that proves the server enforces it,
an object's retention as HEAD reports it, and extending it (docs/FORMAT.md, "Object Lock").

Setting the lock itself is not here: it travels with the write that creates the object version
(`ObjectLockMode` / `ObjectLockRetainUntilDate` among S3Store's put arguments).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ckptvault.store.botocore_errors import error_code, http_status
from ckptvault.store.port import Capabilities, LockStatus, Retention

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

LOCK_PROBE_KEY = "lock-probe"  # the probe's one key when it may not clean up
PROBE_SECONDS = 60  # how long the probe's own object stays locked where its cleanup may not bypass
_NO_LOCK = frozenset({"ObjectLockConfigurationNotFoundError", "NoSuchObjectLockConfiguration"})
# S3's refusal of a write into a locked bucket with neither Content-MD5 nor a checksum header
MISSING_INTEGRITY_HEADER = "MissingUploadObjectWithObjectLockHeaders"
_UNSUPPORTED = frozenset({"NotImplemented", "MethodNotAllowed"})


def put_args(retention: Retention | None) -> dict[str, Any]:
    """The PutObject / CreateMultipartUpload / CopyObject arguments that lock the new version."""
    if retention is None:
        return {}
    return {"ObjectLockMode": retention.mode, "ObjectLockRetainUntilDate": retention.until}


def content_md5(data: bytes | memoryview) -> str:
    """Content-MD5 of a body: S3 refuses a locked write without it or an x-amz-checksum-* header."""
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def needs_content_md5(caps: Capabilities, retention: Retention | None) -> bool:
    """Whether a write sends Content-MD5 of its body: S3 refuses a locked write (ours, or any write into
    a bucket whose default retention the server enforces this way) with neither it nor a checksum
    header. Where the server validates CRC32C every body already carries x-amz-checksum-crc32c; a
    bucket that asks for neither never pays the MD5 (41 ms a 32 MiB part on one core, where its CRC32C takes 2 ms)."""
    if caps.checksums_validated:
        return False
    return retention is not None or caps.integrity_header


def default_retention(bucket: LockStatus, written: datetime) -> Retention | None:
    """The retention the bucket's default gives a version written at `written` (None: no default):
    Days after it, or Years (a 29 February becomes the 28th in a year without one)."""
    if not bucket.enabled or bucket.default_mode is None:
        return None
    written = _aware(written)
    if bucket.default_days:
        return Retention.of(bucket.default_mode, written + timedelta(days=bucket.default_days))
    if bucket.default_years:
        year = written.year + bucket.default_years
        with contextlib.suppress(ValueError):
            return Retention.of(bucket.default_mode, written.replace(year=year))
        return Retention.of(bucket.default_mode, written.replace(year=year, day=28))
    return None


def from_head(head: Mapping[str, Any]) -> tuple[Retention | None, bool]:
    """(retention, legal hold) of the version a HeadObject response describes; also what a write's
    arguments ask for (put_args spells the lock with the same two keys)."""
    mode, until = head.get("ObjectLockMode"), head.get("ObjectLockRetainUntilDate")
    retention = Retention.of(str(mode), _aware(until)) if mode and isinstance(until, datetime) else None
    return retention, head.get("ObjectLockLegalHoldStatus") == "ON"


def carried(head: Mapping[str, Any]) -> dict[str, Any]:
    """The CopyObject / CreateMultipartUpload arguments that keep a version's lock on its copy: a copy
    gets the bucket's default retention (or none), never its source's, unless the request says so."""
    retention, held = from_head(head)
    return put_args(retention) | ({"ObjectLockLegalHoldStatus": "ON"} if held else {})


def keep_after_copy(client: S3Client, bucket: str, key: str, source: Mapping[str, Any]) -> None:
    """Give the version a copy just made the lock its source had (`source`: the source's HEAD), where
    the server dropped what the copy asked for: Ceph RGW 16.2 and moto drop the lock given at
    CreateMultipartUpload, as they do on an upload. One HEAD per copy of a locked object."""
    retention, held = from_head(source)
    if retention is None and not held:
        return
    have, have_held = from_head(client.head_object(Bucket=bucket, Key=key))
    if retention is not None:
        raise_to(client, bucket, key, retention, have)
    if held and not have_held:
        client.put_object_legal_hold(Bucket=bucket, Key=key, LegalHold={"Status": "ON"})


def status(client: S3Client, bucket: str) -> LockStatus:
    try:
        conf = client.get_object_lock_configuration(Bucket=bucket)["ObjectLockConfiguration"]
    except ClientError as e:
        if error_code(e) in _UNSUPPORTED or http_status(e) in (405, 501):
            return LockStatus(enabled=False, known=False)  # nothing to lock with, as far as anyone can tell
        if error_code(e) in _NO_LOCK or http_status(e) == 404:
            return LockStatus(enabled=False)
        raise
    rule = conf.get("Rule", {}).get("DefaultRetention", {})
    # S3 takes Days or Years, each at least 1; moto answers both, the one not given as 0
    days, years = int(rule.get("Days") or 0), int(rule.get("Years") or 0)
    return LockStatus(conf.get("ObjectLockEnabled") == "Enabled", rule.get("Mode"), days or None, years or None)


def probe_enforced(
    client: S3Client, bucket: str, prefix: str, *, validated_checksums: bool, cleanup: bool = True
) -> str | None:
    """None if the server refuses to delete a locked version; else what it did (see ObjectStore). With
    `cleanup=False` (credentials without s3:DeleteObject) the probe object is not removed and its key is
    always the same: each probe leaves one noncurrent version, unlocked 60 s later, which the bucket's
    noncurrent-version rule expires. The delete by version id is the probe itself and is still sent:
    its refusal is the answer."""
    key = f"{prefix}lock-{uuid.uuid4().hex}" if cleanup else f"{prefix}{LOCK_PROBE_KEY}"
    remove = _remove if cleanup else _keep
    data = b"ckptvault object lock probe\n"
    until = datetime.now(UTC) + timedelta(seconds=PROBE_SECONDS)
    lock = put_args(Retention("GOVERNANCE", until))
    integrity: dict[str, Any] = {} if validated_checksums else {"ContentMD5": content_md5(data)}
    put = client.put_object(Bucket=bucket, Key=key, Body=data, **lock, **integrity)
    version = put.get("VersionId")
    if not version or version == "null":
        remove(client, bucket, key, None)
        return "a locked PUT created no object version: versioning is off, so nothing can be locked"
    head = client.head_object(Bucket=bucket, Key=key)  # the current version: the one just written
    if from_head(head)[0] is None:
        remove(client, bucket, key, version)
        return "the server took the lock headers but reports no retention on the object (it ignores them)"
    try:
        # Credentials without s3:DeleteObjectVersion (the worker's policy) are refused by IAM before the
        # lock is consulted; on AWS, which enforces Object Lock, that is the same answer.
        client.delete_object(Bucket=bucket, Key=key, VersionId=version)
    except ClientError as e:
        if http_status(e) == 403 or error_code(e) == "AccessDenied":
            remove(client, bucket, key, version)
            return None
        raise
    return "the server deleted a version locked in GOVERNANCE mode without the bypass header"


def _keep(client: S3Client, bucket: str, key: str, version: str | None) -> None:
    """No cleanup: the credentials may not delete (the next probe writes the same key)."""


def _remove(client: S3Client, bucket: str, key: str, version: str | None) -> None:
    # Best effort: credentials without s3:BypassGovernanceRetention leave one small noncurrent
    # version, unlocked PROBE_SECONDS later.
    with contextlib.suppress(ClientError):
        if version is None:
            client.delete_object(Bucket=bucket, Key=key)
        else:
            client.delete_object(Bucket=bucket, Key=key, VersionId=version, BypassGovernanceRetention=True)


def extend(client: S3Client, bucket: str, key: str, retention: Retention) -> bool:
    """PutObjectRetention up to `retention`, only if that lengthens what the object has. The current
    retention comes from a HEAD (moto answers GetObjectRetention with a 500)."""
    return raise_to(client, bucket, key, retention, from_head(client.head_object(Bucket=bucket, Key=key))[0])


def raise_to(client: S3Client, bucket: str, key: str, retention: Retention, have: Retention | None) -> bool:
    """PutObjectRetention to `retention` unless `have` (the object's, as a HEAD saw it) already lasts
    as long; in COMPLIANCE if `have` is (`Retention.over`: S3 refuses to weaken the mode)."""
    want = retention.over(have)
    if want is None:
        return False
    client.put_object_retention(Bucket=bucket, Key=key, Retention={"Mode": want.mode, "RetainUntilDate": want.until})
    return True


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)
