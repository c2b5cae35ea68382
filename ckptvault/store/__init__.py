"""The object store: the port (what ckptvault needs from S3), its boto3 adapter and an in-memory one,
and the wrapper that retries transient errors under the port (docs/ARCHITECTURE.md, "The object store").

Only this package imports boto3/botocore.
"""

from ckptvault.store.errors import (
    ChecksumMismatchError,
    NotFoundError,
    ObjectFrozenError,
    PreconditionFailedError,
    StoreError,
    TransientStoreError,
)
from ckptvault.store.memory import MemoryStore
from ckptvault.store.port import (
    ABORT_MPU_RULE_NAME,
    ARCHIVE_CLASSES,
    CRC_TAG,
    Capabilities,
    FetchedRange,
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
from ckptvault.store.retrying import POLICY, RetryingStore, RetryPolicy
from ckptvault.store.s3 import S3Store, ensure_bucket, open_store
from ckptvault.store.s3_client import transfer_config

__all__ = [
    "ABORT_MPU_RULE_NAME",
    "ARCHIVE_CLASSES",
    "CRC_TAG",
    "POLICY",
    "Capabilities",
    "ChecksumMismatchError",
    "FetchedRange",
    "LockStatus",
    "MemoryStore",
    "NotFoundError",
    "ObjectFrozenError",
    "ObjectInfo",
    "ObjectStore",
    "ObjectVersion",
    "PreconditionFailedError",
    "ProgressFn",
    "RangeSource",
    "RestoreState",
    "Retention",
    "RetryPolicy",
    "RetryingStore",
    "S3Store",
    "SentPart",
    "SplitUpload",
    "StoreError",
    "TransferConfig",
    "TransientStoreError",
    "UploadResult",
    "ensure_bucket",
    "open_store",
    "transfer_config",
]
