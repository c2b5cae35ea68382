"""botocore exceptions -> ckptvault StoreError subclasses, with messages an operator can act on.

Every message names the bucket (and key) and, where we know it, the fix. Credentials never appear:
botocore's own messages do not contain secrets, and we only ever name the *source* of credentials.
Transient means "retrying the same call may succeed": network errors, timeouts, 5xx, throttling.
botocore has already retried those (standard mode, 5 attempts) by the time we see them.
"""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from ckptvault.store.errors import (
    ChecksumMismatchError,
    NotFoundError,
    ObjectFrozenError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
)

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "RequestLimitExceeded",
        "OperationAborted",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchUpload"})
_CHECKSUM_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "XAmzContentSHA256Mismatch"})
_AUTH_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden", "ExpiredToken"}
)
_NETWORK_ERRORS = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ReadTimeoutError,
    ConnectionClosedError,
    IncompleteReadError,
    ResponseStreamingError,
)

CREDENTIALS_HINT = (
    "Check the credentials boto3 finds (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the "
    "instance/pod role) and that they may use this bucket"
)


def error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def http_status(exc: BaseException) -> int:
    if isinstance(exc, ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return 0


def is_transient(exc: BaseException) -> bool:
    """Whether a raw botocore/network exception is worth retrying."""
    if isinstance(exc, (*_NETWORK_ERRORS, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, ClientError):
        return error_code(exc) in _TRANSIENT_CODES or (http_status(exc) >= 500 and not _not_implemented(exc))
    return False


def _not_implemented(exc: ClientError) -> bool:
    return error_code(exc) in ("NotImplemented", "MethodNotAllowed") or http_status(exc) in (405, 501)


def where(bucket: str, key: str | None) -> str:
    return f"s3://{bucket}/{key}" if key else f"bucket {bucket}"


def translate(
    exc: BaseException, *, op: str, bucket: str, key: str | None = None, endpoint: str | None = None
) -> StoreError:
    """A StoreError subclass for `exc` (raise it `from exc`). `op` is a short verb phrase."""
    if isinstance(exc, StoreError):
        return exc
    target = where(bucket, key)
    at = endpoint or "AWS S3"
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return StoreError(
            f"{op} {target}: no usable S3 credentials were found. Set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with an instance/pod role"
        )
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
        return TransientStoreError(
            f"{op} {target}: cannot reach the object store at {at} ({_reason(exc)}). "
            "Is the server running? Check [store].endpoint_url"
        )
    if isinstance(exc, (*_NETWORK_ERRORS, ConnectionError, TimeoutError)):
        return TransientStoreError(f"{op} {target}: network error talking to {at}: {exc}")
    if isinstance(exc, ClientError):
        return _client_error(exc, op=op, target=target, at=at, bucket=bucket, key=key)
    if isinstance(exc, BotoCoreError):
        return StoreError(f"{op} {target}: {exc}")
    return StoreError(f"{op} {target}: {type(exc).__name__}: {exc}")


def _reason(exc: BaseException) -> str:
    # EndpointConnectionError's own text hides the cause; urllib3's error in kwargs names it.
    text = f"{exc} {getattr(exc, 'kwargs', {}).get('error', '')}".lower()
    if "refused" in text:
        return "connection refused"
    if "timed out" in text or isinstance(exc, ConnectTimeoutError):
        return "connection timed out"
    if "name or service not known" in text or "nodename" in text:
        return "host name does not resolve"
    return str(exc)


def _client_error(exc: ClientError, *, op: str, target: str, at: str, bucket: str, key: str | None) -> StoreError:
    code = error_code(exc)
    status = http_status(exc)
    server_msg = exc.response.get("Error", {}).get("Message") or code or f"HTTP {status}"
    detail = f"{code or status}: {server_msg}" if code and server_msg != code else str(server_msg)
    if code == "NoSuchBucket" or (status == 404 and key is None):
        return NotFoundError(
            f"{op}: bucket {bucket} does not exist at {at}. Create it (aws s3 mb s3://{bucket}) or fix [store].bucket"
        )
    if code in _NOT_FOUND_CODES or status == 404:
        return NotFoundError(f"{op} {target}: not found ({detail})")
    if code == "PreconditionFailed" or status == 412:
        return PreconditionFailedError(f"{op} {target}: the object already exists (If-None-Match: *)")
    if code in ("InvalidObjectState", "ObjectNotInActiveTierError"):
        return ObjectFrozenError(
            f"{op} {target}: the object is in an archival storage class and cannot be read until it "
            "is restored; issue RestoreObject (ckptvault restore does) and wait for it to complete"
        )
    if code in _CHECKSUM_CODES:
        return ChecksumMismatchError(f"{op} {target}: the server rejected the bytes' checksum ({detail})")
    if code in _AUTH_CODES or status == 403:
        return StoreError(f"{op} {target}: access denied by {at} ({code or status}). {CREDENTIALS_HINT}")
    if is_transient(exc):
        return TransientStoreError(f"{op} {target}: {at} is unavailable or throttling ({detail}); retry later")
    return StoreError(f"{op} {target}: {detail}")
