"""A partition's snapshot (docs/FORMAT.md, "Snapshots"): one row per checkpoint save of its folded
state, the sort key of the last event folded into each, and the identities of every event it covers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckptvault.catalog.codec import _to_bytes
from ckptvault.catalog.fold import _STATE_FIELDS, replicas_column, replicas_from_column, written_by_from_column
from ckptvault.catalog.model import CatalogError, CheckpointState

SNAPSHOT_TAG = b"ckptvault.catalog-snapshot/1"

_SNAPSHOT_SCHEMA = pa.schema(
    [
        ("run", pa.string()), ("step", pa.int64()), ("format", pa.string()), ("last_event", pa.string()),
        ("bytes", pa.int64()), ("files", pa.int64()), ("storage_class", pa.string()),
        ("created_at", pa.float64()), ("uploaded_at", pa.float64()), ("verified", pa.bool_()),
        ("local_evicted", pa.bool_()), ("last_drill_at", pa.float64()), ("last_drill_ok", pa.bool_()),
        ("metrics", pa.string()), ("updated_at", pa.float64()), ("detail", pa.string()),
        ("class_since", pa.float64()), ("save", pa.int64()), ("superseded", pa.bool_()),
        ("superseded_reason", pa.string()), ("scheduled_class", pa.string()), ("scheduled_at", pa.float64()),
        ("fingerprint", pa.string()), ("stored_bytes", pa.int64()), ("locked_until", pa.float64()),
        ("legal_hold", pa.bool_()), ("replicas", pa.string()), ("rpo_seconds", pa.float64()),
        ("model_bytes", pa.int64()), ("optimizer_bytes", pa.int64()), ("written_by", pa.string()),
        ("_last_at", pa.float64()),
        ("_last_origin", pa.string()),
        ("_last_row", pa.int64()), ("_origins", pa.list_(pa.string())), ("_rows", pa.list_(pa.int64())),
    ],
    metadata={b"schema": SNAPSHOT_TAG},
)  # fmt: skip
_STATE_COLUMNS = [*_STATE_FIELDS, "_last_at", "_last_origin", "_last_row"]
# Compat: reads snapshots written before these columns (what their absence means); may go: never
_ADDED: dict[str, Any] = {
    "stored_bytes": 0, "locked_until": None, "legal_hold": False, "replicas": "", "rpo_seconds": None,
    "model_bytes": None, "optimizer_bytes": None, "written_by": "{}",
}  # fmt: skip


@dataclass
class _Snapshot:
    key: str
    covers: set[str]
    states: dict[tuple[int, int], tuple[CheckpointState, tuple[float, str, int]]]
    data: bytes

    def ids(self) -> set[tuple[str, int]]:
        t = pq.ParquetFile(pa.BufferReader(self.data)).read(columns=["_origins", "_rows"])
        o = pc.list_flatten(t["_origins"]).to_pylist()
        r = pc.list_flatten(t["_rows"]).to_pylist()
        return set(zip(o, r, strict=True))

    def count(self) -> int:
        """How many events it covers."""
        t = pq.ParquetFile(pa.BufferReader(self.data)).read(columns=["_rows"])
        return int(pc.sum(pc.list_value_length(t["_rows"])).as_py() or 0)


def read_snapshot(key: str, data: bytes) -> _Snapshot:
    """One snapshot object; CatalogError naming `key` when it is not a readable snapshot."""
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        meta = pf.schema_arrow.metadata or {}
        if meta.get(b"schema") != SNAPSHOT_TAG:
            raise CatalogError(f"{key}: not a catalog snapshot")
        covers = set(json.loads(meta[b"ckptvault.covers"]))
        # a column added after a snapshot was written (stored_bytes) reads as its default
        have = set(pf.schema_arrow.names)
        cols = pf.read(columns=[c for c in _STATE_COLUMNS if c in have]).to_pydict()
        n = pf.metadata.num_rows
        for c in _STATE_COLUMNS:
            if c not in have and c in _ADDED:
                cols[c] = [_ADDED[c]] * n
    except (pa.ArrowInvalid, OSError, KeyError, ValueError) as e:
        raise CatalogError(f"{key}: not a readable snapshot ({e})") from None
    # one json.loads for the column: per-row calls were a tenth of `ls` over 200,000 saves
    cols["metrics"] = json.loads("[" + ",".join(cols["metrics"]) + "]")
    cols["written_by"] = written_by_from_column(cols["written_by"])
    cols["replicas"] = replicas_from_column(cols["replicas"])
    states = {}
    make = object.__new__
    for row in zip(*(cols[n] for n in _STATE_COLUMNS), strict=True):
        # The fields straight into the instance: the frozen dataclass's __init__ sets each of its 24
        # fields through object.__setattr__, most of the cost of reading a snapshot. The row is the
        # snapshot's own columns in field order, which __init__ would take unchecked as well.
        s = make(CheckpointState)
        s.__dict__.update(zip(_STATE_FIELDS, row, strict=False))  # the row ends with the 3 _last_* too
        states[(s.step, s.save)] = (s, (row[-3], row[-2], row[-1]))
    return _Snapshot(key, covers, states, data)


def _snapshot_bytes(cols: dict[str, list[Any]], covers: Sequence[str]) -> bytes:
    data = {n: cols[n] for n in _STATE_COLUMNS}
    data["metrics"] = [json.dumps(m) for m in cols["metrics"]]
    data["written_by"] = [json.dumps(w) for w in cols["written_by"]]
    data["replicas"] = replicas_column(cols["replicas"])
    origins, rows = cols["_ids"]
    schema = _SNAPSHOT_SCHEMA.with_metadata({b"schema": SNAPSHOT_TAG, b"ckptvault.covers": json.dumps(list(covers))})
    table = pa.Table.from_pydict({**data, "_origins": origins, "_rows": rows}, schema=schema)
    return _to_bytes(table)
