"""The combined snapshot (docs/FORMAT.md, "The combined snapshot"): every run's current state in one
Parquet object under `_catalog/_combined/`, with, per run, the keys whose content its rows are the fold
of. A reader of every run takes a run's rows from it when its partition lists nothing else, so `ls`
of 1,000 runs is one GET instead of 1,000 (bench/README.md)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckptvault.catalog.codec import _to_bytes
from ckptvault.catalog.fold import _STATE_FIELDS
from ckptvault.catalog.layout import _Part
from ckptvault.catalog.model import CatalogError, CheckpointState
from ckptvault.catalog.snapshot import _ADDED, _SNAPSHOT_SCHEMA, SNAPSHOT_TAG

COMBINED_TAG = b"ckptvault.catalog-combined/1"
COMBINED_DIR = "_combined/"  # starts with "_": dataset readers of `_catalog/` skip it (FORMAT.md)
# A per-run snapshot's state columns: no reader folds on top of the combined one, so no identities.
_SCHEMA = pa.schema([_SNAPSHOT_SCHEMA.field(n) for n in _STATE_FIELDS])
_ORDER = [("run", "ascending"), ("step", "ascending"), ("save", "ascending")]


@dataclass(frozen=True)
class RunCover:
    covers: frozenset[str]  # the per-run keys whose content the run's rows are the fold of
    events: int  # distinct events in that content


@dataclass
class Combined:
    key: str
    runs: dict[str, RunCover]
    data: bytes

    def covers(self, run: str, part: _Part) -> bool:
        """Whether every key the listing shows in `run`'s partition is in what its rows fold: then
        they are the run's current state (event content never leaves the log)."""
        c = self.runs.get(run)
        return c is not None and all(k in c.covers for k in (*part.events, *part.snapshots))

    def table(self, columns: Sequence[str], runs: Collection[str]) -> pa.Table:
        """The rows of `runs`, only `columns` read, in (run, step, save) order."""
        pf = pq.ParquetFile(pa.BufferReader(self.data))
        have = set(pf.schema_arrow.names)
        t = pf.read(columns=[c for c in columns if c in have])
        for c in columns:
            if c not in have:  # a column newer than this object: its default
                t = t.append_column(c, pa.repeat(pa.scalar(_ADDED[c], _SCHEMA.field(c).type), t.num_rows))
        t = t.select(list(columns))
        if len(runs) < len(self.runs):
            t = t.filter(pc.is_in(t["run"], value_set=pa.array(sorted(runs), pa.string())))
        return t

    def states(self, runs: Collection[str]) -> dict[str, list[CheckpointState]]:
        """The states of `runs`, by run, each in (step, save) order."""
        cols = self.table(_STATE_FIELDS, runs).to_pydict()
        cols["metrics"] = json.loads("[" + ",".join(cols["metrics"]) + "]")  # one parse for the column
        out: dict[str, list[CheckpointState]] = {}
        make = object.__new__
        for row in zip(*(cols[n] for n in _STATE_FIELDS), strict=True):
            # straight into the instance, as read_snapshot does (the frozen __init__ is most of the cost)
            s = make(CheckpointState)
            s.__dict__.update(zip(_STATE_FIELDS, row, strict=True))
            out.setdefault(s.run, []).append(s)
        return out


def read_combined(key: str, data: bytes) -> Combined:
    """One combined snapshot; CatalogError naming `key` when it is not a readable one."""
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        meta = pf.schema_arrow.metadata or {}
        if meta.get(b"schema") != COMBINED_TAG:
            raise CatalogError(f"{key}: not a combined catalog snapshot")
        runs = {
            str(r): RunCover(frozenset(str(k) for k in v["covers"]), int(v["events"]))
            for r, v in json.loads(meta[b"ckptvault.runs"]).items()
        }
        have = set(pf.schema_arrow.names)
        lost = [c for c in _STATE_FIELDS if c not in have and c not in _ADDED]
        if lost:
            raise KeyError(lost[0])
    except CatalogError:
        raise
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError, AttributeError) as e:
        raise CatalogError(f"{key}: not a readable combined snapshot ({e})") from None
    return Combined(key, runs, data)


def from_snapshot(key: str, data: bytes) -> tuple[pa.Table, RunCover]:
    """A per-run snapshot's rows in the combined schema, and what they cover: the snapshot itself and
    the event files it covers. CatalogError when it is not a readable snapshot."""
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        meta = pf.schema_arrow.metadata or {}
        if meta.get(b"schema") != SNAPSHOT_TAG:
            raise CatalogError(f"{key}: not a catalog snapshot")
        covers = [str(k) for k in json.loads(meta[b"ckptvault.covers"])]
        have = set(pf.schema_arrow.names)
        t = pf.read(columns=[c for c in [*_STATE_FIELDS, "_rows"] if c in have])
        events = int(pc.sum(pc.list_value_length(t["_rows"])).as_py() or 0)
        for c, d in _ADDED.items():
            if c not in have:
                t = t.append_column(c, pa.repeat(pa.scalar(d, _SCHEMA.field(c).type), t.num_rows))
        t = t.select(_STATE_FIELDS).cast(_SCHEMA)
    except CatalogError:
        raise
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as e:
        raise CatalogError(f"{key}: not a readable snapshot ({e})") from None
    return t, RunCover(frozenset([key, *covers]), events)


def combined_bytes(prev: pa.Table | None, fresh: dict[str, pa.Table], runs: dict[str, RunCover]) -> bytes:
    """The combined snapshot of `runs`: each run's rows from `fresh`, else from `prev` (a previous
    combined snapshot's rows, in its (run, step, save) order). Slices of `prev`, not a filtered and
    sorted copy: it is most of the memory a compaction holds (bench/README.md)."""
    pieces: list[pa.Table] = []
    spans: dict[str, tuple[int, int]] = {}
    if prev is not None and prev.num_rows:
        prev = prev.replace_schema_metadata(None).cast(_SCHEMA)
        idx = pc.dictionary_encode(prev["run"].combine_chunks()).indices.to_numpy()
        if (np.diff(idx) < 0).any():  # not written by this code: sort once
            prev = prev.take(pc.sort_indices(prev, sort_keys=_ORDER))
            idx = pc.dictionary_encode(prev["run"].combine_chunks()).indices.to_numpy()
        cut = [0, *(np.flatnonzero(np.diff(idx)) + 1).tolist(), len(idx)]
        names = prev["run"].take(pa.array(cut[:-1], pa.int64())).to_pylist()
        spans = {r: (a, b - a) for r, a, b in zip(names, cut[:-1], cut[1:], strict=True)}
    for r in sorted(runs):
        if r in fresh:
            t = fresh[r].cast(_SCHEMA)
            pieces.append(t.take(pc.sort_indices(t, sort_keys=_ORDER[1:])))
        elif prev is not None and r in spans:
            pieces.append(prev.slice(*spans[r]))
    t = pa.concat_tables(pieces) if pieces else _SCHEMA.empty_table()
    doc = {r: {"covers": sorted(c.covers), "events": c.events} for r, c in sorted(runs.items())}
    return _to_bytes(t.replace_schema_metadata({b"schema": COMBINED_TAG, b"ckptvault.runs": json.dumps(doc)}))
