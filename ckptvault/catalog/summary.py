"""The fleet at a glance, column at a time: what `ckptvault.observe.metrics` exports (docs/metrics.md), reduced
from the current state's Arrow table (`table_view.current_table`) with numpy, never a `CheckpointState`
per save, so a fleet of 200,000 saves is summed in a fraction of a second. Every figure here has its
per-state definition on `CheckpointState` (`state`, `good`, `billed_bytes`, `replicas`) and in
`catalog stats` (what is in the store: uploaded and not expired); tests/unit/test_metrics.py checks the
two agree on the in-memory store."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ckptvault.catalog.fold import replicas_from_column
from ckptvault.catalog.model import LIFECYCLE_STATES
from ckptvault.catalog.stats import writer_pairs
from ckptvault.catalog.table_view import _state_codes, current_table

if TYPE_CHECKING:
    from ckptvault.catalog.eventlog import Catalog

DAY = 86400.0
# The columns of the current state `summarize_table` reads (`_state_codes` the first five): all a
# metrics read decodes of the combined snapshot (bench/README.md, "The catalog"). A figure reading
# another column adds it here.
COLUMNS = (
    "run", "last_event", "verified", "superseded", "last_drill_ok", "last_drill_at", "uploaded_at",
    "created_at", "bytes", "stored_bytes", "files", "storage_class", "replicas", "rpo_seconds", "written_by",
)  # fmt: skip
_VERIFIED, _SUSPECT, _EXPIRED = (LIFECYCLE_STATES.index(s) for s in ("verified", "suspect", "expired"))


@dataclass(frozen=True)
class RunSummary:
    """One run's figures; None where nothing happened yet (no verified save, never drilled)."""

    newest_verified_at: float | None  # commit time (the `verified` event) of its newest good save
    newest_created_at: float | None  # when the trainer wrote that save (its files' newest mtime)
    newest_lag_seconds: float | None  # that save's created -> verified
    last_drill_at: float | None  # the newest drill of any of its saves
    last_drill_ok: bool | None  # that drill's result
    last_drill_success_at: float | None  # the newest drill that passed (a save's last drill)
    suspect: int  # verified saves whose last drill failed
    # that newest good save's RPO (its commit marker to its manifest's commit), when its ingest recorded it
    newest_rpo_seconds: float | None = None


@dataclass(frozen=True)
class ClassSummary:
    """The saves in the store in one storage class, with what pricing needs per save."""

    saves: int
    bytes: int  # the files' original sizes (what a restore writes)
    stored_bytes: int  # what the objects occupy (compressed where compressed): what the class bills
    billed: np.ndarray = field(repr=False)  # per save: stored bytes
    objects: np.ndarray = field(repr=False)  # per save: its object count (files, at least 1)


@dataclass(frozen=True)
class FleetSummary:
    runs: dict[str, RunSummary]
    by_state: dict[str, int]  # every lifecycle state, 0 included
    by_class: dict[str, ClassSummary]
    lag_seconds: np.ndarray = field(repr=False)  # created -> verified of each save in the store
    drillable: int = 0  # verified, not superseded, not expired (ckptvault/restore/drill.py)
    drill_covered: int = 0  # drillable saves drilled within cover_days of now (ever, without cover_days)
    never_drilled: int = 0
    replica_saves: dict[str, int] = field(default_factory=dict)  # [[replicas]] name -> saves with a copy there
    read_seconds: float = 0.0  # reading the catalog's current state
    unreadable: int = 0  # catalog objects the read skipped (Catalog.unreadable)
    # run -> original bytes of every save ever committed (uploaded_at set, expired and superseded ones
    # included: a save's row is never dropped), the counter ckptvault_ingest_bytes_total. Columns: run,
    # bytes, uploaded_at (read above already)
    ingested_bytes: dict[str, int] = field(default_factory=dict)
    # (writer, version) -> saves in the store whose checkpoint records it (as `catalog stats` by_writer
    # counts them), the gauge ckptvault_saves_by_writer
    by_writer: dict[tuple[str, str], int] = field(default_factory=dict)


def _floats(t: pa.Table, c: str) -> np.ndarray:
    """A float column as numpy, null as NaN."""
    got: np.ndarray = t[c].combine_chunks().to_numpy(zero_copy_only=False).astype(np.float64)
    return got


def _ints(t: pa.Table, c: str) -> np.ndarray:
    got: np.ndarray = pc.fill_null(t[c].combine_chunks(), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return got


def _last_in_group(group: np.ndarray, key: np.ndarray, rows: np.ndarray) -> dict[int, int]:
    """Of `rows`, the row with the largest `key` in each `group` (ties: the later row), as group -> row."""
    if not len(rows):
        return {}
    order = rows[np.lexsort((rows, key[rows], group[rows]))]
    g = group[order]
    ends = np.flatnonzero(np.append(g[1:] != g[:-1], True))
    return {int(g[i]): int(order[i]) for i in ends}


def _opt(v: float) -> float | None:
    return None if np.isnan(v) else float(v)


def summarize_table(
    t: pa.Table, now: float, cover_days: float | None = None, read_seconds: float = 0.0, unreadable: int = 0
) -> FleetSummary:
    """The figures of `current_table`'s rows at `now`."""
    n = t.num_rows
    codes = _state_codes(t) if n else np.zeros(0, dtype=np.int8)
    d = pc.dictionary_encode(t["run"].combine_chunks())
    names: list[str] = d.dictionary.to_pylist()
    run = d.indices.to_numpy(zero_copy_only=False).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    up, created, drill_at = _floats(t, "uploaded_at"), _floats(t, "created_at"), _floats(t, "last_drill_at")
    rpo = _floats(t, "rpo_seconds") if "rpo_seconds" in t.column_names else np.full(n, np.nan)
    drill_ok = pc.fill_null(t["last_drill_ok"].combine_chunks(), False).to_numpy(zero_copy_only=False)
    idx = np.arange(n)

    good = np.flatnonzero((codes == _VERIFIED) & ~np.isnan(up))
    newest = _last_in_group(run, up, good)
    drilled = np.flatnonzero(~np.isnan(drill_at))
    last_drill = _last_in_group(run, drill_at, drilled)
    last_pass = _last_in_group(run, drill_at, drilled[drill_ok[drilled].astype(bool)])
    suspect = np.bincount(run[codes == _SUSPECT], minlength=len(names))
    runs: dict[str, RunSummary] = {}
    for i, name in enumerate(names):
        g, dr, ok = newest.get(i), last_drill.get(i), last_pass.get(i)
        runs[name] = RunSummary(
            newest_verified_at=None if g is None else float(up[g]),
            newest_created_at=None if g is None else _opt(created[g]),
            newest_lag_seconds=None if g is None else _opt(up[g] - created[g]),
            last_drill_at=None if dr is None else float(drill_at[dr]),
            last_drill_ok=None if dr is None else bool(drill_ok[dr]),
            last_drill_success_at=None if ok is None else float(drill_at[ok]),
            suspect=int(suspect[i]),
            newest_rpo_seconds=None if g is None else _opt(rpo[g]),
        )

    counts = np.bincount(codes, minlength=len(LIFECYCLE_STATES))
    by_state = {s: int(counts[i]) for i, s in enumerate(LIFECYCLE_STATES)}

    # in the store: as `catalog stats` counts (uploaded, not expired), the class "" read as STANDARD
    stored = (~np.isnan(up)) & (codes != _EXPIRED)
    nbytes, sbytes, files = _ints(t, "bytes"), _ints(t, "stored_bytes"), _ints(t, "files")
    billed = np.where(sbytes == 0, nbytes, sbytes)
    cls = pc.fill_null(t["storage_class"].combine_chunks(), "")
    cls = pc.if_else(pc.equal(cls, ""), "STANDARD", cls) if n else cls
    cd = pc.dictionary_encode(cls)
    ci = cd.indices.to_numpy(zero_copy_only=False).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
    by_class: dict[str, ClassSummary] = {}
    for j, c in enumerate(cd.dictionary.to_pylist()):
        rows = idx[stored & (ci == j)]
        if len(rows):
            by_class[c] = ClassSummary(
                saves=len(rows), bytes=int(nbytes[rows].sum()), stored_bytes=int(billed[rows].sum()),
                billed=billed[rows], objects=np.maximum(files[rows], 1),
            )  # fmt: skip
    lag = (up - created)[stored & ~np.isnan(created)]
    committed = ~np.isnan(up)
    ingested = np.bincount(run[committed], weights=nbytes[committed], minlength=len(names)) if n else np.zeros(0)

    drillable = (codes == _VERIFIED) | (codes == _SUSPECT)
    since = -np.inf if cover_days is None else now - cover_days * DAY
    with np.errstate(invalid="ignore"):
        covered = drillable & (drill_at >= since)  # NaN (never drilled) compares False

    replicas: Counter[str] = Counter()
    col = pc.fill_null(t["replicas"].combine_chunks(), "") if n else None
    if col is not None and pc.any(pc.not_equal(col, "")).as_py():
        for copies in replicas_from_column(pc.filter(col, pc.not_equal(col, "")).to_pylist()):
            replicas.update({c.store for c in copies})
    # what wrote the saves in the store: each distinct written_by text parsed once (most saves of a run share it)
    writers: Counter[tuple[str, str]] = Counter()
    if n and "written_by" in t.column_names:
        wd = pc.dictionary_encode(pc.fill_null(t["written_by"].combine_chunks(), "{}"))
        wi = wd.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        per_text = np.bincount(wi[stored], minlength=len(wd.dictionary))
        for text, count in zip(wd.dictionary.to_pylist(), per_text, strict=True):
            if count:
                writers.update(dict.fromkeys(writer_pairs(json.loads(text or "{}")), int(count)))
    return FleetSummary(
        runs=runs, by_state=by_state, by_class=by_class, lag_seconds=lag, drillable=int(drillable.sum()),
        drill_covered=int(covered.sum()), never_drilled=int((drillable & np.isnan(drill_at)).sum()),
        replica_saves=dict(replicas), read_seconds=read_seconds, unreadable=unreadable,
        ingested_bytes={name: int(ingested[i]) for i, name in enumerate(names)}, by_writer=dict(writers),
    )  # fmt: skip


def summarize(cat: Catalog, now: float, cover_days: float | None = None) -> FleetSummary:
    """The catalog's current state (snapshots and the events since, as `ls` reads it), summed at `now`."""
    t0 = time.perf_counter()
    t = current_table(cat, columns=COLUMNS)
    read = time.perf_counter() - t0
    return summarize_table(t, now, cover_days, read, len(cat.unreadable))
