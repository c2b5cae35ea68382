"""Event tables (docs/FORMAT.md, "The catalog"): the Parquet schema of an event file, encoding events into
it, decoding and checking what a file holds, and the hidden identity columns (`_origin`, `_row`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from ckptvault.catalog.model import EVENT_KINDS, CatalogError, Event

SCHEMA_TAG = b"ckptvault.catalog/1"
_ORIGIN, _ROW = "_origin", "_row"

_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("step", pa.int64()),
        ("event", pa.string()),
        ("at", pa.float64()),
        ("format", pa.string()),
        ("bytes", pa.int64()),
        ("files", pa.int64()),
        ("storage_class", pa.string()),
        ("created_at", pa.float64()),
        ("ok", pa.bool_()),
        ("detail", pa.string()),
        ("flow_run", pa.string()),
        ("save", pa.int64()),
        ("stored_bytes", pa.int64()),
    ],
    metadata={b"schema": SCHEMA_TAG},
)
_FIELDS = [f.name for f in fields(Event)]
# Compat: what an event file written before a column lacks reads as; may go: never (FORMAT.md)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Event) if f.name not in ("run", "step", "event", "at")}


# Up to this many rows a table is built by pyarrow's JSON reader; more go through Python lists.
_JSON_ROWS = 10_000


def _table(events: Sequence[Event], origins: Sequence[tuple[str, int]] | None = None) -> pa.Table:
    schema = _SCHEMA
    rows: list[dict[str, Any]] = [{name: getattr(e, name) for name in _FIELDS} for e in events]
    if origins is not None:
        schema = schema.append(pa.field(_ORIGIN, pa.string())).append(pa.field(_ROW, pa.int64()))
        for row, (origin, i) in zip(rows, origins, strict=True):
            row[_ORIGIN], row[_ROW] = origin, i
    if not rows:
        return schema.empty_table()
    if len(rows) > _JSON_ROWS:
        return pa.Table.from_pylist(rows, schema=schema)
    # The few events a flow records are parsed by pyarrow's JSON reader against the fixed schema:
    # converting Python lists (from_pylist, pa.array) makes pyarrow import pandas (~0.2 s) to ask
    # whether they are pandas objects, in every process that records an event. For a compaction's
    # many rows that import is small against the conversion, which JSON makes ~8x slower.
    # Timestamps are never NaN (time.time(), file mtimes); allow_nan=False turns one into a ValueError
    # here rather than a token the JSON reader would reject with a vaguer message.
    text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows).encode()
    parse = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    read = pa_json.ReadOptions(block_size=max(1 << 20, len(text)))  # one block: no row straddles two
    return pa_json.read_json(pa.BufferReader(text), read_options=read, parse_options=parse).cast(schema)


def _to_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    data: bytes = sink.getvalue().to_pybytes()
    return data


def encode_events(events: Sequence[Event]) -> bytes:
    """Events as one Parquet file."""
    return _to_bytes(_table(events))


def _parquet(data: bytes, origin: str, columns: Sequence[str] | None = None) -> pa.Table:
    """The columns asked for (those the file has) of one event file; CatalogError if it is none."""
    try:
        # ParquetFile, not read_table: read_table goes through pyarrow.dataset, whose import (~0.4 s)
        # every flow process would pay for one small file.
        pf = pq.ParquetFile(pa.BufferReader(data))
        names = set(pf.schema_arrow.names)
        missing = {"run", "step", "event", "at"} - names
        if missing:
            raise CatalogError(f"{origin}: not a catalog file (missing columns {sorted(missing)})")
        want = None if columns is None else [c for c in columns if c in names]
        return pf.read(columns=want)
    except (pa.ArrowInvalid, OSError) as e:
        raise CatalogError(f"{origin}: not a readable Parquet file ({e})") from None


def _decode_rows(table: pa.Table, origin: str, first: int = 0) -> list[tuple[Event, str, int]]:
    names = set(table.column_names)
    cols = table.to_pydict()
    out = []
    for i in range(table.num_rows):
        kw = {n: (cols[n][i] if n in names else _DEFAULTS[n]) for n in _FIELDS}
        for n in ("format", "storage_class", "detail", "flow_run"):
            kw[n] = kw[n] or ""
        for n in ("bytes", "files", "stored_bytes"):
            kw[n] = kw[n] or 0
        kw["save"] = kw["save"] or 1
        try:
            ev = Event(**kw)
        except (ValueError, TypeError) as e:
            raise CatalogError(f"{origin}: row {first + i}: {e}") from None
        if _ORIGIN in names:
            out.append((ev, str(cols[_ORIGIN][i]), int(cols[_ROW][i])))
        else:
            out.append((ev, origin, first + i))
    return out


def _decode(data: bytes, origin: str) -> list[tuple[Event, str, int]]:
    """Events with their identity (origin key, row). Missing optional columns take their defaults,
    so files written before a column was added still read."""
    return _decode_rows(_parquet(data, origin), origin)


def decode_events(data: bytes) -> list[Event]:
    """The events of one Parquet file, in file order."""
    return [e for e, _, _ in _decode(data, "<bytes>")]


def _dedup_sorted(rows: Iterable[tuple[Event, str, int]]) -> list[tuple[Event, str, int]]:
    seen: dict[tuple[str, int], tuple[Event, str, int]] = {}
    for r in rows:
        seen.setdefault((r[1], r[2]), r)
    return sorted(seen.values(), key=lambda r: (r[0].at, r[1], r[2]))



# Columns the fold reads: `flow_run` is never folded, so readers of the current state skip it.
_FOLD_COLUMNS = ["run", "step", "event", "at", "format", "bytes", "files", "storage_class", "created_at", "ok",
                 "detail", "save", "stored_bytes"]  # fmt: skip


def _normalise(table: pa.Table, origin: str) -> pa.Table:
    """`table` in `_SCHEMA`'s types (the columns it has, of those asked for), the defaults `_decode`
    gives filled in, and an identity per row; CatalogError names the first row that is not an event."""
    n = table.num_rows
    names = set(table.column_names)
    cols: dict[str, pa.ChunkedArray | pa.Array] = {}
    try:
        for f in _SCHEMA:
            if f.name in names:
                cols[f.name] = table[f.name].cast(f.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise CatalogError(f"{origin}: a column has the wrong type ({e})") from None
    fill: dict[str, Any] = {"format": "", "storage_class": "", "detail": "", "flow_run": "", "bytes": 0, "files": 0,
                            "stored_bytes": 0}  # fmt: skip
    for name, default in fill.items():
        if name in cols:
            cols[name] = pc.fill_null(cols[name], default)
    if "save" in cols:
        # `save or 1`, as `_decode` reads it: null and 0 are files from before saves
        save = cols["save"]
        cols["save"] = pc.if_else(pc.fill_null(pc.equal(save, 0), True), 1, save)
    bad = pc.or_(pc.invert(pc.is_in(cols["event"], value_set=pa.array(EVENT_KINDS))), pc.is_null(cols["event"]))
    bad = pc.or_kleene(bad, pc.fill_null(pc.equal(cols["run"], ""), True))
    bad = pc.or_kleene(bad, pc.fill_null(pc.less(cols["step"], 0), True))
    bad = pc.or_kleene(bad, pc.is_null(cols["at"]))
    if "save" in cols:
        bad = pc.or_kleene(bad, pc.less(cols["save"], 1))
    if n and pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        # the Python decoder builds that row's Event and says what is wrong with it exactly
        _decode_rows(table.slice(i, 1), origin, i)
        raise CatalogError(f"{origin}: row {i}: not an event")
    out = pa.table(cols)
    if _ORIGIN in names and _ROW in names:
        out = out.append_column(_ORIGIN, table[_ORIGIN].cast(pa.string()))
        out = out.append_column(_ROW, table[_ROW].cast(pa.int64()))
    else:
        out = out.append_column(_ORIGIN, pa.repeat(pa.scalar(origin, pa.string()), n))
        out = out.append_column(_ROW, pa.array(np.arange(n, dtype=np.int64)))
    return out


def _with_defaults(table: pa.Table) -> pa.Table:
    """The fold's columns, those a file lacks at their defaults (files from before a column)."""
    n = table.num_rows
    for name in _FOLD_COLUMNS:
        if name not in table.column_names:
            typ = _SCHEMA.field(name).type
            d = _DEFAULTS[name]
            table = table.append_column(name, pa.repeat(pa.scalar(d, typ), n) if d is not None else pa.nulls(n, typ))
    return table



def _concat(tables: Sequence[pa.Table]) -> pa.Table | None:
    ts = [t for t in tables if t.num_rows]
    if not ts:
        return None
    return pa.concat_tables(ts, promote_options="permissive") if len(ts) > 1 else ts[0]


def _full(t: pa.Table) -> pa.Table:
    """Every column of an event file with identities, those `t` lacks at their defaults."""
    n = t.num_rows
    for f in _SCHEMA:
        if f.name not in t.column_names:
            d = _DEFAULTS[f.name]
            t = t.append_column(f.name, pa.repeat(pa.scalar(d, f.type), n) if d is not None else pa.nulls(n, f.type))
    full = _SCHEMA.append(pa.field(_ORIGIN, pa.string())).append(pa.field(_ROW, pa.int64()))
    return t.select(full.names).cast(full)

