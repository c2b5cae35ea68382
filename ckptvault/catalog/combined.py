"""The combined snapshot (docs/FORMAT.md, "The combined snapshot"): every run's current state in one
Parquet object under `_catalog/_combined/`, with, per run, the keys whose content its rows are the fold
of. A reader of every run takes a run's rows from it when its partition lists nothing else, so `ls`
of 1,000 runs is one GET instead of 1,000 (bench/README.md)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckptvault.catalog.fold import _STATE_FIELDS, replicas_from_column, written_by_from_column
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
    checked: frozenset[str] = frozenset()  # the columns whose pages were decoded once: readable

    def check(self, columns: Collection[str] | None = None) -> None:
        """Decode each row group's pages of `columns` (None: every column) not decoded yet; CatalogError
        naming the key when one is damaged. The footer alone says nothing of the data pages, and a
        damaged page found later, in a read of every run or in a compaction's rewrite, would fail every
        command instead of being skipped and set aside. Only the columns a reader reads: a listing never
        decodes `metrics` or `detail`, the metrics read 13 of 28 columns (bench/README.md); a compaction's
        rewrite asks for every column first."""
        try:
            pf = pq.ParquetFile(pa.BufferReader(self.data))
            todo = [c for c in pf.schema_arrow.names if (columns is None or c in columns) and c not in self.checked]
            if todo:
                for g in range(pf.num_row_groups):  # one at a time: memory stays one row group
                    pf.read_row_group(g, columns=todo)
        except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError, AttributeError) as e:
            raise CatalogError(f"{self.key}: not a readable combined snapshot ({e})") from None
        self.checked = self.checked | set(todo)

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
        cols["written_by"] = written_by_from_column(cols["written_by"])
        cols["replicas"] = replicas_from_column(cols["replicas"])
        out: dict[str, list[CheckpointState]] = {}
        make = object.__new__
        for row in zip(*(cols[n] for n in _STATE_FIELDS), strict=True):
            # straight into the instance, as read_snapshot does (the frozen __init__ is most of the cost)
            s = make(CheckpointState)
            s.__dict__.update(zip(_STATE_FIELDS, row, strict=True))
            out.setdefault(s.run, []).append(s)
        return out


def read_combined(key: str, data: bytes, columns: Collection[str] | None = None) -> Combined:
    """One combined snapshot, the pages of `columns` (None: every column) decoded once; CatalogError
    naming `key` when it is not a readable one."""
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
    got = Combined(key, runs, data)
    got.check(columns)
    return got


def _snapshot_file(key: str, data: bytes) -> tuple[pq.ParquetFile, list[str], set[str]]:
    """A per-run snapshot's file, the keys it covers and its columns; CatalogError when it is not one."""
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        meta = pf.schema_arrow.metadata or {}
        if meta.get(b"schema") != SNAPSHOT_TAG:
            raise CatalogError(f"{key}: not a catalog snapshot")
        covers = [str(k) for k in json.loads(meta[b"ckptvault.covers"])]
    except CatalogError:
        raise
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as e:
        raise CatalogError(f"{key}: not a readable snapshot ({e})") from None
    return pf, covers, set(pf.schema_arrow.names)


def snapshot_cover(key: str, data: bytes) -> RunCover:
    """What a per-run snapshot covers: itself and the event files it names, and how many events (its
    `_rows` column alone decoded). CatalogError when it is not a readable snapshot."""
    pf, covers, _ = _snapshot_file(key, data)
    try:
        rows = pf.read(columns=["_rows"])["_rows"]
        events = int(pc.sum(pc.list_value_length(rows)).as_py() or 0)
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as e:
        raise CatalogError(f"{key}: not a readable snapshot ({e})") from None
    return RunCover(frozenset([key, *covers]), events)


def snapshot_rows(key: str, data: bytes) -> pa.Table:
    """A per-run snapshot's rows in the combined schema. CatalogError when it is not a readable snapshot."""
    pf, _, have = _snapshot_file(key, data)
    try:
        t = pf.read(columns=[c for c in _STATE_FIELDS if c in have])
        for c, d in _ADDED.items():
            if c not in have:
                t = t.append_column(c, pa.repeat(pa.scalar(d, _SCHEMA.field(c).type), t.num_rows))
        t = t.select(_STATE_FIELDS).cast(_SCHEMA)
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as e:
        raise CatalogError(f"{key}: not a readable snapshot ({e})") from None
    return t


class UnreadableSnapshot(CatalogError):
    """A run's snapshot that did not read when the combined snapshot was being written from it."""

    def __init__(self, run: str, key: str, error: CatalogError) -> None:
        super().__init__(str(error))
        self.run, self.key, self.error = run, key, error


# Rows a rewrite holds before it writes them as one row group: the memory of a compaction that
# rewrites the combined snapshot is this and one row group of the previous one, not every save.
_BATCH_ROWS = 16_384


def combined_bytes(
    prev: Combined | None,
    keep: Collection[str],
    fresh: Mapping[str, tuple[str, bytes]],
    runs: dict[str, RunCover],
) -> bytes:
    """The combined snapshot of `runs`: the rows of the runs in `fresh` (each a per-run snapshot's key
    and bytes) from there, those of `keep` from `prev`, read a row group at a time and spliced in run
    order. A run's snapshot is decoded only as its rows are written: the 1,000 runs' rows decoded at
    once, 2.3x their snapshots as stored, were the peak of the pass that ends a migration
    (bench/README.md). CatalogError when `prev`'s rows are not in run order (the format says they
    are); UnreadableSnapshot when a run's snapshot does not read."""
    doc = {r: {"covers": sorted(c.covers), "events": c.events} for r, c in sorted(runs.items())}
    schema = _SCHEMA.with_metadata({b"schema": COMBINED_TAG, b"ckptvault.runs": json.dumps(doc)})
    sink = pa.BufferOutputStream()
    held: list[pa.Table] = []

    def rows(r: str) -> pa.Table:
        key, data = fresh[r]
        try:
            return _in_order(snapshot_rows(key, data))
        except CatalogError as e:
            raise UnreadableSnapshot(r, key, e) from None

    with pq.ParquetWriter(sink, schema, compression="zstd") as w:

        def put(t: pa.Table) -> None:
            held.append(t)
            if sum(x.num_rows for x in held) >= _BATCH_ROWS:
                w.write_table(pa.concat_tables(held).replace_schema_metadata(schema.metadata), _BATCH_ROWS)
                held.clear()

        todo = sorted(fresh)
        i = 0
        for r, seg in _segments(prev, keep):
            while i < len(todo) and todo[i] < r:
                put(rows(todo[i]))
                i += 1
            put(seg)
        for r in todo[i:]:
            put(rows(r))
        if held:
            w.write_table(pa.concat_tables(held).replace_schema_metadata(schema.metadata), _BATCH_ROWS)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _in_order(t: pa.Table) -> pa.Table:
    t = t.cast(_SCHEMA)
    return t.take(pc.sort_indices(t, sort_keys=_ORDER[1:]))


def _segments(prev: Combined | None, keep: Collection[str]) -> Iterator[tuple[str, pa.Table]]:
    """(run, its rows) of `prev` for the runs in `keep`, in run order, one row group read at a time."""
    if prev is None or not keep:
        return
    pf = pq.ParquetFile(pa.BufferReader(prev.data))
    have = set(pf.schema_arrow.names)
    last = ""
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g, columns=[c for c in _STATE_FIELDS if c in have])
        for c in _STATE_FIELDS:
            if c not in have:
                t = t.append_column(c, pa.repeat(pa.scalar(_ADDED[c], _SCHEMA.field(c).type), t.num_rows))
        t = t.select(_STATE_FIELDS).replace_schema_metadata(None).cast(_SCHEMA)
        if not t.num_rows:
            continue
        idx = pc.dictionary_encode(t["run"].combine_chunks()).indices.to_numpy()
        cut = [0, *(np.flatnonzero(np.diff(idx)) + 1).tolist(), len(idx)]
        names = t["run"].take(pa.array(cut[:-1], pa.int64())).to_pylist()
        for r, a, b in zip(names, cut[:-1], cut[1:], strict=True):
            if r < last:  # the same run again after another: not in (run, step, save) order
                raise CatalogError(f"{prev.key}: rows not in run order")
            last = r
            if r in keep:
                yield r, t.slice(a, b - a)
