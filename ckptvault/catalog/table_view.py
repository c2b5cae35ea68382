"""`ls --json` column at a time: the current state as one Arrow table (a partition's snapshot columns as
read, without a `CheckpointState` per save) and its JSON rendered vectorised. The document is byte for
byte what `ckptvault.catalog.listing.render_json(select(...))` prints (tests/unit/test_ls_table.py), so the
definition stays there; this is only faster (bench/README.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckptvault.catalog.fold import replicas_column, replicas_from_column
from ckptvault.catalog.layout import _Part
from ckptvault.catalog.model import LIFECYCLE_STATES, CatalogError, CheckpointState
from ckptvault.catalog.snapshot import _ADDED, _STATE_COLUMNS, SNAPSHOT_TAG

if TYPE_CHECKING:
    from ckptvault.catalog.eventlog import Catalog

_READERS = 8
# What the listing reads of a state: the record's fields, and what `state` and `when` derive from.
_SCHEMA = pa.schema(
    [
        ("run", pa.string()), ("step", pa.int64()), ("save", pa.int64()), ("format", pa.string()),
        ("last_event", pa.string()), ("bytes", pa.int64()), ("stored_bytes", pa.int64()),
        ("files", pa.int64()), ("storage_class", pa.string()), ("created_at", pa.float64()),
        ("uploaded_at", pa.float64()), ("verified", pa.bool_()), ("last_drill_ok", pa.bool_()),
        ("last_drill_at", pa.float64()), ("superseded", pa.bool_()), ("superseded_reason", pa.string()),
        ("updated_at", pa.float64()), ("locked_until", pa.float64()), ("legal_hold", pa.bool_()),
        ("replicas", pa.string()), ("rpo_seconds", pa.float64()), ("model_bytes", pa.int64()),
        ("optimizer_bytes", pa.int64()), ("written_by", pa.string()),
    ]
)  # fmt: skip
_COLUMNS = _SCHEMA.names
_STATES_JSON = pa.array([json.dumps(s) for s in LIFECYCLE_STATES])


def _from_states(states: Sequence[CheckpointState]) -> pa.Table:
    cols = {c: [getattr(s, c) for s in states] for c in _COLUMNS if c not in ("replicas", "written_by")}
    cols["replicas"] = replicas_column([s.replicas for s in states])  # as a snapshot holds them
    cols["written_by"] = [json.dumps(s.written_by) for s in states]
    return pa.table(cols, schema=_SCHEMA)


def _snapshot_table(cat: Catalog, keys: Sequence[str]) -> tuple[set[str], pa.Table] | None:
    """(covers, listing columns) of the newest readable snapshot: unreadable when `read_snapshot` would
    say so (tag, covers, a state column missing), skipped the same way."""
    for key in sorted(keys, reverse=True):
        try:
            pf = pq.ParquetFile(pa.BufferReader(cat._get(key) or b""))
            meta = pf.schema_arrow.metadata or {}
            if meta.get(b"schema") != SNAPSHOT_TAG:
                raise CatalogError(f"{key}: not a catalog snapshot")
            covers = set(json.loads(meta[b"ckptvault.covers"]))
            have = set(pf.schema_arrow.names)
            lost = [c for c in _STATE_COLUMNS if c not in have and c not in _ADDED]
            if lost:
                raise KeyError(lost[0])
            t = pf.read(columns=[c for c in _COLUMNS if c in have])
            for c, d in _ADDED.items():
                if c not in have:
                    t = t.append_column(c, pa.repeat(pa.scalar(d, _SCHEMA.field(c).type), t.num_rows))
            # the snapshot's rows are in write order; `current` lists by (step, save)
            t = t.select(_COLUMNS).cast(_SCHEMA)
            return covers, t.take(pc.sort_indices(t, sort_keys=[("step", "ascending"), ("save", "ascending")]))
        except (pa.ArrowInvalid, OSError, KeyError, ValueError) as e:
            err = e if isinstance(e, CatalogError) else CatalogError(f"{key}: not a readable snapshot ({e})")
            cat._skip(key, err)
    return None


def _part_table(cat: Catalog, run: str, part: _Part, flat: pa.Table | None) -> pa.Table:
    if part.snapshots and flat is None:
        got = _snapshot_table(cat, part.snapshots)
        if got is not None and all(k in got[0] for k in part.events):
            return got[1]  # nothing since the snapshot: its rows are the state (the common, compacted case)
    # events since the snapshot, or none: the fold as `current` does it, for this partition only
    return _from_states(cat._current_part(run, part, flat))


def current_table(cat: Catalog, run: str | None = None, columns: Sequence[str] = _COLUMNS) -> pa.Table:
    """What `cat.current(run)` holds in `columns` (of `_COLUMNS`; run, step and save first when not
    named), as one table in the same (run, step, save) order. Only those columns of the combined
    snapshot are read and decoded: what the metrics read of it is half of what a listing does."""
    cols = [*(c for c in ("run", "step", "save") if c not in columns), *columns]
    schema = pa.schema([_SCHEMA.field(c) for c in cols])

    def read() -> pa.Table:
        runs, parts, flat_by_run, comb = cat._partitions(run, cols)
        # the runs the combined snapshot covers in one table (one GET); the rest partition by partition
        whole = [r for r in runs if comb.covers(r, parts[r])] if comb is not None else []
        covered = set(whole)
        rest = [r for r in runs if r not in covered]

        def one(r: str) -> pa.Table:
            return _part_table(cat, r, parts.get(r, _Part([], [])), flat_by_run.get(r)).select(cols)

        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            tables = list(pool.map(one, rest))
        if comb is not None and whole:
            tables.append(comb.table(cols, whole).cast(schema))
        if not tables:
            return schema.empty_table()
        t = pa.concat_tables(tables)
        if not (whole and rest):
            return t  # already in (run, step, save) order
        keys = [("run", "ascending"), ("step", "ascending"), ("save", "ascending")]
        return t.take(pc.sort_indices(t, sort_keys=keys))

    got: pa.Table = cat._retrying(read)
    return got.combine_chunks()


def _state_codes(t: pa.Table) -> np.ndarray:
    """`CheckpointState.state` of every row, as an index into LIFECYCLE_STATES: numpy over the few
    distinct `last_event`s (string if_else over 200,000 rows was a fifth of the render)."""
    d = pc.dictionary_encode(t["last_event"].combine_chunks())
    kinds = d.dictionary.to_pylist()
    own = {"invalid": 1, "accepted": 2, "expired": 6}  # their own state, when not verified (expired: always)
    by_kind = np.array([own.get(k, 0) for k in kinds] or [0], dtype=np.int8)
    unverified = by_kind[d.indices.fill_null(0).to_numpy()]

    def flag(c: str) -> np.ndarray:
        got: np.ndarray = t[c].combine_chunks().fill_null(False).to_numpy(zero_copy_only=False)
        return got

    drill_failed = pc.invert(t["last_drill_ok"].combine_chunks()).fill_null(False).to_numpy(zero_copy_only=False)
    verified = np.select([flag("superseded"), drill_failed], [5, 4], 3).astype(np.int8)
    codes: np.ndarray = np.where(unverified == 6, 6, np.where(flag("verified"), verified, unverified))
    return codes


def state_column(t: pa.Table) -> pa.Array:
    """`CheckpointState.state` of every row."""
    return pc.take(pa.array(LIFECYCLE_STATES), pa.array(_state_codes(t)))


def select_table(t: pa.Table, state: str | None, since: float | None, limit: int | None) -> pa.Table:
    """`--state`, then `ckptvault.catalog.listing.select` (since, then the `limit` newest by (when, step, save),
    ties to the earlier row as its stable reverse sort keeps them), in the table's order."""
    if state:
        t = t.filter(pc.equal(state_column(t), state))
    when = pc.coalesce(t["created_at"], t["uploaded_at"], t["updated_at"])
    if since is not None:
        t = t.filter(pc.greater_equal(when, since))
        when = pc.coalesce(t["created_at"], t["uploaded_at"], t["updated_at"])
    if limit is not None and t.num_rows > limit:
        k = pa.table({"w": when, "s": t["step"], "v": t["save"], "i": np.arange(t.num_rows, dtype=np.int64)})
        top = pc.sort_indices(k, sort_keys=[("w", "descending"), ("s", "descending"), ("v", "descending"),
                                            ("i", "ascending")])[:limit]  # fmt: skip
        t = t.take(pa.array(np.sort(top.to_numpy())))  # back in the table's order
    return t


def _json_strings(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each value as json.dumps writes it: the few distinct values encoded in Python, then taken."""
    # combined first: the chunks of a chunked column would each get a dictionary of their own
    d = pc.dictionary_encode(a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a)
    enc = pa.array([json.dumps(v) for v in d.dictionary.to_pylist()], pa.string())
    return pc.fill_null(pc.take(enc, d.indices), "null")


def _json_ints(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.cast(a, pa.string())


def _json_opt_ints(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Integers, null as null (a null would make the whole row's join null)."""
    return pc.fill_null(pc.cast(a, pa.string()), "null")


def _json_ms(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`listing._ms`: seconds as whole milliseconds, half to even as Python's round, null as null."""
    ms = pc.round(pc.multiply(a, 1000.0), 0, round_mode="half_to_even")
    return pc.fill_null(pc.cast(pc.cast(ms, pa.int64()), pa.string()), "null")


def _json_bools(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.fill_null(pc.if_else(a, "true", "false"), "null")


def _copies(t: pa.Table) -> pa.Array:
    """`CheckpointState.copies`: the primary's (verified) and one per replica; store and class names
    never hold `[`, so each copy's `["` counts it."""
    n = pc.count_substring(pc.fill_null(t["replicas"], ""), '["')
    return pc.add(pc.cast(pc.fill_null(t["verified"], False), pa.int64()), pc.cast(n, pa.int64()))


def _json_replicas(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`listing.replica_records` as json.dumps writes it; rows with copies in Python (one per save and
    replica: a fleet without replicas pays one comparison per row)."""
    from ckptvault.catalog.listing import replica_records

    col = pc.fill_null(a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a, "")
    has = pc.not_equal(col, "")
    if not pc.any(has).as_py():
        return pa.array(["[]"] * len(col), pa.string())
    texts = [json.dumps(replica_records(r)) for r in replicas_from_column(pc.filter(col, has).to_pylist())]
    out = np.full(len(col), "[]", dtype=object)
    out[np.flatnonzero(has.to_numpy(zero_copy_only=False))] = texts
    return pa.array(out, pa.string())


def _json_times(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    # `_iso`: gmtime floors to the second; a second-unit timestamp prints no fraction
    # cast to text, not strftime (16x slower): "YYYY-MM-DD HH:MM:SS", then the T and the Z
    secs = pc.cast(pc.cast(pc.floor(a), pa.int64()), pa.timestamp("s"))
    text = pc.replace_substring(pc.cast(secs, pa.string()), " ", "T", max_replacements=1)
    iso = pc.binary_join_element_wise('"', text, 'Z"', "")
    return pc.fill_null(iso, "null")


# Rows rendered at a time: the JSON text columns of a slice, not of every save, are held at once
# (all 200,000 at once peaked at ~200 MiB of Arrow buffers).
_CHUNK = 16_384


def _lines(t: pa.Table) -> pa.Array:
    """Each row's `as_record` as json.dumps writes it and ",\n", every field a column of JSON text."""
    reason = pc.if_else(pc.equal(t["superseded_reason"], ""), pa.scalar(None, pa.string()), t["superseded_reason"])
    billed = pc.if_else(pc.equal(t["stored_bytes"], 0), t["bytes"], t["stored_bytes"])
    fields = [
        ("run", _json_strings(t["run"])), ("step", _json_ints(t["step"])), ("save", _json_ints(t["save"])),
        ("format", _json_strings(t["format"])), ("state", pc.take(_STATES_JSON, pa.array(_state_codes(t)))),
        ("last_event", _json_strings(t["last_event"])), ("bytes", _json_ints(t["bytes"])),
        ("stored_bytes", _json_ints(billed)), ("files", _json_ints(t["files"])),
        ("storage_class", _json_strings(t["storage_class"])), ("created_at", _json_times(t["created_at"])),
        ("uploaded_at", _json_times(t["uploaded_at"])), ("verified", _json_bools(t["verified"])),
        ("last_drill_ok", _json_bools(t["last_drill_ok"])), ("last_drill_at", _json_times(t["last_drill_at"])),
        ("superseded_reason", _json_strings(reason)), ("locked_until", _json_times(t["locked_until"])),
        ("legal_hold", _json_bools(t["legal_hold"])), ("copies", _json_ints(_copies(t))),
        ("replicas", _json_replicas(t["replicas"])), ("rpo_ms", _json_ms(t["rpo_seconds"])),
        ("model_bytes", _json_opt_ints(t["model_bytes"])), ("optimizer_bytes", _json_opt_ints(t["optimizer_bytes"])),
        # JSON text already (json.dumps of the state's dict, as `as_record` prints it); "" read as nothing
        ("written_by", pc.fill_null(pc.if_else(pc.equal(t["written_by"], ""), "{}", t["written_by"]), "{}")),
    ]  # fmt: skip
    parts: list[pa.Array | str] = []
    for i, (name, col) in enumerate(fields):
        parts.append(("{" if i == 0 else ", ") + json.dumps(name) + ": ")
        parts.append(col)
    parts.append("},\n")
    joined = pc.binary_join_element_wise(*parts, "")
    got: pa.Array = joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined
    return got


def write_json_table(t: pa.Table, out: BinaryIO) -> None:
    """`ckptvault.catalog.listing.render_json` of these rows, as UTF-8, written a slice at a time: no Python
    string per save, and not the whole document in memory."""
    if t.num_rows == 0:
        out.write(b"[]")
        return
    out.write(b"[\n")
    for first in range(0, t.num_rows, _CHUNK):
        lines = _lines(t.slice(first, _CHUNK))
        # the slice's lines are one buffer already; the document's last ",\n" is not written
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1]
        end = int(offsets[-1]) - (2 if first + _CHUNK >= t.num_rows else 0)
        out.write(memoryview(lines.buffers()[2])[int(offsets[0]) : end])
    out.write(b"\n]")
