"""Compaction (docs/FORMAT.md, "Compaction" and "The flat layout before partitions"): per partition, merge
the old event files into one and write a snapshot of their fold, and only then delete what was merged;
migrate the flat layout into the partitions; set unreadable files aside, never delete them. A compaction
without deletes (`deletes=False`, for credentials without s3:DeleteObject: docs/FORMAT.md, "Compaction
without deletes") only writes snapshots, and leaves the merging and deleting to one that may delete."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ckptvault.catalog.codec import (
    _ORIGIN,
    _concat,
    _decode_rows,
    _dedup_sorted,
    _full,
    _normalise,
    _parquet,
    _to_bytes,
)
from ckptvault.catalog.combined import (
    COMBINED_DIR,
    RunCover,
    UnreadableSnapshot,
    combined_bytes,
    snapshot_cover,
)
from ckptvault.catalog.fold import _STATE_FIELDS, _fold_one, _fold_table
from ckptvault.catalog.layout import _key_time_ns, _Part, _Vanished, new_key
from ckptvault.catalog.model import CatalogError, CheckpointState, Event
from ckptvault.catalog.snapshot import _Snapshot, _snapshot_bytes
from ckptvault.store.errors import NotFoundError, StoreError

if TYPE_CHECKING:
    from ckptvault.catalog.reading import CatalogReader

MIGRATE_FILES = 500  # flat-layout files one compaction migrates: bounds its memory and time
COMPACT_SECONDS = 60.0  # the flows' time box for compaction, checked between partitions
# Partitions compacted at a time: each is a few small GETs, two PUTs and a DELETE per merged file, mostly
# round trips (bench/README.md, "compaction of a day"). Within one, the deletes stay in order.
_COMPACTORS = 4
_FLAT_READERS = 8  # flat-layout files fetched at a time (as the catalog's reads): round trips, mostly
# Without deletes, a partition with event files newer than its newest snapshot gets a new one only when
# that snapshot is at least this old (`older_than` is the compaction's "now"). Checkpoints saved further
# apart get a snapshot at each ingest that recorded one, so reads stay one snapshot (and the combined one
# covers the run); 10-minute ingests that all record something leave a reader at most 2 event files
# beside the snapshot, and 48 snapshots per run (and 48 combined ones) a day for the tier run to clear.
SNAPSHOT_EVERY_SECONDS = 1800
log = logging.getLogger("ckptvault.catalog")


def compact(
    cat: CatalogReader,
    older_than: float,
    *,
    runs: Iterable[str] | None = None,
    max_partitions: int | None = None,
    max_seconds: float | None = None,
    deletes: bool = True,
    progress: Callable[[int], Callable[[int], None]] | None = None,
    workers: int = _COMPACTORS,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Migrate the flat layout (up to MIGRATE_FILES files; each run moved with its snapshot, the time box
    checked between runs), then compact partitions (of `runs` and of
    the runs the migration moved, or all; and any listed partition without a snapshot, so that a
    catalog upgraded from the flat layout or grown by many runs at once reads from snapshots after a
    few passes, not after the daily tier run has reached every run): merge each one's event files
    written before `older_than` (unix s) into one and write its snapshot. `progress`, given the number
    of partitions to compact, returns what is called with 1 as each is done; `workers` partitions at
    a time. Returns how many event files were merged or migrated. Stops between partitions after
    `max_partitions` or `max_seconds`; what it did not reach waits for the next call. Only files
    listed before the merge are deleted, and only after the merged file and snapshot are written,
    so concurrent appends are never lost (docs/FORMAT.md). With `deletes=False` nothing is deleted,
    merged, migrated or set aside: a partition with event files newer than its newest snapshot, if
    that is SNAPSHOT_EVERY_SECONDS older than `older_than` (or there is none), gets a snapshot of every
    listed event file, naming the snapshots it supersedes in its `covers`; the combined snapshot is
    written as usual and the older ones kept. `clock` (monotonic seconds) times the box."""
    t0 = clock()
    deadline = None if max_seconds is None else t0 + max_seconds
    done, moved, migrated = 0, set[str](), list[_Piece]()
    listing = None
    if deletes and cat._keys():
        # the migration moves each run with its partition's files, so it needs every run's listing
        flat, parts, combined = listing = cat._list(None)
        done, moved, migrated, flat = _migrate(cat, flat, parts, deadline, clock, workers, progress)
    ended = listing is not None and not flat  # this pass deleted the last flat file
    cutoff = int(older_than * 1e9)
    wanted = None if runs is None else set(runs) | moved
    whole = listing is not None or not (wanted is not None and len(wanted) == 1)  # the listing is of every run
    if listing is not None:
        pass  # the migration's listing, as it left it
    elif not whole:
        [only] = wanted  # type: ignore[misc]
        flat, parts, _ = cat._list(only)
        combined = None  # type: ignore[assignment]  # listed after the partitions, below
    else:
        flat, parts, combined = cat._list(None)
    todo = []
    for run, p in parts.items():
        old = [k for k in p.events if _key_time_ns(k) < cutoff]
        if wanted is not None and run not in wanted and (p.snapshots or not old):
            continue
        if deletes:
            due = len(old) >= 2 or (old and not p.snapshots) or len(p.snapshots) > 1
        else:
            # the key times say, without a GET, which files the newest snapshot cannot have covered
            newest = max((_key_time_ns(k) for k in p.snapshots), default=-1)
            fresh = any(_key_time_ns(k) > newest for k in old)
            due = fresh and (not p.snapshots or cutoff - newest >= SNAPSHOT_EVERY_SECONDS * 1_000_000_000)
        if due:
            todo.append((len(old), run, old, p.snapshots))
    # the runs asked for first (a time box must not starve them), then the most files first
    todo.sort(key=lambda x: (wanted is not None and x[1] not in wanted, -x[0], x[1]))
    if max_partitions is not None:
        todo = todo[:max_partitions]

    tick = progress(len(todo)) if progress is not None else None

    def one(item: tuple[int, str, list[str], list[str]]) -> tuple[int, _Piece | None]:
        # the time box, checked as each partition starts: what has not started waits for the next call
        if deadline is not None and clock() > deadline:
            return 0, None
        _, run, old, snaps = item
        try:
            return _compact_part(cat, run, old, snaps) if deletes else _snapshot_part(cat, run, old, snaps)
        except _Vanished:
            return 0, None  # another compaction got there first
        finally:
            if tick is not None:
                tick(1)

    # Partitions are independent (each one's keys, merged file and snapshot are its own), so several
    # at once are as safe as one: the crash and race guarantees are per partition (docs/FORMAT.md).
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        got = list(pool.map(one, todo))
    except BaseException:
        # Ctrl-C (or a partition's error): the partitions not started are not started; those running
        # finish whole, so what is left is a catalog the next call goes on from
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    done += sum(n for n, _ in got)
    if not flat:  # while flat files remain no reader uses a combined snapshot
        if combined is None:
            combined = [o.key for o in cat.store.list(cat.root + COMBINED_DIR) if o.key.endswith(".parquet")]
        # the migrated runs' snapshots first: a compaction of the same run after them is newer
        pieces = [*migrated, *(p for _, p in got if p is not None)]
        # every run's partition refreshed into it by a compaction of every run, and by a migrating pass:
        # the runs an earlier pass migrated are then read from it too. The pass that ended the migration
        # refreshes every clean run whatever the time box (a GET each), so the first `ls` is one GET.
        listed = parts if runs is None or (moved and whole) else None
        _write_combined(cat, pieces, listed, combined, None if ended else deadline, deletes=deletes,
                        clock=clock)  # fmt: skip
    return done


@dataclass(frozen=True)
class Compacted:
    """What `compact_now` did."""

    passes: int  # compactions run: one, plus one per MIGRATE_FILES files of the flat layout
    partitions: int  # partitions compacted (one the next pass's migration adds to is counted again)
    files: int  # event files merged or migrated
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, "partitions": self.partitions, "files": self.files,
                "seconds": round(self.seconds, 3)}  # fmt: skip


def compact_now(
    cat: CatalogReader,
    *,
    runs: Iterable[str] | None = None,
    progress: Callable[[int], Callable[[int], None]] | None = None,
    workers: int = _COMPACTORS,
    clock: Callable[[], float] = time.time,
    deletes: bool = True,
) -> Compacted:
    """Every partition (or those of `runs`) compacted now, not time boxed (`ckptvault catalog compact`):
    passes of `compact` until the flat layout is gone, then one more for what the last migration moved.
    Each partition's compaction is whole or not at all (docs/FORMAT.md, "Compaction"), so an interrupted
    call leaves a catalog that reads the same, and the next call goes on from there. `deletes=False`
    (credentials without s3:DeleteObject): snapshots only, as `compact` without deletes."""
    t0 = time.monotonic()
    counted = [0]

    def counting(total: int) -> Callable[[int], None]:
        inner = progress(total) if progress is not None else None

        def tick(n: int) -> None:
            counted[0] += n
            if inner is not None:
                inner(n)

        return tick

    wanted = None if runs is None else sorted(set(runs))
    passes = files = 0
    while True:
        n = compact(cat, clock(), runs=wanted, progress=counting, workers=workers, deletes=deletes)
        files, passes = files + n, passes + 1
        # no flat file left: the partitions hold everything, and are compacted; or nothing moved (a flat
        # file written since by an older version, listed again: the next call takes it)
        if n == 0 or not cat._keys():
            break
    return Compacted(passes, counted[0], files, time.monotonic() - t0)


# a compacted partition's (run, snapshot key, snapshot bytes, what it covers): the bytes as stored, not
# decoded, until the combined snapshot is written from them
_Piece = tuple[str, str, bytes, RunCover]


def _piece(cat: CatalogReader, run: str, cols: dict[str, list[Any]], covers: Sequence[str]) -> _Piece:
    """`run`'s new snapshot of the fold `cols` covering `covers`, written."""
    key = cat._new_key(run, "snapshot")
    data = _snapshot_bytes(cols, covers)
    cat.store.put_bytes(key, data, if_none_match=True, content_type="application/vnd.apache.parquet")
    return run, key, data, RunCover(frozenset([key, *covers]), sum(len(r) for r in cols["_ids"][1]))


def _write_combined(
    cat: CatalogReader,
    pieces: list[_Piece],
    listed: dict[str, _Part] | None,
    keys: list[str],
    deadline: float | None,
    *,
    deletes: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """A new combined snapshot (docs/FORMAT.md, "Compaction"): the newest previous one's rows, those of
    the runs compacted now replaced by their snapshots (`pieces`, in memory); with `listed` (every
    run's partition, as this compaction listed it) also each run it does not cover whose partition is
    clean, from that one snapshot. Then the older ones are deleted, the unreadable set aside (not
    without `deletes`: then more than one is no reason to write another)."""
    several = len(keys) > 1 and deletes
    if listed is None and not pieces and not several:
        return  # nothing compacted, nothing to refresh, no older one to clear: no GET of it either
    try:
        prev = cat._combined(keys)
    except _Vanished:
        return  # a compaction racing this one has just written a newer one; these runs read as partitions
    fresh: dict[str, tuple[str, bytes]] = {}  # each run's snapshot as stored, decoded as it is written
    runs: dict[str, RunCover] = {}
    for run, key, data, cover in pieces:
        fresh[run], runs[run] = (key, data), cover
    refreshed = 0
    dropped = False
    if listed is not None:
        stale = [
            (r, p) for r, p in sorted(listed.items())
            if r not in runs and len(p.snapshots) == 1 and not (prev is not None and prev.covers(r, p))
        ]  # fmt: skip

        def refresh(item: tuple[str, _Part]) -> _Piece | None:
            r, p = item
            if deadline is not None and clock() > deadline:
                return None  # keeps its previous rows, if any, until a later compaction
            key = p.snapshots[0]
            try:
                data = cat._get(key) or b""
                cover = snapshot_cover(key, data)
            except _Vanished:
                return None
            except CatalogError as e:
                cat._skip(key, e)
                return None
            return (r, key, data, cover) if all(k in cover.covers for k in p.events) else None

        with ThreadPoolExecutor(max_workers=_COMPACTORS) as pool:
            for got in pool.map(refresh, stale):
                if got is not None:
                    fresh[got[0]], runs[got[0]] = (got[1], got[2]), got[3]
                    refreshed += 1
        dropped = prev is not None and any(r not in listed for r in prev.runs)
    keep = [r for r in prev.runs if r not in runs and (listed is None or r in listed)] if prev is not None else []
    if prev is not None and not several and not pieces and not refreshed and not dropped:
        return  # nothing new: the one there is still says all this one would
    if not runs and not keep:
        return
    if prev is not None:
        runs.update((r, prev.runs[r]) for r in keep)
    while True:
        try:
            data = combined_bytes(prev, keep, fresh, runs)
            break
        except UnreadableSnapshot as e:
            # a run's snapshot whose pages do not decode (its footer and covers did): the run keeps its
            # previous rows, if any, and reads from its partition until it is compacted again
            cat._skip(e.key, e.error)
            del fresh[e.run], runs[e.run]
            if prev is not None and e.run in prev.runs and (listed is None or e.run in listed):
                keep.append(e.run)
                runs[e.run] = prev.runs[e.run]
        except CatalogError as e:
            assert prev is not None  # only the previous one's rows can be out of order
            cat._skip(prev.key, e)  # its runs read from their partitions until each is compacted again
            for r in keep:
                del runs[r]
            prev, keep = None, []
        if not runs:
            return
    key = new_key(cat.root, "_combined")
    cat.store.put_bytes(key, data, if_none_match=True,
                        content_type="application/vnd.apache.parquet")  # fmt: skip
    if not deletes:
        return  # the newest wins for every reader; a compaction that may delete clears the older ones
    for k in keys:  # only after the new one is written: a crash leaves one to read
        if k in cat.unreadable:
            _set_aside(cat, k)
        else:
            cat.store.delete(k)


def _compact_part(cat: CatalogReader, run: str, old: list[str], snaps: list[str]) -> tuple[int, _Piece | None]:
    tables = cat._read_tables(old)
    t = _concat(tables)
    readable = [k for k in old if k not in cat.unreadable]
    merged = None
    if t is not None and len(readable) > 1:
        merged = cat._new_key(run, time_ns=max(_key_time_ns(o) for o in pc.unique(t[_ORIGIN]).to_pylist()))
        cat.store.put_bytes(
            merged, _to_bytes(_full(t)), if_none_match=True, content_type="application/vnd.apache.parquet"
        )
    piece = None
    if t is not None:
        piece = _piece(cat, run, _fold_table(t), [*readable, *([merged] if merged else [])])
    for k in old:
        if k in cat.unreadable:
            _set_aside(cat, k)
    if merged is not None:
        # one DeleteObjects for the merged sources, not one DELETE each: most of a day's compaction
        # was deletes (bench/README.md)
        failed = cat.store.delete_many([k for k in old if k not in cat.unreadable])
        if failed:
            k, why = next(iter(sorted(failed.items())))
            raise StoreError(f"catalog: could not delete {len(failed)} merged event files of run {run}, e.g. "
                             f"{k}: {why}. Nothing is lost or doubled: their events are also in {merged} and are "
                             f"read once; the next compaction deletes them. If it keeps failing, check that the "
                             f"worker may s3:DeleteObject under {cat.root}, or, for a role that may not delete "
                             f"(the Terraform ingest role), set [store] deletes = \"tier-only\"")  # fmt: skip
    for k in snaps:
        cat.store.delete(k)
    return (len(old) if merged is not None else 0), piece


def _snapshot_part(cat: CatalogReader, run: str, old: list[str], snaps: list[str]) -> tuple[int, _Piece | None]:
    """A compaction without deletes: a snapshot of every listed event file (the newest snapshot and the
    files since folded on top of it, where that is right), nothing merged or deleted.
    Its `covers` also names the snapshots listed beside it: each is the fold of events these files still
    hold (event content never leaves the log), so a combined snapshot built from this one covers the
    whole listing and a read of every run stays one GET (docs/FORMAT.md, "Compaction without deletes")."""
    # Most rounds: the newest snapshot and the few files since, folded on top of it (as a reader does).
    # Else, or when an event sorts before what the snapshot folded, every listed file, as a merge would.
    prev = cat._snapshot(snaps) if snaps else None
    cols = _on_top(cat, prev, [k for k in old if k not in prev.covers]) if prev is not None else None
    if cols is None:
        t = _concat(cat._read_tables(old))
        if t is None:
            return 0, None  # nothing readable: unreadable files wait for a compaction that may set them aside
        cols = _fold_table(t)
    return 0, _piece(cat, run, cols, [*(k for k in old if k not in cat.unreadable), *snaps])


def _on_top(cat: CatalogReader, prev: _Snapshot, new: list[str]) -> dict[str, list[Any]] | None:
    """The snapshot columns (`_fold_table`'s) of `prev` with the events of `new` folded on top, each
    save's from its row (docs/FORMAT.md, "Snapshots": what a reader does); None when an event sorts
    before what `prev` folded for its save (then only a fold of every event is right)."""
    covered = prev.ids()
    since = _concat(cat._read_tables(new))
    rows = [] if since is None else _dedup_sorted(r for r in _decode_rows(since, "") if (r[1], r[2]) not in covered)
    later: dict[tuple[int, int], list[tuple[Event, str, int]]] = {}
    for e, o, i in rows:
        k = (e.step, e.save)
        if k in prev.states and (e.at, o, i) <= prev.states[k][1]:
            return None
        later.setdefault(k, []).append((e, o, i))
    t = pq.ParquetFile(pa.BufferReader(prev.data)).read(columns=["step", "save", "_origins", "_rows"]).to_pydict()
    ids = {(s, v): (o, r) for s, v, o, r in zip(t["step"], t["save"], t["_origins"], t["_rows"], strict=True)}
    cols: dict[str, list[Any]] = {n: [] for n in (*_STATE_FIELDS, "_last_at", "_last_origin", "_last_row")}
    origins: list[list[str]] = []
    rows_: list[list[int]] = []
    for k in sorted(prev.states.keys() | later.keys()):
        state: CheckpointState | None = None
        last: tuple[float, str, int] | None = None
        if k in prev.states:
            state, last = prev.states[k]
        o_list, r_list = ids.get(k, ([], []))
        if k in later:
            evs = later[k]  # in (at, origin, row) order, all after `last`
            state = _fold_one([e for e, _, _ in evs], state)
            last = (evs[-1][0].at, evs[-1][1], evs[-1][2])
            o_list, r_list = [*o_list, *(o for _, o, _ in evs)], [*r_list, *(i for _, _, i in evs)]
        assert state is not None and last is not None
        for n in _STATE_FIELDS:
            cols[n].append(getattr(state, n))
        cols["_last_at"].append(last[0])
        cols["_last_origin"].append(last[1])
        cols["_last_row"].append(last[2])
        origins.append(o_list)
        rows_.append(r_list)
    cols["_ids"] = [origins, rows_]
    return cols


def _migrate(
    cat: CatalogReader,
    listed: list[str],
    parts: dict[str, _Part],
    deadline: float | None,
    clock: Callable[[], float],
    workers: int,
    progress: Callable[[int], Callable[[int], None]] | None = None,
) -> tuple[int, set[str], list[_Piece], list[str]]:
    """Move up to MIGRATE_FILES files of the flat layout (`listed`) into the partitions, run by run, each
    run's move with its snapshot (docs/FORMAT.md, "The flat layout before partitions"). Updates `parts`
    (as listed before) to what it left. Returns how many flat files it deleted, the runs it moved,
    their snapshots (for the combined one) and the flat files left. `progress` as `compact`'s, over the
    runs to move."""
    # Compat: reads the flat layout before partitions; may go: never, an older writer may still add to it
    flat = sorted(listed)[:MIGRATE_FILES]
    if not flat:
        return 0, set(), [], listed
    held = _FlatFiles(cat, flat)
    runs_of = held.runs_of
    first = runs_of[flat[0]]  # always moved, whatever the time box: each pass deletes a flat file
    tick = progress(len(held.files_of)) if progress is not None else None

    def one(r: str) -> tuple[str, str, _Piece] | None:
        try:
            if r not in first and deadline is not None and clock() > deadline:
                return None  # its flat files stay; the next pass moves it
            return (r, *_move_run(cat, r, held.events(r), parts.get(r, _Part([], []))))
        finally:
            held.done(r)
            if tick is not None:
                tick(1)

    def finished(futs: list[Future[tuple[str, str, _Piece] | None]]) -> list[tuple[str, str, _Piece]]:
        return [g for f in futs if f.done() and not f.cancelled() and f.exception() is None
                and (g := f.result()) is not None]  # fmt: skip

    def clear(got: list[tuple[str, str, _Piece]]) -> list[str]:
        # the flat files whose every run is in its partition now, with its snapshot
        moved = {r for r, _, _ in got}
        gone = [k for k in flat if runs_of[k] <= moved]
        for k in gone:
            if k in cat.unreadable:
                _set_aside(cat, k)
            else:
                cat.store.delete(k)
        return gone

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    futs = [pool.submit(one, r) for r in held.files_of]
    try:
        for f in futs:
            f.result()
    except BaseException:
        # Ctrl-C (or a run's error): the runs moving finish whole, with their snapshots, and the flat files
        # they emptied go, so a rerun goes on from there
        pool.shutdown(wait=True, cancel_futures=True)
        clear(finished(futs))
        raise
    pool.shutdown()
    got = finished(futs)
    for r, merged, piece in got:
        parts[r] = _Part([merged], [piece[1]])
    left = set(clear(got))
    return len(left), {r for r, _, _ in got}, [p for _, _, p in got], [k for k in listed if k not in left]


class _FlatFiles:
    """The flat files one migration moves, held as the store returned them (Parquet, compressed) and
    decoded run by run as each run moves: every file decoded at once, the 500 files of a pass at 1M
    events, was most of a migrating pass's memory (bench/README.md, issue [V]). A file's decoded
    events are kept only while another of its runs is still to move, its bytes until all have."""

    def __init__(self, cat: CatalogReader, flat: list[str]) -> None:
        self.runs_of: dict[str, set[str]] = {}  # each file's runs; none when unreadable or empty
        self.files_of: dict[str, list[str]] = {}  # each run's files, in the order of the oldest holding it
        self._raw: dict[str, bytes] = {}
        self._left: dict[str, int] = {}  # of each file's runs, those not moved (or passed over) yet
        self._decoded: dict[str, pa.Table] = {}
        self._lock = threading.Lock()

        def runs(k: str) -> tuple[bytes, list[str]] | None:
            data = cat._get(k) or b""
            try:  # decoded whole once, as before, so what is unreadable is the same
                t = _normalise(_parquet(data, k), k)
            except CatalogError as e:
                cat._skip(k, e)
                return None
            return data, (pc.unique(t["run"]).to_pylist() if t.num_rows else [])

        with ThreadPoolExecutor(max_workers=_FLAT_READERS) as pool:
            for k, got in zip(flat, pool.map(runs, flat), strict=True):
                self.runs_of[k] = set() if got is None else set(got[1])
                if got is None or not got[1]:
                    continue
                self._raw[k], self._left[k] = got[0], len(got[1])
                for r in got[1]:
                    self.files_of.setdefault(r, []).append(k)

    def events(self, run: str) -> list[pa.Table]:
        """`run`'s events of each flat file holding it, every column with identities, in file order."""
        out = []
        for k in self.files_of[run]:
            with self._lock:
                t = self._decoded.get(k)
                data = self._raw[k]
                shared = self._left[k] > 1
            if t is None:
                t = _full(_normalise(_parquet(data, k), k))
                if shared:
                    with self._lock:
                        t = self._decoded.setdefault(k, t)
            out.append(t.filter(pc.equal(t["run"], run)) if len(self.runs_of[k]) > 1 else t)
        return out

    def done(self, run: str) -> None:
        """`run` moved or passed over: what only it still needed is let go."""
        with self._lock:
            for k in self.files_of[run]:
                self._left[k] -= 1
                if not self._left[k]:
                    self._decoded.pop(k, None)
                    del self._raw[k]


def _move_run(cat: CatalogReader, run: str, flat: list[pa.Table], part: _Part) -> tuple[str, _Piece]:
    """One run's move out of the flat layout: its partition's listed event files and its events of the
    flat files (`flat`, in memory) as one merged event file, then its snapshot of their fold, and only
    then the partition's listed files and snapshots deleted (as `_compact_part`). Returns the merged
    file's key and the snapshot."""
    try:
        here = cat._read_tables(part.events)
        old, snaps = part.events, part.snapshots
    except _Vanished:
        # a compaction racing this one merged them: this run's snapshot covers the moved events only
        # (a reader folds the rest on top), and what that compaction wrote is left to it
        here, old, snaps = [], [], []
    t = _concat([*here, *flat])
    assert t is not None  # `flat` holds rows of this run
    t = _full(t)
    ns = max(_key_time_ns(o) for o in pc.unique(t[_ORIGIN]).to_pylist())
    merged = cat._new_key(run, time_ns=ns)
    cat.store.put_bytes(merged, _to_bytes(t), if_none_match=True, content_type="application/vnd.apache.parquet")
    readable = [k for k in old if k not in cat.unreadable]
    piece = _piece(cat, run, _fold_table(t), [*readable, merged])
    for k in old:
        if k in cat.unreadable:
            _set_aside(cat, k)
    if readable:
        failed = cat.store.delete_many(readable)
        if failed:
            k, why = next(iter(sorted(failed.items())))
            raise StoreError(f"catalog: could not delete {len(failed)} event files of run {run} merged with its "
                             f"flat-layout events, e.g. {k}: {why}. Nothing is lost or doubled: their events are "
                             f"also in {merged} and are read once; the next compaction deletes them. If it keeps "
                             f"failing, check that the worker may s3:DeleteObject under {cat.root}")  # fmt: skip
    for k in snaps:
        cat.store.delete(k)
    return merged, piece


def _set_aside(cat: CatalogReader, key: str) -> None:
    """Move an unreadable catalog file out of the log, never delete it: it may be the only copy of
    events someone can still recover by hand."""
    rel = key[len(cat.root) :]
    aside = cat.root + "unreadable/" + (rel[len("events/") :] if rel.startswith("events/") else rel)
    try:
        data = cat.store.get_bytes(key)
    except NotFoundError:
        return  # a compaction racing this one has set it aside already
    cat.store.put_bytes(aside, data, content_type="application/octet-stream")
    cat.store.delete(key)
    log.warning("catalog: set the unreadable catalog file %s aside as %s", key, aside)
