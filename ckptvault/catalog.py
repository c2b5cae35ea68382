"""The catalog: an append-only Parquet event log in the bucket, beside the data it describes.

Layout (docs/FORMAT.md): `<prefix>/_catalog/run=<run, percent-encoded>/events/<time_ns:020d>-<uuid4hex>.parquet`,
one object per run per `append` call, never rewritten, and `.../snapshot/...`, the folded state that
compaction writes, so that a command about one run reads only that run's partition and `ls` reads one
snapshot per run plus the events since. Two writers never lose each other's events because they never
write the same key. The flat layout before partitions (`_catalog/events/`) is still read, and migrated
into the partitions by `compact`.

Every event has an identity, (origin file key, row index), kept as hidden columns when `compact`
merges files and listed in a snapshot for what it folded. Readers drop duplicate identities, so a
reader that lists a merged file and its not-yet-deleted sources, a compaction that crashed between
write and delete, or two compactions racing each other all read as if the merge were atomic. The
identity also orders events: origin keys begin with a zero-padded nanosecond time, so (at, origin, row)
is "by time, then by insertion".

The catalog can always be rebuilt from the manifests in the bucket (`rebuild_from_manifests`).
This is the only module that imports pyarrow.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from ckptvault.errors import CkptvaultError
from ckptvault.manifest import MANIFEST_NAME, VALIDATION_NAME, Manifest, ManifestError, parse_save_dir
from ckptvault.store.port import NotFoundError, ObjectStore

EVENT_KINDS = (
    "discovered", "invalid", "uploaded", "verified", "evicted_local", "transitioned",
    "restore_requested", "restored", "drilled", "expired", "accepted", "warned",
    "superseded", "transition_scheduled", "evict_skipped",
)  # fmt: skip
# A checkpoint's lifecycle state (`CheckpointState.state`), derived from its events; see `_lifecycle`.
LIFECYCLE_STATES = ("pending", "invalid", "accepted", "verified", "suspect", "superseded", "expired")
CATALOG_DIR = "_catalog/events/"
UNREADABLE_DIR = "_catalog/unreadable/"  # event files compaction could not read, kept for a person
SCHEMA_TAG = b"ckptvault.catalog/1"
SNAPSHOT_TAG = b"ckptvault.catalog-snapshot/1"
MIGRATE_FILES = 500  # flat-layout files one compaction migrates: bounds its memory and time
COMPACT_SECONDS = 60.0  # the flows' time box for compaction, checked between partitions
_ORIGIN, _ROW = "_origin", "_row"
_READERS = 8
_MANIFEST_READERS = 16  # manifests are small: latency-bound, more in flight than event files
log = logging.getLogger("ckptvault.catalog")


class CatalogError(CkptvaultError):
    """A catalog file cannot be read or an event is malformed; the message names the key."""


@dataclass(frozen=True)
class Event:
    run: str
    step: int
    event: str
    at: float  # unix seconds
    format: str = ""
    bytes: int = 0
    files: int = 0
    storage_class: str = ""
    created_at: float | None = None  # when the checkpoint was written (newest file mtime)
    ok: bool | None = None  # drilled: passed or failed
    detail: str = ""  # JSON text: reasons, metrics, who/why for accepted, timings
    flow_run: str = ""  # Prefect flow run id; the library never imports prefect, callers pass it
    save: int = 1  # which save of the step (1 in files written before saves existed)

    def __post_init__(self) -> None:
        if self.event not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {self.event!r}; one of {', '.join(EVENT_KINDS)}")
        if not self.run:
            raise ValueError("event run must not be empty")
        if self.step < 0:
            raise ValueError(f"event step must be >= 0, got {self.step}")
        if self.save < 1:
            raise ValueError(f"event save must be >= 1, got {self.save}")


@dataclass(frozen=True)
class CheckpointState:
    """The fold of one checkpoint's (run, step, save) events in time order."""

    run: str
    step: int
    format: str
    last_event: str  # the latest event kind; `state` is the lifecycle state derived from all of them
    bytes: int
    files: int
    storage_class: str
    created_at: float | None
    uploaded_at: float | None
    verified: bool  # ever verified, and not expired since
    local_evicted: bool
    last_drill_at: float | None
    last_drill_ok: bool | None
    metrics: dict[str, float]  # "metrics" in the detail of the uploaded/verified event
    updated_at: float
    detail: str  # detail of the latest event
    # When the checkpoint entered its current storage class: minimum-duration charges count from here.
    class_since: float | None = None
    save: int = 1
    superseded: bool = False  # a later save of this step, or a restart before it, replaced this save
    superseded_reason: str = ""
    # Server apply mode: a lifecycle rule will move the objects; the class changes when observed.
    scheduled_class: str = ""
    scheduled_at: float | None = None  # when the rule takes effect (unix s)
    fingerprint: str = ""  # (path, size, mtime) digest of the verified save, when its event recorded one

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.run, self.step, self.save)

    @property
    def expired(self) -> bool:
        return self.last_event == "expired"

    @property
    def suspect(self) -> bool:
        """Verified, but its last drill failed: not trusted until a later drill passes."""
        return self.verified and self.last_drill_ok is False

    @property
    def good(self) -> bool:
        """What `restore latest` may pick: verified, not superseded, its last drill did not fail."""
        return self.verified and not self.superseded and not self.suspect

    @property
    def state(self) -> str:
        """The lifecycle state, one of LIFECYCLE_STATES: what the checkpoint *is*, not what last happened."""
        if self.expired:
            return "expired"
        if self.verified:
            if self.superseded:
                return "superseded"
            return "suspect" if self.suspect else "verified"
        if self.last_event in ("invalid", "accepted"):
            return self.last_event
        return "pending"


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
    ],
    metadata={b"schema": SCHEMA_TAG},
)
_FIELDS = [f.name for f in fields(Event)]
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
        for n in ("bytes", "files"):
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


def _metrics(detail: str) -> dict[str, float] | None:
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return None
    m = d.get("metrics") if isinstance(d, dict) else None
    if not isinstance(m, dict):
        return None
    return {str(k): float(v) for k, v in m.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _fold_one(events: Sequence[Event], start: CheckpointState | None = None) -> CheckpointState:
    """The fold of one checkpoint save's events in order, one event at a time: the definition the
    vectorised `_fold_table` must equal, and how a snapshot's row takes the events written after it
    (`start`: the state folded so far)."""
    first = events[0]
    if start is not None:
        s0 = {f.name: getattr(start, f.name) for f in fields(CheckpointState)}
        s0["metrics"] = dict(start.metrics)
        return _fold_into(s0, events)
    s: dict[str, Any] = dict(
        run=first.run, step=first.step, format="", last_event="", bytes=0, files=0, storage_class="",
        created_at=None, uploaded_at=None, verified=False, local_evicted=False, last_drill_at=None,
        last_drill_ok=None, metrics={}, updated_at=first.at, detail="", class_since=None,
        save=first.save, superseded=False, superseded_reason="", scheduled_class="", scheduled_at=None,
        fingerprint="",
    )  # fmt: skip
    return _fold_into(s, events)


def _fold_into(s: dict[str, Any], events: Sequence[Event]) -> CheckpointState:
    for e in events:
        # Later events refine what is known; empty fields mean "not said", never "cleared".
        if e.format:
            s["format"] = e.format
        if e.bytes:
            s["bytes"] = e.bytes
        if e.files:
            s["files"] = e.files
        if e.created_at is not None:
            s["created_at"] = e.created_at
        if e.storage_class and e.storage_class != s["storage_class"]:
            s["storage_class"] = e.storage_class
            s["class_since"] = e.at
        if e.event in ("uploaded", "verified"):
            if s["uploaded_at"] is None:
                s["uploaded_at"] = e.at
            if s["class_since"] is None:
                s["class_since"] = e.at
            m = _metrics(e.detail)
            if m is not None:
                s["metrics"] = m
            fp = _field(e.detail, "fingerprint")
            if fp:
                s["fingerprint"] = fp
        if e.event == "verified":
            s["verified"] = True
        elif e.event == "expired":
            s["verified"] = False
            s["scheduled_class"], s["scheduled_at"] = "", None
        elif e.event == "transition_scheduled":
            # the class itself changes only when a listing shows it moved (a `transitioned` event)
            s["scheduled_class"], s["scheduled_at"] = _scheduled(e.detail)
        elif e.event == "transitioned":
            s["scheduled_class"], s["scheduled_at"] = "", None
        elif e.event == "evicted_local":
            s["local_evicted"] = True
        elif e.event == "drilled":
            s["last_drill_at"], s["last_drill_ok"] = e.at, e.ok
        elif e.event == "superseded":
            s["superseded"], s["superseded_reason"] = True, _reason(e.detail)
        s["last_event"], s["updated_at"], s["detail"] = e.event, e.at, e.detail
    return CheckpointState(**s)


def _field(detail: str, name: str) -> str:
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return ""
    return str(d.get(name) or "") if isinstance(d, dict) else ""


def _reason(detail: str) -> str:
    return _field(detail, "reason")


def _scheduled(detail: str) -> tuple[str, float | None]:
    """(to_class, takes_effect) of a transition_scheduled event; ("", None) if it names no class."""
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return "", None
    if not isinstance(d, dict) or not d.get("to_class"):
        return "", None
    at = d.get("takes_effect")
    if isinstance(at, bool) or not isinstance(at, int | float):
        return str(d["to_class"]), None
    return str(d["to_class"]), float(at)


def _fold_python(events: Iterable[Event]) -> list[CheckpointState]:
    """`fold` one event at a time (`_fold_one`): the reference the vectorised fold is tested against."""
    groups: dict[tuple[str, int, int], list[Event]] = {}
    for e in sorted(events, key=lambda e: e.at):
        groups.setdefault((e.run, e.step, e.save), []).append(e)
    return [_fold_one(groups[k]) for k in sorted(groups)]


def fold(events: Iterable[Event]) -> list[CheckpointState]:
    """Current state of every checkpoint save, sorted by (run, step, save). Events must be in time
    order (as `Catalog.events` returns them); for equal times the input order is kept."""
    evs = list(events)
    if not evs:
        return []
    # The input position is the identity: (at, "", position) orders ties as the input does.
    return _states(_fold_table(_table(evs, [("", i) for i in range(len(evs))])))


_KEY = ("run", "step", "save")
_SCHEDULE_KINDS = ["expired", "transition_scheduled", "transitioned"]  # the last decides scheduled_*
# Columns the fold reads: `flow_run` is never folded, so readers of the current state skip it.
_FOLD_COLUMNS = ["run", "step", "event", "at", "format", "bytes", "files", "storage_class", "created_at", "ok",
                 "detail", "save"]  # fmt: skip


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
    fill: dict[str, Any] = {"format": "", "storage_class": "", "detail": "", "flow_run": "", "bytes": 0, "files": 0}
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


def _last_where(mask: pa.Array, idx: pa.Array) -> pa.Array:
    return pc.if_else(mask, idx, pa.scalar(None, pa.int64()))


def _fold_table(table: pa.Table) -> dict[str, list[Any]]:
    """The fold (`_fold_one`) of every checkpoint save in `table` (event columns plus identities),
    column at a time: sort by (run, step, save, at, origin, row), drop repeated identities, then per
    group the last row where a field was said. Returns the state's fields as columns (Python lists,
    `metrics` as dicts) plus `_last_at`/`_last_origin`/`_last_row` and `_origins`/`_rows` per save.
    Only the JSON in `detail` is parsed in Python, and only the one row per save that decides a field
    (earlier rows only when that one says nothing)."""
    table = _with_defaults(table)
    order = [(c, "ascending") for c in (*_KEY, "at", _ORIGIN, _ROW)]
    t = table.select([*_FOLD_COLUMNS, _ORIGIN, _ROW]).take(pc.sort_indices(table, sort_keys=order))
    t = t.combine_chunks()
    if t.num_rows > 1:
        # a repeated identity is the same event (a merge and its not-yet-deleted source): equal sort
        # keys, so its copies are adjacent
        o, r = t[_ORIGIN], t[_ROW]
        dup = pc.and_(pc.equal(o[1:], o[:-1]), pc.equal(r[1:], r[:-1]))
        t = t.filter(pa.concat_arrays([pa.array([True]), pc.invert(dup.combine_chunks())]))
    n = t.num_rows
    out: dict[str, list[Any]] = {}
    if n == 0:
        return out
    col = {c: t[c].combine_chunks() for c in t.column_names}
    idx = pa.array(np.arange(n, dtype=np.int64))
    starts = pa.array(np.ones(1, dtype=bool))
    if n > 1:
        change = pc.or_(pc.not_equal(col["run"][1:], col["run"][:-1]), pc.not_equal(col["step"][1:], col["step"][:-1]))
        change = pc.or_(change, pc.not_equal(col["save"][1:], col["save"][:-1]))
        starts = pa.concat_arrays([starts, change])
    gid = pc.subtract(pc.cumulative_sum(pc.cast(starts, pa.int64())), 1)
    ev = col["event"]
    sc = col["storage_class"]
    is_sc = pc.not_equal(sc, "")
    # A storage-class event changes the class when it names another class than the group's previous one.
    sc_idx = pc.filter(idx, is_sc)
    sc_g, sc_v = pc.filter(gid, is_sc), pc.filter(sc, is_sc)
    if len(sc_idx) > 1:
        moved = pc.or_(pc.not_equal(sc_g[1:], sc_g[:-1]), pc.not_equal(sc_v[1:], sc_v[:-1]))
        sc_change = pc.filter(sc_idx, pa.concat_arrays([pa.array(np.ones(1, dtype=bool)), moved]))
    else:
        sc_change = sc_idx
    is_change = pc.is_in(idx, value_set=sc_change)
    uv = pc.is_in(ev, value_set=pa.array(["uploaded", "verified"]))

    def kind(k: str) -> pa.Array:
        return pc.equal(ev, k)

    def may_name(field: str) -> pa.Array:
        # JSON names a key literally or through a \u escape: rows with neither cannot say `field`
        d = col["detail"]
        return pc.or_(pc.match_substring(d, field), pc.match_substring(d, "\\u"))

    masked = {
        "first": idx,
        "last": idx,
        "format": _last_where(pc.not_equal(col["format"], ""), idx),
        "bytes": _last_where(pc.not_equal(col["bytes"], 0), idx),
        "files": _last_where(pc.not_equal(col["files"], 0), idx),
        "created_at": _last_where(pc.is_valid(col["created_at"]), idx),
        "storage_class": _last_where(is_sc, idx),
        "change": _last_where(is_change, idx),
        "first_uv": _last_where(uv, idx),
        "metrics": _last_where(pc.and_(uv, may_name("metrics")), idx),
        "fingerprint": _last_where(pc.and_(uv, may_name("fingerprint")), idx),
        "verified": _last_where(kind("verified"), idx),
        "expired": _last_where(kind("expired"), idx),
        "schedule": _last_where(pc.is_in(ev, value_set=pa.array(_SCHEDULE_KINDS)), idx),
        "evicted": _last_where(kind("evicted_local"), idx),
        "drilled": _last_where(kind("drilled"), idx),
        "superseded": _last_where(kind("superseded"), idx),
    }  # fmt: skip
    aggs = [("first", "min"), ("first_uv", "min")] + [(k, "max") for k in masked if k not in ("first", "first_uv")]
    g = pa.table({"g": gid, **masked}).group_by("g", use_threads=False).aggregate(aggs)
    g = g.sort_by("g")
    ids = pa.table({"g": gid, "o": col[_ORIGIN], "r": col[_ROW]}).group_by("g", use_threads=False)
    ids_t = ids.aggregate([("o", "list"), ("r", "list")]).sort_by("g")

    def at(name: str, c: str) -> list[Any]:
        got: list[Any] = pc.take(col[c], g[name]).to_pylist()
        return got

    def pos(name: str) -> list[int | None]:
        got: list[int | None] = g[name].to_pylist()
        return got

    last = g["last_max"]
    details = col["detail"]
    out["run"], out["step"], out["save"] = at("first_min", "run"), at("first_min", "step"), at("first_min", "save")
    out["format"] = [x or "" for x in at("format_max", "format")]
    out["last_event"] = pc.take(ev, last).to_pylist()
    out["bytes"] = [x or 0 for x in at("bytes_max", "bytes")]
    out["files"] = [x or 0 for x in at("files_max", "files")]
    out["storage_class"] = [x or "" for x in at("storage_class_max", "storage_class")]
    out["created_at"] = at("created_at_max", "created_at")
    out["uploaded_at"] = at("first_uv_min", "at")
    ver, exp = pos("verified_max"), pos("expired_max")
    out["verified"] = [
        (v if v is not None else -1) > (x if x is not None else -1) for v, x in zip(ver, exp, strict=True)
    ]
    out["local_evicted"] = [x is not None for x in pos("evicted_max")]
    out["last_drill_at"], out["last_drill_ok"] = at("drilled_max", "at"), at("drilled_max", "ok")
    out["updated_at"] = pc.take(col["at"], last).to_pylist()
    out["detail"] = pc.take(details, last).to_pylist()
    out["class_since"] = [
        c if c is not None else u for c, u in zip(at("change_max", "at"), out["uploaded_at"], strict=True)
    ]
    sup = pos("superseded_max")
    out["superseded"] = [x is not None for x in sup]
    out["superseded_reason"] = [
        _reason(d) if i is not None else "" for i, d in zip(sup, at("superseded_max", "detail"), strict=True)
    ]
    sched = [
        ("", None) if i is None or k != "transition_scheduled" else _scheduled(d)
        for i, k, d in zip(pos("schedule_max"), at("schedule_max", "event"), at("schedule_max", "detail"), strict=True)
    ]
    out["scheduled_class"] = [c for c, _ in sched]
    out["scheduled_at"] = [a for _, a in sched]
    cand = {}
    for name in ("metrics", "fingerprint"):
        said = pc.is_valid(masked[name])
        cand[name] = (pc.filter(idx, said).to_numpy(), pc.filter(gid, said).to_numpy())

    def decide(name: str, parse: Any, empty: Any, said: Any) -> list[Any]:
        """The value of the last candidate row that says something, walking back only when the last says nothing."""
        res = []
        rows, groups = cand[name]
        for gi, i in enumerate(pos(f"{name}_max")):
            v = empty
            if i is not None:
                lo = int(np.searchsorted(groups, gi, side="left"))
                hi = int(np.searchsorted(rows, i, side="right"))
                for j in range(hi - 1, lo - 1, -1):
                    got = parse(details[int(rows[j])].as_py())
                    if said(got):
                        v = got
                        break
            res.append(v)
        return res

    out["metrics"] = decide("metrics", _metrics, {}, lambda m: m is not None)
    out["fingerprint"] = decide("fingerprint", lambda d: _field(d, "fingerprint"), "", bool)
    out["_last_at"] = out["updated_at"]
    out["_last_origin"] = pc.take(col[_ORIGIN], last).to_pylist()
    out["_last_row"] = pc.take(col[_ROW], last).to_pylist()
    out["_ids"] = [ids_t["o_list"], ids_t["r_list"]]  # arrow, for a snapshot
    return out


_STATE_FIELDS = [f.name for f in fields(CheckpointState)]


def _states(cols: dict[str, list[Any]]) -> list[CheckpointState]:
    if not cols:
        return []
    return [CheckpointState(*row) for row in zip(*(cols[name] for name in _STATE_FIELDS), strict=True)]


def newest_saves(states: Iterable[CheckpointState]) -> dict[tuple[str, int], CheckpointState]:
    """The newest save of each (run, step): what a step means when no save is named."""
    out: dict[tuple[str, int], CheckpointState] = {}
    for s in states:
        cur = out.get((s.run, s.step))
        if cur is None or s.save > cur.save:
            out[(s.run, s.step)] = s
    return out


_SNAPSHOT_SCHEMA = pa.schema(
    [
        ("run", pa.string()), ("step", pa.int64()), ("format", pa.string()), ("last_event", pa.string()),
        ("bytes", pa.int64()), ("files", pa.int64()), ("storage_class", pa.string()),
        ("created_at", pa.float64()), ("uploaded_at", pa.float64()), ("verified", pa.bool_()),
        ("local_evicted", pa.bool_()), ("last_drill_at", pa.float64()), ("last_drill_ok", pa.bool_()),
        ("metrics", pa.string()), ("updated_at", pa.float64()), ("detail", pa.string()),
        ("class_since", pa.float64()), ("save", pa.int64()), ("superseded", pa.bool_()),
        ("superseded_reason", pa.string()), ("scheduled_class", pa.string()), ("scheduled_at", pa.float64()),
        ("fingerprint", pa.string()), ("_last_at", pa.float64()), ("_last_origin", pa.string()),
        ("_last_row", pa.int64()), ("_origins", pa.list_(pa.string())), ("_rows", pa.list_(pa.int64())),
    ],
    metadata={b"schema": SNAPSHOT_TAG},
)  # fmt: skip
_STATE_COLUMNS = [*_STATE_FIELDS, "_last_at", "_last_origin", "_last_row"]


def run_partition(run: str) -> str:
    """The hive partition directory of `run` under `_catalog/` (docs/FORMAT.md: percent-encoded)."""
    return f"run={quote(run, safe='')}/"


@dataclass
class _Part:
    events: list[str]
    snapshots: list[str]


class _Vanished(Exception):
    """A listed catalog object was deleted before its GET: a compaction replaced it; list again."""


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


class Catalog:
    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.root = f"{self.prefix}/_catalog/" if self.prefix else "_catalog/"
        self.dir = f"{self.prefix}/{CATALOG_DIR}" if self.prefix else CATALOG_DIR  # the flat layout
        self.unreadable: dict[str, str] = {}  # catalog files this catalog could not read, and why

    def _part_dir(self, run: str) -> str:
        return self.root + run_partition(run)

    def _new_key(self, run: str, kind: str = "events", time_ns: int | None = None) -> str:
        ns = time.time_ns() if time_ns is None else time_ns
        return f"{self._part_dir(run)}{kind}/{ns:020d}-{uuid.uuid4().hex}.parquet"

    def _keys(self) -> list[str]:
        """The flat layout's event files."""
        return [o.key for o in self.store.list(self.dir) if o.key.endswith(".parquet")]

    def _listing(self, run: str | None) -> tuple[list[str], dict[str, _Part]]:
        """(flat files, partitions by run): one LIST of `_catalog/` for every run, or of the run's
        partition and of the flat directory for one."""
        parts: dict[str, _Part] = {}
        flat: list[str] = []
        prefixes = [self.root] if run is None else [self.dir, self._part_dir(run)]
        for prefix in prefixes:
            for o in self.store.list(prefix):
                rel = o.key[len(self.root) :].split("/")
                if not o.key.endswith(".parquet"):
                    continue
                if len(rel) == 2 and rel[0] == "events":
                    flat.append(o.key)
                elif len(rel) == 3 and rel[0].startswith("run=") and rel[1] in ("events", "snapshot"):
                    p = parts.setdefault(unquote(rel[0][4:]), _Part([], []))
                    (p.events if rel[1] == "events" else p.snapshots).append(o.key)
        return flat, parts

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get_bytes(key)
        except NotFoundError:
            raise _Vanished(key) from None

    def _skip(self, key: str, e: CatalogError) -> None:
        # One unreadable object (bit rot, a partial write, a stray file) must not stop every command,
        # a restore included, whose manifests are intact: name it and read the rest.
        if key not in self.unreadable:
            log.warning("catalog: skipping an unreadable catalog file: %s", e)
        self.unreadable[key] = str(e)

    def _read_tables(self, keys: Sequence[str], columns: Sequence[str] | None = None) -> list[pa.Table]:
        def read(k: str) -> pa.Table | None:
            data = self._get(k)
            try:
                return _normalise(_parquet(data or b"", k, columns), k)
            except CatalogError as e:
                self._skip(k, e)
                return None

        # Until a compaction runs there is one small file per flow run: fetch them concurrently, since
        # each GET is mostly round-trip latency.
        with ThreadPoolExecutor(max_workers=_READERS) as pool:
            got = list(pool.map(read, keys)) if len(keys) > 1 else [read(k) for k in keys]
        return [t for t in got if t is not None]

    def _retrying(self, fn: Any) -> Any:
        for _ in range(5):
            try:
                return fn()
            except _Vanished:
                continue  # a compaction deleted what we listed, after writing what replaces it
        return fn()

    def append(self, events: Sequence[Event]) -> str | None:
        """Write `events` as one new object per run, in that run's partition; returns the key of the
        first (None when there is nothing to write)."""
        if not events:
            return None
        by_run: dict[str, list[Event]] = {}
        for e in events:
            by_run.setdefault(e.run, []).append(e)
        ns = time.time_ns()
        first = None
        for run in sorted(by_run):
            key = self._new_key(run, time_ns=ns)
            # The key is unique by construction; if_none_match makes a (practically impossible)
            # collision an error instead of a silent overwrite of someone else's events.
            self.store.put_bytes(
                key, encode_events(by_run[run]), if_none_match=True, content_type="application/vnd.apache.parquet"
            )
            first = first or key
        return first

    def events(self, run: str | None = None) -> list[Event]:
        """All events (of `run`), sorted by time, then insertion."""

        def read() -> list[Event]:
            flat, parts = self._listing(run)
            keys = flat + [k for p in parts.values() for k in p.events]
            rows = [r for t in self._read_tables(keys) for r in _decode_rows(t, "")]
            return [e for e, _, _ in _dedup_sorted(rows) if run is None or e.run == run]

        got: list[Event] = self._retrying(read)
        return got

    def current(self, run: str | None = None) -> list[CheckpointState]:
        """The state of every checkpoint save (of `run`), sorted by (run, step, save). Reads each
        partition's newest snapshot and only the events written since (docs/FORMAT.md)."""

        def read() -> list[CheckpointState]:
            flat, parts = self._listing(run)
            flat_by_run: dict[str, pa.Table] = {}
            if flat:
                ft = _concat(self._read_tables(flat, _FOLD_COLUMNS))
                if ft is not None:
                    for r in pc.unique(ft["run"]).to_pylist():
                        if run is None or r == run:
                            flat_by_run[r] = ft.filter(pc.equal(ft["run"], r))
            runs = sorted(set(parts) | set(flat_by_run))
            if run is not None:
                runs = [r for r in runs if r == run]

            def one(r: str) -> list[CheckpointState]:
                return self._current_part(r, parts.get(r, _Part([], [])), flat_by_run.get(r))

            with ThreadPoolExecutor(max_workers=_READERS) as pool:
                return [s for states in pool.map(one, runs) for s in states]

        got: list[CheckpointState] = self._retrying(read)
        return got

    def _snapshot(self, keys: Sequence[str]) -> _Snapshot | None:
        """The newest readable snapshot of these."""
        for key in sorted(keys, reverse=True):
            data = self._get(key) or b""
            try:
                pf = pq.ParquetFile(pa.BufferReader(data))
                meta = pf.schema_arrow.metadata or {}
                if meta.get(b"schema") != SNAPSHOT_TAG:
                    raise CatalogError(f"{key}: not a catalog snapshot")
                covers = set(json.loads(meta[b"ckptvault.covers"]))
                cols = pf.read(columns=_STATE_COLUMNS).to_pydict()
            except (pa.ArrowInvalid, OSError, KeyError, ValueError) as e:
                self._skip(key, CatalogError(f"{key}: not a readable snapshot ({e})"))
                continue
            except CatalogError as e:
                self._skip(key, e)
                continue
            cols["metrics"] = [json.loads(m) for m in cols["metrics"]]
            states = {}
            for row in zip(*(cols[n] for n in _STATE_COLUMNS), strict=True):
                s = CheckpointState(*row[: len(_STATE_FIELDS)])
                states[(s.step, s.save)] = (s, (row[-3], row[-2], row[-1]))
            return _Snapshot(key, covers, states, data)
        return None

    def _current_part(self, run: str, part: _Part, flat: pa.Table | None) -> list[CheckpointState]:
        snap = self._snapshot(part.snapshots) if part.snapshots else None
        if snap is None:
            return self._fold_part(part, flat)
        tables = self._read_tables([k for k in part.events if k not in snap.covers], _FOLD_COLUMNS)
        since = _concat([*tables, *([flat] if flat is not None else [])])
        if since is None:
            return [s for s, _ in sorted(snap.states.values(), key=lambda v: v[0].key)]
        covered = snap.ids()
        rows = _dedup_sorted(r for r in _decode_rows(since, "") if (r[1], r[2]) not in covered)
        out = {k: s for k, (s, _) in snap.states.items()}
        later: dict[tuple[int, int], list[Event]] = {}
        for e, o, i in rows:
            k = (e.step, e.save)
            if k in snap.states and (e.at, o, i) <= snap.states[k][1]:
                # an event older than what the snapshot folded (written with an old `at`): fold again
                return self._fold_part(part, flat)
            later.setdefault(k, []).append(e)
        for k, evs in later.items():
            evs.sort(key=lambda e: e.at)  # stable: (origin, row) order is kept for ties
            out[k] = _fold_one(evs, out.get(k))
        return [out[k] for k in sorted(out)]

    def _fold_part(self, part: _Part, flat: pa.Table | None) -> list[CheckpointState]:
        t = _concat([*self._read_tables(part.events, _FOLD_COLUMNS), *([flat] if flat is not None else [])])
        return _states(_fold_table(t)) if t is not None else []

    def compact(
        self,
        older_than: float,
        *,
        runs: Iterable[str] | None = None,
        max_partitions: int | None = None,
        max_seconds: float | None = None,
    ) -> int:
        """Migrate the flat layout (up to MIGRATE_FILES files), then compact partitions (of `runs`, or
        all): merge each one's event files written before `older_than` (unix s) into one and write its
        snapshot. Returns how many event files were merged or migrated. Stops between partitions after
        `max_partitions` or `max_seconds`; what it did not reach waits for the next call. Only files
        listed before the merge are deleted, and only after the merged file and snapshot are written,
        so concurrent appends are never lost (docs/FORMAT.md)."""
        t0 = time.monotonic()
        done = self._migrate()
        cutoff = int(older_than * 1e9)
        wanted = None if runs is None else set(runs)
        if wanted is not None and len(wanted) == 1:
            [only] = wanted
            _, parts = self._listing(only)
        else:
            _, parts = self._listing(None)
        todo = []
        for run, p in parts.items():
            if wanted is not None and run not in wanted:
                continue
            old = [k for k in p.events if _key_time_ns(k) < cutoff]
            if len(old) >= 2 or (old and not p.snapshots) or len(p.snapshots) > 1:
                todo.append((len(old), run, old, p.snapshots))
        todo.sort(key=lambda x: (-x[0], x[1]))  # the partitions with the most files first
        for i, (_, run, old, snaps) in enumerate(todo):
            if max_partitions is not None and i >= max_partitions:
                break
            if max_seconds is not None and time.monotonic() - t0 > max_seconds:
                break
            try:
                done += self._compact_part(run, old, snaps)
            except _Vanished:
                continue  # another compaction got there first
        return done

    def _compact_part(self, run: str, old: list[str], snaps: list[str]) -> int:
        tables = self._read_tables(old)
        t = _concat(tables)
        readable = [k for k in old if k not in self.unreadable]
        merged = None
        if t is not None and len(readable) > 1:
            merged = self._new_key(run, time_ns=max(_key_time_ns(o) for o in pc.unique(t[_ORIGIN]).to_pylist()))
            self.store.put_bytes(
                merged, _to_bytes(_full(t)), if_none_match=True, content_type="application/vnd.apache.parquet"
            )
        if t is not None:
            covers = [*readable, *([merged] if merged else [])]
            self.store.put_bytes(
                self._new_key(run, "snapshot"), _snapshot_bytes(_fold_table(t), covers),
                if_none_match=True, content_type="application/vnd.apache.parquet",
            )  # fmt: skip
        for k in old:
            if k in self.unreadable:
                self._set_aside(k)
            elif merged is not None:
                self.store.delete(k)
        for k in snaps:
            self.store.delete(k)
        return len(old) if merged is not None else 0

    def _migrate(self) -> int:
        """Move up to MIGRATE_FILES files of the flat layout into the partitions (docs/FORMAT.md)."""
        flat = sorted(self._keys())[:MIGRATE_FILES]
        if not flat:
            return 0
        t = _concat(self._read_tables(flat))
        if t is not None:
            t = _full(t)
            for r in pc.unique(t["run"]).to_pylist():
                part = t.filter(pc.equal(t["run"], r))
                ns = max(_key_time_ns(o) for o in pc.unique(part[_ORIGIN]).to_pylist())
                self.store.put_bytes(
                    self._new_key(r, time_ns=ns), _to_bytes(part), if_none_match=True,
                    content_type="application/vnd.apache.parquet",
                )  # fmt: skip
        for k in flat:
            if k in self.unreadable:
                self._set_aside(k)
            else:
                self.store.delete(k)
        return len(flat)

    def _set_aside(self, key: str) -> None:
        """Move an unreadable catalog file out of the log, never delete it: it may be the only copy of
        events someone can still recover by hand."""
        rel = key[len(self.root) :]
        aside = self.root + "unreadable/" + (rel[len("events/") :] if rel.startswith("events/") else rel)
        self.store.put_bytes(aside, self.store.get_bytes(key), content_type="application/octet-stream")
        self.store.delete(key)
        log.warning("catalog: set the unreadable catalog file %s aside as %s", key, aside)

    def rebuild_from_manifests(self, progress: Callable[[int], Callable[[int], None]] | None = None) -> list[Event]:
        """One "verified" event per checkpoint whose manifest is in the bucket, at its upload time. The
        storage class is the most common among the checkpoint's data objects. Nothing is appended: the
        caller decides (e.g. `cat.append(cat.rebuild_from_manifests())` into an empty catalog).
        `progress`, given the number of manifests once they are listed, returns what is called with 1
        per manifest fetched (e.g. a ProgressBar)."""
        root = f"{self.prefix}/" if self.prefix else ""
        classes: dict[str, Counter[str]] = {}
        manifests: list[tuple[str, float]] = []
        for o in self.store.list(root):
            rel = o.key[len(root) :].split("/")
            if len(rel) < 3 or rel[0] == "_catalog" or parse_save_dir(rel[1]) is None:
                continue
            ckpt = "/".join(rel[:2])
            if len(rel) == 3 and rel[2] == MANIFEST_NAME:
                manifests.append((o.key, o.last_modified))
            elif not (len(rel) == 3 and rel[2] == VALIDATION_NAME):
                classes.setdefault(ckpt, Counter())[o.storage_class] += 1
        tick = progress(len(manifests)) if progress is not None else None

        def fetch(item: tuple[str, float]) -> bytes:
            data = self.store.get_bytes(item[0])
            if tick is not None:
                tick(1)
            return data

        # Each GET is mostly a round trip: fetched concurrently, in listing order for a deterministic result.
        with ThreadPoolExecutor(max_workers=_MANIFEST_READERS) as pool:
            bodies = list(pool.map(fetch, manifests))
        out = []
        for (key, modified), body in zip(manifests, bodies, strict=True):
            run, sdir = key[len(root) :].split("/")[:2]
            ckpt = f"{run}/{sdir}"
            try:
                m = Manifest.from_json(body, origin=key)
            except ManifestError as e:
                # Unreadable manifest: the checkpoint does not exist for readers, but say so.
                step, save = parse_save_dir(sdir) or (0, 1)
                out.append(
                    Event(
                        run=run,
                        step=step,
                        save=save,
                        event="invalid",
                        at=modified,
                        detail=json.dumps({"source": "rebuild_from_manifests", "reason": str(e)}),
                    )
                )
                continue
            counts = classes.get(ckpt)
            # Ties go to the alphabetically first class so a rebuild is deterministic.
            cls = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else "STANDARD"
            detail = json.dumps({"source": "rebuild_from_manifests", "manifest": key, "metrics": m.metrics})
            out.append(Event(
                run=m.run, step=m.step, save=m.save, event="verified", at=m.uploaded_at, format=m.format,
                bytes=m.total_bytes, files=len(m.files), storage_class=cls, created_at=m.created_at,
                detail=detail,
            ))  # fmt: skip
        return out


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


def _snapshot_bytes(cols: dict[str, list[Any]], covers: Sequence[str]) -> bytes:
    data = {n: cols[n] for n in _STATE_COLUMNS}
    data["metrics"] = [json.dumps(m) for m in cols["metrics"]]
    origins, rows = cols["_ids"]
    schema = _SNAPSHOT_SCHEMA.with_metadata({b"schema": SNAPSHOT_TAG, b"ckptvault.covers": json.dumps(list(covers))})
    table = pa.Table.from_pydict({**data, "_origins": origins, "_rows": rows}, schema=schema)
    return _to_bytes(table)


def _key_time_ns(key: str) -> int:
    name = key.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0
