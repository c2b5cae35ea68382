"""`Catalog.stats` bytes per storage class: the files' original sizes and what their objects occupy
(compressed saves smaller), on the in-memory store."""

from __future__ import annotations

import time

from ckptvault.catalog import Catalog, Event
from ckptvault.store import MemoryStore


def _saved(run: str, step: int, at: float, nbytes: int, stored: int, cls: str = "STANDARD") -> list[Event]:
    return [
        Event(run, step, "uploaded", at, bytes=nbytes, files=2, storage_class=cls, stored_bytes=stored),
        Event(run, step, "verified", at + 1),
    ]


def test_stats_report_original_and_stored_bytes_per_class() -> None:
    cat = Catalog(MemoryStore("b"), "vault")
    cat.append([
        *_saved("a", 1, 100.0, 1000, 0),  # stored as it is: stored_bytes 0 means "the same"
        *_saved("a", 2, 200.0, 4000, 2500),  # compressed
        *_saved("b", 1, 300.0, 8000, 5000, "GLACIER_IR"),
        *_saved("b", 2, 400.0, 9000, 6000, "GLACIER_IR"),
        Event("b", 2, "expired", 500.0),  # gone from the store: in neither column
    ])  # fmt: skip
    cat.compact(time.time() + 10, runs=["a"])  # one run from its snapshot, one from its event file
    st = cat.stats()
    assert st.by_class == {"STANDARD": (2, 5000), "GLACIER_IR": (1, 8000)}
    assert st.stored_by_class == {"STANDARD": 3500, "GLACIER_IR": 5000}
    assert st.as_dict()["by_class"] == {
        "GLACIER_IR": {"checkpoints": 1, "bytes": 8000, "stored_bytes": 5000},
        "STANDARD": {"checkpoints": 2, "bytes": 5000, "stored_bytes": 3500},
    }
