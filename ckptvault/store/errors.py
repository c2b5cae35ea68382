"""The store's errors: what every `ObjectStore` call raises (ckptvault/store/port.py), by kind.

Callers retry `TransientStoreError` only; the rest are answers (missing, lost a conditional write, bad
bytes, archived). The translation from botocore's exceptions is ckptvault/store/botocore_errors.py.
"""

from __future__ import annotations

from ckptvault.errors import CkptvaultError


class StoreError(CkptvaultError):
    """A store operation failed; the message names the bucket/key and, where known, the fix."""


class TransientStoreError(StoreError):
    """A failure worth retrying: network error, timeout, 5xx, throttling."""


class NotFoundError(StoreError):
    """The bucket or key does not exist."""


class PreconditionFailedError(StoreError):
    """A conditional write lost: the object already exists (If-None-Match: *)."""


class ChecksumMismatchError(StoreError):
    """Bytes read or written do not match the expected checksum. Never transient."""


class ObjectFrozenError(StoreError):
    """The object is in an archival class and must be restored before it can be read."""
