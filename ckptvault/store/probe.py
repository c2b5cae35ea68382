"""Capability detection: what this S3-compatible server really does, learnt by trying it.

A handful of requests under `<probe_prefix><uuid>` (deleted afterwards; with `delete=False`, for
credentials without s3:DeleteObject, under `<probe_prefix>capabilities` every time, left there and
overwritten by the next probe, so they do not pile up):
- checksums_validated: PUT with a correct x-amz-checksum-crc32c must succeed and a deliberately
  wrong one must fail (BadDigest / InvalidRequest). Servers that ignore the header (Ceph, moto)
  accept both; a server that rejects even the correct one is treated as not validating, so we never
  send it a checksum header.
- full_object_checksums: a one-part multipart upload with ChecksumType=FULL_OBJECT, completed with
  a wrong whole-object CRC32C, must fail. Only probed where checksums are validated.
- integrity_header: the PUT without a checksum header is refused with
  MissingUploadObjectWithObjectLockHeaders (a bucket default retention on moto, as AWS documents): it is
  sent again with Content-MD5, as is every later probe PUT and every write of the store.
- conditional_writes: a second PUT with If-None-Match: * must fail with 412.
- restore_object: RestoreObject on the (STANDARD) probe object. NotImplemented / 405 / 501 mean
  the server lacks it; InvalidObjectState ("not archived") means it is implemented (AWS, moto).
- lifecycle_transitions is NOT probed: that would mean writing the bucket's lifecycle configuration,
  which may hold the user's rules and which S3 can only replace whole. It follows the server kind
  (aws/ceph/moto/minio True, seaweedfs False; unknown kinds False so we never rely on it blindly).

The server kind comes from the configuration, or from response headers when it is "auto".
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.store.botocore_errors import error_code, http_status, translate
from ckptvault.store.object_lock import MISSING_INTEGRITY_HEADER, content_md5
from ckptvault.store.port import Capabilities

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

_TRANSITIONS_BY_KIND = {"aws": True, "ceph": True, "moto": True, "minio": True, "seaweedfs": False}
REUSED_KEY = "capabilities"  # the probe's key when it may not delete (a second PUT with If-None-Match
# still finds it there, which is what the conditional-write check needs)
_REJECTED_CHECKSUM = frozenset({"BadDigest", "InvalidRequest", "InvalidDigest", "XAmzContentChecksumMismatch"})


def kind_from_headers(headers: Mapping[str, str], endpoint_url: str | None) -> str:
    """Guess the server from the headers of any response (head_bucket's will do)."""
    if endpoint_url is None:
        return "aws"
    h = {k.lower(): v for k, v in headers.items()}
    server = h.get("server", "").lower()
    if "seaweedfs" in server:
        return "seaweedfs"
    if "minio" in server:
        return "minio"
    if "werkzeug" in server or "amazon.com" in server or "x-amzn-requestid" in h:
        return "moto"
    if "amazons3" in server:
        return "aws"
    if h.get("x-amz-request-id", "").startswith("tx0"):
        return "ceph"  # RGW transaction ids: tx000...-<hex>-<zone>
    return "unknown"


def detect_capabilities(
    client: S3Client,
    bucket: str,
    probe_prefix: str,
    *,
    kind: str = "unknown",
    endpoint: str | None = None,
    delete: bool = True,
) -> Capabilities:
    key = f"{probe_prefix}{uuid.uuid4().hex}" if delete else f"{probe_prefix}{REUSED_KEY}"
    data = b"ckptvault capability probe\n"
    good = to_b64(crc32c_update(data))
    bad = to_b64(crc32c_update(data) ^ 0xFFFFFFFF)
    integrity = False
    try:
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumCRC32C=good)
            accepts_checksum = True
        except ClientError as e:
            if http_status(e) not in (400, 501):
                raise
            accepts_checksum = False
            integrity = _put_unchecksummed(client, bucket, key, data)
        validated = accepts_checksum and _rejects_wrong_checksum(client, bucket, f"{key}-bad", data, bad)
        full_object = validated and _full_object_checksums(client, bucket, f"{key}-mpu", data, bad)
        md5: dict[str, Any] = {"ContentMD5": content_md5(data)} if integrity else {}
        conditional = _conditional_writes(client, bucket, key, data, md5)
        restore = _restore_implemented(client, bucket, key)
    except ClientError as e:
        raise translate(e, op="probing capabilities at", bucket=bucket, key=key, endpoint=endpoint) from e
    finally:
        if delete:
            _cleanup(client, bucket, (key, f"{key}-bad", f"{key}-mpu"))
    return Capabilities(
        checksums_validated=validated,
        conditional_writes=conditional,
        restore_object=restore,
        lifecycle_transitions=_TRANSITIONS_BY_KIND.get(kind, False),
        full_object_checksums=full_object,
        kind=kind,
        integrity_header=integrity,
    )


def _put_unchecksummed(client: S3Client, bucket: str, key: str, data: bytes) -> bool:
    """PUT the probe object without a checksum header; True if the bucket wanted Content-MD5 instead.
    A bucket with a default retention refuses such a PUT where the server (moto; AWS as documented)
    takes the lock as asking for an integrity header: it is sent again once with Content-MD5, and every
    write of this store then carries one where it carries no validated CRC32C."""
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data)
    except ClientError as e:
        if error_code(e) != MISSING_INTEGRITY_HEADER:
            raise
        client.put_object(Bucket=bucket, Key=key, Body=data, ContentMD5=content_md5(data))
        return True
    return False


def _rejects_wrong_checksum(client: S3Client, bucket: str, key: str, data: bytes, bad: str) -> bool:
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, ChecksumCRC32C=bad)
    except ClientError as e:
        if error_code(e) in _REJECTED_CHECKSUM or http_status(e) == 400:
            return True
        raise
    return False


def _full_object_checksums(client: S3Client, bucket: str, key: str, data: bytes, bad: str) -> bool:
    part_crc = to_b64(crc32c_update(data))
    try:
        mpu = client.create_multipart_upload(
            Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32C", ChecksumType="FULL_OBJECT"
        )
    except ClientError:
        return False
    upload_id = mpu["UploadId"]
    try:
        part = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=data, ChecksumCRC32C=part_crc
        )
        client.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            ChecksumCRC32C=bad,
            ChecksumType="FULL_OBJECT",
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"], "ChecksumCRC32C": part_crc}]},
        )
    except ClientError as e:
        return error_code(e) in _REJECTED_CHECKSUM
    finally:
        with contextlib.suppress(ClientError):  # already completed or gone: nothing to abort
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    return False  # accepted a wrong whole-object checksum


def _conditional_writes(client: S3Client, bucket: str, key: str, data: bytes, md5: Mapping[str, Any]) -> bool:
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*", **md5)
    except ClientError as e:
        if http_status(e) == 412 or error_code(e) == "PreconditionFailed":
            return True
        if http_status(e) in (400, 501) or error_code(e) == "NotImplemented":
            return False
        raise
    return False


def _restore_implemented(client: S3Client, bucket: str, key: str) -> bool:
    try:
        client.restore_object(
            Bucket=bucket, Key=key, RestoreRequest={"Days": 1, "GlacierJobParameters": {"Tier": "Standard"}}
        )
    except ClientError as e:
        if error_code(e) in ("NotImplemented", "MethodNotAllowed") or http_status(e) in (405, 501):
            return False
        if error_code(e) in ("InvalidObjectState", "RestoreAlreadyInProgress"):
            return True
        raise
    return True


def _cleanup(client: S3Client, bucket: str, keys: tuple[str, ...]) -> None:
    for k in keys:
        with contextlib.suppress(ClientError):  # best effort: a leftover probe object is tiny
            client.delete_object(Bucket=bucket, Key=k)
