"""What the in-memory store's file transfers (memory_transfer, memory_split, memory_framed) use of the
MemoryStore that calls them. Declared here, below them all, so that the store is one adapter whose
helpers take it as this and never import it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ckptvault.store.memory_multipart import Uploads
from ckptvault.store.port import ObjectInfo, Retention, TransferConfig


class MemoryBucket(Protocol):
    @property
    def bucket(self) -> str: ...

    @property
    def transfer(self) -> TransferConfig: ...

    @property
    def retention(self) -> Retention | None: ...  # the lock a new object is written with

    @property
    def uploads(self) -> Uploads: ...

    def where(self, key: str | None = None) -> str: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def get_range(self, key: str, start: int, end: int) -> tuple[bytes, int, str]: ...

    def put_bytes(self, key: str, data: bytes, *, tags: Mapping[str, str] | None = None) -> None: ...
