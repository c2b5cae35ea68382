"""The catalog as its readers see it (`CatalogReader`): `events` and `current` read a partition's newest
snapshot and the event files since, fetched concurrently, each event once by its identity (eventlog.py
says why that makes a compaction read as atomic); what could not be read is named, not fatal.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ckptvault.catalog.codec import _FOLD_COLUMNS, _concat, _decode_rows, _dedup_sorted, _normalise, _parquet
from ckptvault.catalog.combined import Combined, read_combined
from ckptvault.catalog.fold import _fold_one, _fold_table, _states
from ckptvault.catalog.layout import CATALOG_DIR, _Part, _Vanished, classify, new_key, run_partition
from ckptvault.catalog.model import CatalogError, CheckpointState, Event
from ckptvault.catalog.snapshot import _Snapshot, read_snapshot
from ckptvault.store.errors import NotFoundError
from ckptvault.store.port import ObjectStore

_READERS = 8
_gc_lock = threading.Lock()
_gc_state = {"inside": 0, "was_enabled": True}


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off while any thread is inside (it is process-wide), back as it was after."""
    with _gc_lock:
        if _gc_state["inside"] == 0:
            _gc_state["was_enabled"] = gc.isenabled()
            gc.disable()
        _gc_state["inside"] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_state["inside"] -= 1
            if _gc_state["inside"] == 0 and _gc_state["was_enabled"]:
                gc.enable()


log = logging.getLogger("ckptvault.catalog")


@dataclass
class _Once:
    """What `Catalog.read_once` has read: listings by run (None: every run) and objects' bytes by key."""

    listings: dict[str | None, tuple[list[str], dict[str, _Part], list[str]]] = field(default_factory=dict)
    objects: dict[str, bytes | None] = field(default_factory=dict)


class CatalogReader:
    """What the catalog's writes and whole-catalog passes build on: where its objects are, and how they
    are listed and read. `Catalog` (eventlog.py) is this with `append`, compaction, stats and the
    rebuild from manifests; those passes take a CatalogReader, so that they import this module and not
    the Catalog that calls them."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.root = f"{self.prefix}/_catalog/" if self.prefix else "_catalog/"
        self.dir = f"{self.prefix}/{CATALOG_DIR}" if self.prefix else CATALOG_DIR  # the flat layout
        self.unreadable: dict[str, str] = {}  # catalog files this catalog could not read, and why
        self._combined_seen: Combined | None = None
        self._once: _Once | None = None  # inside `read_once`

    @contextmanager
    def read_once(self) -> Iterator[None]:
        """Within it, each listing and each object is read from the store once: a restore reads the
        run's current state and then its events, which list the same partition and fetch the same
        event files (docs/performance.md, "Where a command's time goes"). A catalog object is never
        rewritten under its key; a listing holds as first read until an object it named is gone (a
        compaction replaced it), when the retry lists again."""
        self._once = _Once()
        try:
            yield
        finally:
            self._once = None

    def _part_dir(self, run: str) -> str:
        return self.root + run_partition(run)

    def _new_key(self, run: str, kind: str = "events", time_ns: int | None = None) -> str:
        return new_key(self._part_dir(run), kind, time_ns)

    def _keys(self) -> list[str]:
        """The flat layout's event files."""
        return [o.key for o in self.store.list(self.dir) if o.key.endswith(".parquet")]

    def _listing(self, run: str | None) -> tuple[list[str], dict[str, _Part]]:
        """(flat files, partitions by run): one LIST of `_catalog/` for every run, or of the run's
        partition and of the flat directory for one."""
        flat, parts, _ = self._list(run)
        return flat, parts

    def _list(self, run: str | None) -> tuple[list[str], dict[str, _Part], list[str]]:
        """`_listing`, and the combined snapshots (listed only with every run)."""
        once = self._once
        if once is not None and run in once.listings:
            return once.listings[run]
        parts: dict[str, _Part] = {}
        flat: list[str] = []
        combined: list[str] = []
        prefixes = [self.root] if run is None else [self.dir, self._part_dir(run)]
        for prefix in prefixes:
            for o in self.store.list(prefix):
                kind, r = classify(self.root, o.key)
                if kind == "flat":
                    flat.append(o.key)
                elif kind == "combined":
                    combined.append(o.key)
                elif r is not None:
                    p = parts.setdefault(r, _Part([], []))
                    (p.events if kind == "events" else p.snapshots).append(o.key)
        if once is not None:
            once.listings[run] = (flat, parts, combined)
        return flat, parts, combined

    def _combined(self, keys: Sequence[str], columns: Collection[str] | None = None) -> Combined | None:
        """The newest readable combined snapshot of these (kept: a key is never rewritten), readable
        in `columns` (None: every column, as a compaction's rewrite reads it)."""
        for key in sorted(keys, reverse=True):
            try:
                seen = self._combined_seen
                if seen is not None and seen.key == key:
                    seen.check(columns)  # the columns a reader before this one did not read
                    return seen
                self._combined_seen = read_combined(key, self._get(key) or b"", columns)
                return self._combined_seen
            except CatalogError as e:
                self._skip(key, e)
        return None

    def _get(self, key: str) -> bytes | None:
        once = self._once
        if once is not None and key in once.objects:
            return once.objects[key]
        try:
            data = self.store.get_bytes(key)
        except NotFoundError:
            raise _Vanished(key) from None
        if once is not None:
            once.objects[key] = data
        return data

    def _skip(self, key: str, e: CatalogError) -> None:
        # One unreadable object (bit rot, a partial write, a stray file) must not stop every command,
        # a restore included, whose manifests are intact: name it and read the rest.
        if key not in self.unreadable:
            log.warning("catalog: skipping an unreadable catalog file: %s", e)
        self.unreadable[key] = str(e)

    def _read_tables(self, keys: Sequence[str], columns: Sequence[str] | None = None) -> list[pa.Table]:
        return [t for t in self._read_by_key(keys, columns) if t is not None]

    def _read_by_key(self, keys: Sequence[str], columns: Sequence[str] | None = None) -> list[pa.Table | None]:
        """Each key's table, in the order of `keys` (None: unreadable, skipped)."""

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
            return list(pool.map(read, keys)) if len(keys) > 1 else [read(k) for k in keys]

    def _retrying(self, fn: Any) -> Any:
        for _ in range(5):
            try:
                return fn()
            except _Vanished:
                if self._once is not None:  # what was listed is gone: list again
                    self._once.listings.clear()
                continue  # a compaction deleted what we listed, after writing what replaces it
        return fn()

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
            runs, parts, flat_by_run, comb = self._partitions(run)
            # a run the combined snapshot covers is its rows (one GET for all of them); the rest as
            # each partition reads (docs/FORMAT.md, "The combined snapshot")
            use = [r for r in runs if comb.covers(r, parts[r])] if comb is not None else []
            whole = comb.states(use) if comb is not None and use else {}

            def one(r: str) -> list[CheckpointState]:
                if r in whole:
                    return whole[r]
                return self._current_part(r, parts.get(r, _Part([], [])), flat_by_run.get(r))

            with ThreadPoolExecutor(max_workers=_READERS) as pool:
                return [s for states in pool.map(one, runs) for s in states]

        # Every state is a long-lived object: the cyclic GC would walk all of them again and again as
        # they are built (none is garbage), ~a third of the read of 200,000. Paused for the read only.
        with gc_paused():
            got: list[CheckpointState] = self._retrying(read)
        return got

    def _partitions(
        self, run: str | None, columns: Collection[str] | None = None
    ) -> tuple[list[str], dict[str, _Part], dict[str, pa.Table], Combined | None]:
        """What a read of `run` (or of every run) covers: the runs in order, each run's partition,
        each run's rows still in the flat layout of older versions, and (every run, no flat layout)
        the newest combined snapshot readable in `columns` (None: every column)."""
        flat, parts, combined = self._list(run)
        comb = self._combined(combined, columns) if run is None and not flat and combined else None
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
        return runs, parts, flat_by_run, comb

    def _snapshot(self, keys: Sequence[str]) -> _Snapshot | None:
        """The newest readable snapshot of these."""
        for key in sorted(keys, reverse=True):
            try:
                return read_snapshot(key, self._get(key) or b"")
            except CatalogError as e:
                self._skip(key, e)
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

    def unreadable_of(self, run: str) -> dict[str, str]:
        """The objects this catalog could not read that may have held events of `run`: its partition's
        and the flat layout's (which holds every run's)."""
        mine = (self._part_dir(run), self.dir)
        return {k: why for k, why in self.unreadable.items() if k.startswith(mine)}

    def unreadable_by_run(self) -> dict[str | None, dict[str, str]]:
        """What `unreadable` holds, by the run whose partition it is in (None: the flat layout or a
        combined snapshot, every run's)."""
        out: dict[str | None, dict[str, str]] = {}
        for k, why in self.unreadable.items():
            out.setdefault(classify(self.root, k)[1], {})[k] = why
        return out
