"""The fold: a checkpoint save's current state from its events in time order. `_fold_one` is the
definition, one event at a time; `_fold_table` computes the same column at a time with pyarrow compute
(sort, group by checkpoint, last row that says each field)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckptvault.catalog.codec import _FOLD_COLUMNS, _ORIGIN, _ROW, _table, _with_defaults
from ckptvault.catalog.model import SIDE_EVENTS, CheckpointState, Event, ReplicaCopy


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
        s0["written_by"] = dict(start.written_by)
        s0["replicas"] = tuple(start.replicas)
        return _fold_into(s0, events)
    s: dict[str, Any] = dict(
        run=first.run, step=first.step, format="", last_event="", bytes=0, files=0, storage_class="",
        created_at=None, uploaded_at=None, verified=False, local_evicted=False, last_drill_at=None,
        last_drill_ok=None, metrics={}, updated_at=first.at, detail="", class_since=None,
        save=first.save, superseded=False, superseded_reason="", scheduled_class="", scheduled_at=None,
        fingerprint="", stored_bytes=0, locked_until=None, legal_hold=False, replicas=(), rpo_seconds=None,
        model_bytes=None, optimizer_bytes=None, written_by={},
    )  # fmt: skip
    return _fold_into(s, events)


def _fold_into(s: dict[str, Any], events: Sequence[Event]) -> CheckpointState:
    for e in events:
        # Later events refine what is known; empty fields mean "not said", never "cleared".
        if e.format:
            s["format"] = e.format
        if e.bytes:
            s["bytes"] = e.bytes
        if e.stored_bytes:
            s["stored_bytes"] = e.stored_bytes
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
            split = _parts(e.detail)
            if split is not None:
                s["model_bytes"], s["optimizer_bytes"] = split
            wrote = _written_by(e.detail)
            if wrote is not None:
                s["written_by"] = wrote
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
        elif e.event in ("held", "released"):
            s["legal_hold"] = e.event == "held"
        until = _locked_until(e.detail)
        if until is not None:
            s["locked_until"] = until
        rpo = _rpo_seconds(e.detail)
        if rpo is not None:
            s["rpo_seconds"] = rpo
        if e.event == "replicated":
            s["replicas"] = _with_copy(s["replicas"], e.detail, e.at)
        if e.event not in SIDE_EVENTS:
            s["last_event"], s["updated_at"], s["detail"] = e.event, e.at, e.detail
    return CheckpointState(**s)


def _with_copy(replicas: tuple[ReplicaCopy, ...], detail: str, at: float) -> tuple[ReplicaCopy, ...]:
    """`replicas` with the copy a `replicated` event (its detail, its time) records in place of that
    store's earlier one."""
    copy = _replica_copy(detail, at)
    if copy is None:
        return replicas
    same = [i for i, r in enumerate(replicas) if r.store == copy.store]
    if same:
        return (*replicas[: same[0]], copy, *replicas[same[0] + 1 :])
    return (*replicas, copy)


def _replica_copy(detail: str, at: float) -> ReplicaCopy | None:
    """The copy a `replicated` event's detail records, or None when it names no store."""
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return None
    if not isinstance(d, dict) or not d.get("store"):
        return None
    until = d.get("retain_until")
    until = float(until) if isinstance(until, int | float) and not isinstance(until, bool) else None
    return ReplicaCopy(str(d["store"]), str(d.get("storage_class") or ""), at, until)


def written_by_from_column(values: Sequence[str | None]) -> list[dict[str, str]]:
    """A snapshot's `written_by` column (JSON objects as text, json.dumps of the state's dict, so that
    `ls --json` can print it as it is) as the states' dicts, in one parse for the column."""
    got: list[dict[str, str]] = json.loads("[" + ",".join(v or "{}" for v in values) + "]")
    return got


def replicas_column(values: Sequence[tuple[ReplicaCopy, ...]]) -> list[str]:
    """States' `replicas` as a snapshot's string column holds them (docs/FORMAT.md, "The copies in
    the state"): per save a JSON list of [store, storage_class, verified_at, retain_until], "" for none."""
    return [
        json.dumps([[r.store, r.storage_class, r.verified_at, r.retain_until] for r in v]) if v else "" for v in values
    ]


def replicas_from_column(values: Sequence[str | None]) -> list[tuple[ReplicaCopy, ...]]:
    """`replicas_column` read back; a null or "" (no copy, or a snapshot before the column) is none."""
    return [
        tuple(ReplicaCopy(str(a), str(b), float(c), None if d is None else float(d)) for a, b, c, d in json.loads(v))
        if v
        else ()
        for v in values
    ]


def _field(detail: str, name: str) -> str:
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return ""
    return str(d.get(name) or "") if isinstance(d, dict) else ""


def _locked_until(detail: str) -> float | None:
    """The `locked_until` a detail says (unix s), or None: absent, not a number, or not JSON."""
    return _number(detail, "locked_until")


def _rpo_seconds(detail: str) -> float | None:
    """The `rpo_seconds` a detail says (a `verified` event's, written by an ingest), or None (also for
    a value that is not finite: no duration, and `ls` could not print it as milliseconds)."""
    v = _number(detail, "rpo_seconds")
    return v if v is not None and math.isfinite(v) else None


def _parts(detail: str) -> tuple[int, int] | None:
    """(model, optimizer) bytes of a `verified` event's `parts`, or None: absent (the layout cannot tell,
    or an event before it), not JSON, or a value that is not an integer a snapshot's int64 column holds
    from 0 up."""
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return None
    p = d.get("parts") if isinstance(d, dict) else None
    if not isinstance(p, dict):
        return None
    m, o = p.get("model"), p.get("optimizer")
    if isinstance(m, bool) or isinstance(o, bool) or not isinstance(m, int) or not isinstance(o, int):
        return None
    return (m, o) if 0 <= m < 2**63 and 0 <= o < 2**63 else None


def _written_by(detail: str) -> dict[str, str] | None:
    """A `verified` event's `written_by` ({package or format: version}), or None: absent (nothing
    recorded, or an event before it), not JSON, not an object. Values that are not strings are left out."""
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return None
    w = d.get("written_by") if isinstance(d, dict) else None
    if not isinstance(w, dict):
        return None
    return {str(k): v for k, v in w.items() if isinstance(v, str)}


def _number(detail: str, name: str) -> float | None:
    try:
        d = json.loads(detail) if detail else None
    except json.JSONDecodeError:
        return None
    v = d.get(name) if isinstance(d, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


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

    side = pc.is_in(ev, value_set=pa.array(list(SIDE_EVENTS)))
    masked = {
        "first": idx,
        "last": idx,
        "own_last": _last_where(pc.invert(side), idx),  # the last event of the save's own life
        "format": _last_where(pc.not_equal(col["format"], ""), idx),
        "bytes": _last_where(pc.not_equal(col["bytes"], 0), idx),
        "files": _last_where(pc.not_equal(col["files"], 0), idx),
        "stored_bytes": _last_where(pc.fill_null(pc.not_equal(col["stored_bytes"], 0), False), idx),
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
        "hold": _last_where(pc.is_in(ev, value_set=pa.array(["held", "released"])), idx),
        "locked_until": _last_where(may_name("locked_until"), idx),
        "rpo_seconds": _last_where(may_name("rpo_seconds"), idx),
        "parts": _last_where(pc.and_(kind("verified"), may_name("parts")), idx),
        "written_by": _last_where(pc.and_(kind("verified"), may_name("written_by")), idx),
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
    # a save whose every event is a side event (none is written so) has none, as in `_fold_one`
    own = g["own_last_max"]
    details = col["detail"]
    out["run"], out["step"], out["save"] = at("first_min", "run"), at("first_min", "step"), at("first_min", "save")
    out["format"] = [x or "" for x in at("format_max", "format")]
    out["last_event"] = pc.fill_null(pc.take(ev, own), "").to_pylist()
    out["bytes"] = [x or 0 for x in at("bytes_max", "bytes")]
    out["files"] = [x or 0 for x in at("files_max", "files")]
    out["stored_bytes"] = [x or 0 for x in at("stored_bytes_max", "stored_bytes")]
    out["storage_class"] = [x or "" for x in at("storage_class_max", "storage_class")]
    out["created_at"] = at("created_at_max", "created_at")
    out["uploaded_at"] = at("first_uv_min", "at")
    ver, exp = pos("verified_max"), pos("expired_max")
    out["verified"] = [
        (v if v is not None else -1) > (x if x is not None else -1) for v, x in zip(ver, exp, strict=True)
    ]
    out["local_evicted"] = [x is not None for x in pos("evicted_max")]
    out["last_drill_at"], out["last_drill_ok"] = at("drilled_max", "at"), at("drilled_max", "ok")
    out["updated_at"] = pc.coalesce(pc.take(col["at"], own), pc.take(col["at"], g["first_min"])).to_pylist()
    out["detail"] = pc.fill_null(pc.take(details, own), "").to_pylist()
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
    out["legal_hold"] = [k == "held" for k in at("hold_max", "event")]
    cand = {}
    for name in ("metrics", "fingerprint", "locked_until", "rpo_seconds", "parts", "written_by"):
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
    out["locked_until"] = decide("locked_until", _locked_until, None, lambda v: v is not None)
    out["rpo_seconds"] = decide("rpo_seconds", _rpo_seconds, None, lambda v: v is not None)
    split = decide("parts", _parts, None, lambda v: v is not None)
    out["model_bytes"] = [None if p is None else p[0] for p in split]
    out["optimizer_bytes"] = [None if p is None else p[1] for p in split]
    out["written_by"] = decide("written_by", _written_by, {}, lambda v: v is not None)
    out["replicas"] = _replicas_by_group(col, side, gid, len(out["run"]))
    out["_last_at"] = pc.take(col["at"], last).to_pylist()
    out["_last_origin"] = pc.take(col[_ORIGIN], last).to_pylist()
    out["_last_row"] = pc.take(col[_ROW], last).to_pylist()
    out["_ids"] = [ids_t["o_list"], ids_t["r_list"]]  # arrow, for a snapshot
    return out


def _replicas_by_group(
    col: dict[str, Any], side: pa.Array, gid: pa.Array, groups: int
) -> list[tuple[ReplicaCopy, ...]]:
    """Each group's `replicas`: its side events, in time order, one at a time as `_fold_into` takes them."""
    out: list[tuple[ReplicaCopy, ...]] = [()] * groups
    if not pc.any(side).as_py():
        return out
    rows = zip(
        pc.filter(gid, side).to_pylist(), pc.filter(col["event"], side).to_pylist(),
        pc.filter(col["detail"], side).to_pylist(), pc.filter(col["at"], side).to_pylist(), strict=True,
    )  # fmt: skip
    for g, kind, detail, at in rows:
        if kind == "replicated":
            out[g] = _with_copy(out[g], detail, at)
    return out


_STATE_FIELDS = [f.name for f in fields(CheckpointState)]


def _states(cols: dict[str, list[Any]]) -> list[CheckpointState]:
    if not cols:
        return []
    return [CheckpointState(*row) for row in zip(*(cols[name] for name in _STATE_FIELDS), strict=True)]
