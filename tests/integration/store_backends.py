"""The backends of the store conformance suite (test_store_conformance.py): an S3Store on a real
server, or a MemoryStore, and what each test does behind the adapter's back on each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ckptvault.config import StoreConfig
from ckptvault.store import S3Store
from ckptvault.store.memory import MemoryStore
from tests.servers import S3Endpoint


def server_store(endpoint: Any, bucket: str, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> S3Store:
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    fields: dict[str, Any] = {
        "bucket": bucket,
        "endpoint_url": endpoint.url,
        "region": endpoint.region,
        "part_size_mb": 5,
        "max_concurrency": 2,  # two cores shared with the server
        **overrides,
    }
    return S3Store(StoreConfig(**fields))


@dataclass
class Backend:
    """One store under test: a real server (`endpoint`), or the in-memory store (`endpoint` None)."""

    kind: str
    endpoint: S3Endpoint | None
    bucket_factory: Callable[[Any], str]
    monkeypatch: pytest.MonkeyPatch
    _memory: dict[str, MemoryStore] = field(default_factory=dict)

    def bucket(self) -> str:
        if self.endpoint is None:
            return f"memory-{len(self._memory)}"  # one MemoryStore is one bucket, made by store()
        return self.bucket_factory(self.endpoint)

    def store(self, bucket: str | None = None, **overrides: Any) -> Any:
        """An S3Store or a MemoryStore (typed Any: tests reach past the port to each one's own API)."""
        bucket = bucket or self.bucket()
        if self.endpoint is not None:
            return server_store(self.endpoint, bucket, self.monkeypatch, **overrides)
        cfg = StoreConfig(bucket=bucket, part_size_mb=5, max_concurrency=2, **overrides)  # as server_store's
        root = self._memory.get(bucket)
        if root is None:
            root = self._memory[bucket] = MemoryStore.for_config(cfg)
            return root
        return root.under(cfg.prefix)  # a second store of the same bucket

    # What the tests do behind the adapter's back: the raw boto3 client on a server, the memory
    # store's own S3-like calls on memory.

    def overwrite(self, store: Any, key: str, data: bytes) -> None:
        if self.endpoint is None:
            store.put_bytes(key, data)
        else:
            store.client.put_object(Bucket=store.bucket, Key=key, Body=data)

    def start_upload(self, store: Any, key: str) -> None:
        if self.endpoint is None:
            store.uploads.create(key)
        else:
            store.client.create_multipart_upload(Bucket=store.bucket, Key=key)

    def incomplete_uploads(self, store: Any, prefix: str) -> list[str]:
        if self.endpoint is None:
            return [u.key for u in store.uploads.list(prefix)]
        return [
            u["Key"] for u in store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=prefix).get("Uploads", [])
        ]
