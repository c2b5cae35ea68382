"""The catalog's partitioned layout against an in-memory store: keys, snapshots, the events since,
the flat layout's migration. The same against a real server: tests/integration/test_catalog_s3.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptvault.catalog import Catalog, Event, encode_events, run_partition
from ckptvault.store import NotFoundError
from ckptvault.store.port import ObjectInfo
from tests.helpers import fold_python


class MemStore:
    """list/get/put/delete of a dict, and a record of what was read."""

    bucket = "mem"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.listed: list[str] = []
        self.got: list[str] = []

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.listed.append(prefix)
        for k in sorted(self.objects):
            if k.startswith(prefix):
                yield ObjectInfo(k, len(self.objects[k]), "", "STANDARD", 0.0)

    def get_bytes(self, key: str) -> bytes:
        self.got.append(key)
        if key not in self.objects:
            raise NotFoundError(key)
        return self.objects[key]

    def put_bytes(self, key: str, data: bytes, **kw: Any) -> None:
        self.objects[key] = data

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def delete_many(self, keys: Any) -> dict[str, str]:
        for k in keys:
            self.objects.pop(k, None)
        return {}


def _cat(store: MemStore) -> Catalog:
    return Catalog(store, "p")  # type: ignore[arg-type]


@given(st.text(min_size=1, max_size=12))
def test_a_run_name_is_one_safe_key_segment_and_reads_back(run: str) -> None:
    seg = run_partition(run)
    assert seg.startswith("run=") and seg.endswith("/") and "/" not in seg[:-1] and "=" not in seg[4:]
    assert unquote(seg[4:-1]) == run


def test_append_writes_one_file_per_run_in_its_partition() -> None:
    store = MemStore()
    key = _cat(store).append([Event("a/b", 1, "verified", 1.0), Event("c", 2, "verified", 2.0)])
    assert key is not None and key.startswith("p/_catalog/run=a%2Fb/events/")
    assert sorted(k.split("/events/")[0] for k in store.objects) == ["p/_catalog/run=a%2Fb", "p/_catalog/run=c"]


def _life(run: str, step: int, t: float) -> list[Event]:
    m = json.dumps({"metrics": {"loss": 1.0}, "fingerprint": "f"})
    return [
        Event(run, step, "discovered", t, format="hf"),
        Event(run, step, "uploaded", t + 1, bytes=10, files=2, storage_class="STANDARD", detail=m),
        Event(run, step, "verified", t + 2, detail=m),
        Event(run, step, "transitioned", t + 3, storage_class="GLACIER"),
        Event(run, step, "drilled", t + 4, ok=True),
    ]


def test_snapshot_then_events_since_then_an_old_event_fold_as_the_whole_log() -> None:
    store = MemStore()
    cat = _cat(store)
    everything: list[Event] = []
    for i in range(4):
        evs = _life("r", i, 100.0 * i)
        cat.append(evs)
        everything += evs
    assert cat.compact(time.time()) == 4
    assert any("/snapshot/" in k for k in store.objects)
    assert cat.current("r") == fold_python(everything)
    later = [Event("r", 1, "expired", 1000.0), Event("r", 9, "verified", 1001.0)]
    cat.append(later)  # continues the snapshot's rows
    everything += later
    assert cat.current("r") == fold_python(everything) == cat.current()
    old = [Event("r", 2, "superseded", 150.0, detail='{"reason": "resave"}')]  # sorts inside the snapshot
    cat.append(old)
    everything += old
    assert cat.current("r") == fold_python(everything)
    for k in [k for k in store.objects if "/snapshot/" in k]:  # snapshots are derived data
        del store.objects[k]
    assert cat.current("r") == fold_python(everything)


def test_an_unreadable_snapshot_is_skipped_and_the_events_fold_instead(caplog: pytest.LogCaptureFixture) -> None:
    store = MemStore()
    cat = _cat(store)
    cat.append(_life("r", 1, 0.0))
    cat.append(_life("r", 2, 10.0))
    cat.compact(time.time())
    [snap] = [k for k in store.objects if "/snapshot/" in k]
    store.objects[snap] = b"garbage"
    # one run's read: a read of every run takes r's rows from the combined snapshot and never GETs this
    with caplog.at_level("WARNING", logger="ckptvault.catalog"):
        assert cat.current("r") == fold_python(_life("r", 1, 0.0) + _life("r", 2, 10.0))
    assert snap in caplog.text


def test_one_runs_read_touches_only_its_partition_and_the_flat_directory() -> None:
    store = MemStore()
    cat = _cat(store)
    for r in ("a", "b", "c"):
        cat.append(_life(r, 1, 0.0))
        cat.append(_life(r, 2, 10.0))
    cat.compact(time.time())
    store.listed.clear()
    store.got.clear()
    assert [s.run for s in cat.current("b")] == ["b", "b"]
    assert sorted(store.listed) == ["p/_catalog/events/", "p/_catalog/run=b/"]
    assert store.got and all(k.startswith("p/_catalog/run=b/") for k in store.got)


def test_the_flat_layout_is_read_then_migrated_once() -> None:
    store = MemStore()
    evs = [*_life("a", 1, 0.0), *_life("b", 1, 5.0)]
    flat = []
    for i, e in enumerate(evs):  # what appends before partitions wrote
        key = f"p/_catalog/events/{time.time_ns() - 10**9 + i:020d}-{i:032x}.parquet"
        store.put_bytes(key, encode_events([e]))
        flat.append(key)
    cat = _cat(store)
    expected = fold_python(evs)
    assert cat.current() == expected
    saved = dict(store.objects)
    assert cat.compact(time.time()) == len(evs)
    assert not any(k.startswith("p/_catalog/events/") for k in store.objects)
    assert cat.current() == expected and cat.current("a") == expected[:1]
    for k in flat:  # as if the migration died before its deletes: each event still counts once
        store.objects[k] = saved[k]
    assert cat.current() == expected and [e.event for e in cat.events("a")] == [e.event for e in evs[:5]]


def _flat_fleet(store: MemStore, runs: int, steps: int) -> list[Event]:
    """A catalog written before partitions: every event of `runs` runs in the flat layout, a file each
    step (as ingests before partitions wrote them)."""
    evs = []
    base = time.time_ns() - 10**10
    for r in range(runs):
        for s in range(steps):
            life = _life(f"run-{r}", s, float(r * 100 + s * 10))
            evs += life
            store.put_bytes(
                f"p/_catalog/events/{base + r * steps + s:020d}-{r:016x}{s:016x}.parquet", encode_events(life)
            )
    return evs


def _reads_from_snapshots(cat: Catalog) -> bool:
    """Whether a read of every run is the combined snapshot alone: every partition compacted."""
    runs, parts, flat, comb = cat._partitions(None)
    return not flat and comb is not None and all(comb.covers(r, parts[r]) for r in runs)


def test_the_pass_that_migrates_a_run_snapshots_it_and_the_combined_follows() -> None:
    # an ingest compacts its own runs; after the flat layout is gone every run reads from a snapshot,
    # not only the ingest's (a fleet upgraded from the flat layout, issue [V])
    store = MemStore()
    evs = _flat_fleet(store, runs=12, steps=3)
    cat = _cat(store)
    cat.compact(time.time(), runs=["run-0"], max_seconds=60)
    assert not any(k.startswith("p/_catalog/events/") for k in store.objects)
    assert _reads_from_snapshots(cat)
    assert cat.current() == fold_python(evs)


def test_a_partition_without_a_snapshot_is_compacted_by_any_pass_that_lists_it() -> None:
    # a time-boxed pass that did not reach every run a fleet added at once leaves some without a
    # snapshot: the next pass of another run's ingest takes them (the migration snapshots what it moves)
    store = MemStore()
    cat = _cat(store)
    evs = [e for r in range(6) for s in range(2) for e in _life(f"run-{r}", s, float(r * 100 + s * 10))]
    cat.append(evs)
    cat.compact(time.time(), runs=["run-0"], max_partitions=2)
    assert not _reads_from_snapshots(cat)
    cat.compact(time.time(), runs=["run-0", "run-1"])
    assert _reads_from_snapshots(cat) and cat.current() == fold_python(evs)


def test_compact_now_passes_until_the_flat_layout_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptvault.catalog import compaction

    monkeypatch.setattr(compaction, "MIGRATE_FILES", 7)  # 24 flat files: four passes of migration
    store = MemStore()
    evs = _flat_fleet(store, runs=8, steps=3)
    cat = _cat(store)
    seen: list[int] = []
    done = cat.compact_now(progress=lambda n: seen.append(n) or (lambda k: None))
    # a partition the next pass's migration adds to is compacted again, and counted again
    assert done.passes == 4 and done.files >= 24 and done.partitions == sum(seen) >= 8
    assert _reads_from_snapshots(cat) and cat.current() == fold_python(evs)
    again = cat.compact_now()
    assert (again.passes, again.partitions, again.files) == (1, 0, 0)  # nothing left to do


def test_compact_now_interrupted_half_way_then_rerun_loses_and_doubles_nothing() -> None:
    store = MemStore()
    evs = _flat_fleet(store, runs=10, steps=2)
    cat = _cat(store)
    cat.append([Event("run-3", 7, "drilled", 9e9, ok=False)])  # a partition with events beside the flat ones
    want = fold_python([*evs, Event("run-3", 7, "drilled", 9e9, ok=False)])
    ticks = [0]

    def stop_after_four(total: int) -> Any:
        def tick(n: int) -> None:
            ticks[0] += n
            if ticks[0] == 4:
                raise KeyboardInterrupt  # Ctrl-C as the fourth partition finishes

        return tick

    with pytest.raises(KeyboardInterrupt):
        cat.compact_now(progress=stop_after_four, workers=1)
    assert cat.current() == want  # half-compacted reads the same
    cat.compact_now(runs=None)
    assert _reads_from_snapshots(cat) and cat.current() == want
    assert sorted(e.event for e in cat.events()) == sorted(e.event for e in [*evs, Event("run-3", 7, "drilled", 1.0)])


def test_the_pass_that_ends_the_migration_writes_a_combined_snapshot_of_every_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # two ingest passes migrate half the flat files each: the second's combined snapshot covers the
    # first's runs too, so `ls` after the upgrade is one read (bench/README.md, "The catalog", `--upgrade`)
    from ckptvault.catalog import compaction

    monkeypatch.setattr(compaction, "MIGRATE_FILES", 6)
    store = MemStore()
    evs = _flat_fleet(store, runs=12, steps=1)
    cat = _cat(store)
    cat.compact(time.time(), runs=["run-0"], max_seconds=60)
    assert any(k.startswith("p/_catalog/events/") for k in store.objects)  # half migrated
    cat.compact(time.time(), runs=["run-0"], max_seconds=60)
    assert _reads_from_snapshots(cat) and cat.current() == fold_python(evs)


def _moved_runs_are_snapshotted(store: MemStore, evs: list[Event]) -> set[str]:
    """Every run with a partition has one snapshot, covering every event file of its partition, whose
    rows are the fold of all its events (`evs`); returns those runs."""
    from ckptvault.catalog.snapshot import read_snapshot

    parts: dict[str, dict[str, list[str]]] = {}
    for k in store.objects:
        rel = k[len("p/_catalog/") :].split("/")
        if rel[0].startswith("run="):
            parts.setdefault(unquote(rel[0][4:]), {"events": [], "snapshot": []})[rel[1]].append(k)
    for run, p in parts.items():
        assert len(p["snapshot"]) == 1, run  # moved with its snapshot, never without
        snap = read_snapshot(p["snapshot"][0], store.objects[p["snapshot"][0]])
        assert set(p["events"]) <= snap.covers, run
        got = sorted((s for s, _ in snap.states.values()), key=lambda s: (s.step, s.save))
        assert got == fold_python(e for e in evs if e.run == run), run
    return set(parts)


def test_one_time_boxed_pass_snapshots_every_run_it_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    # the pass that moves a run's flat events writes its snapshot from them; the pass that moves the
    # last flat file writes the combined snapshot (issue [V], "migration completes the read path")
    from ckptvault.catalog import compaction

    monkeypatch.setattr(compaction, "MIGRATE_FILES", 9)  # 24 flat files of 3 steps per run: 3 runs a pass
    store = MemStore()
    evs = _flat_fleet(store, runs=8, steps=3)
    cat = _cat(store)
    cat.compact(time.time(), runs=["run-7"], max_seconds=60)
    assert _moved_runs_are_snapshotted(store, evs) == {"run-0", "run-1", "run-2"}
    assert not any(k.startswith("p/_catalog/_combined/") for k in store.objects)  # flat files left
    store.got.clear()
    cat.compact(time.time(), runs=["run-7"], max_seconds=60)
    # no second read: the runs it moved were read from the flat files alone, not from their partitions
    assert not [k for k in store.got if "/run=run-3/" in k or "/run=run-4/" in k]
    monkeypatch.setattr(compaction, "MIGRATE_FILES", 500)
    cat.compact(time.time(), runs=["run-7"], max_seconds=60)
    assert _moved_runs_are_snapshotted(store, evs) == {f"run-{i}" for i in range(8)}
    assert _reads_from_snapshots(cat) and cat.current() == fold_python(evs)


def test_a_clock_running_out_mid_migration_stops_between_runs_never_before_a_snapshot() -> None:
    from ckptvault.catalog import compaction

    store = MemStore()
    evs = _flat_fleet(store, runs=8, steps=3)
    late = [Event("run-2", 9, "discovered", 5.0, format="hf"), Event("run-6", 9, "discovered", 6.0, format="hf")]
    store.put_bytes(f"p/_catalog/events/{time.time_ns() - 10**9:020d}-{0:032x}.parquet", encode_events(late))
    evs += late
    calls = [0]

    def clock() -> float:  # the pass starts, then three runs' checks within the box, then it is over
        calls[0] += 1
        return 0.0 if calls[0] <= 4 else 1e6

    cat = _cat(store)
    compaction.compact(cat, time.time(), runs=["run-0"], max_seconds=60, workers=1, clock=clock)
    assert _moved_runs_are_snapshotted(store, evs) == {"run-0", "run-1", "run-2", "run-3"}
    left = sorted(k for k in store.objects if k.startswith("p/_catalog/events/"))
    assert len(left) == 4 * 3 + 1  # runs 4-7's files, and the one holding run-2 and run-6
    assert cat.current() == fold_python(evs)  # run-2's events there and in its partition count once
    compaction.compact(cat, time.time(), runs=["run-0"], max_seconds=60, workers=1)
    assert _moved_runs_are_snapshotted(store, evs) == {f"run-{i}" for i in range(8)}
    assert _reads_from_snapshots(cat) and cat.current() == fold_python(evs)
    assert len(cat.events("run-2")) == len([e for e in evs if e.run == "run-2"])  # moved twice, once each


def test_a_migration_gets_each_flat_file_once_and_holds_its_events_decoded_only_while_its_runs_move() -> None:
    # the migration keeps the flat files as stored and decodes them run by run: the 500 files of a pass
    # decoded at once were most of its memory at 1M events (bench/README.md, issue [V])
    from ckptvault.catalog import compaction
    from ckptvault.catalog.codec import _decode_rows

    store = MemStore()
    base = time.time_ns() - 10**10
    files = {"ab": [*_life("a", 1, 0.0), *_life("b", 1, 1.0)], "b": _life("b", 2, 2.0),
             "abc": [*_life("c", 1, 3.0), *_life("a", 2, 4.0), *_life("b", 3, 5.0)]}  # fmt: skip
    keys = {}
    for i, (name, evs) in enumerate(files.items()):
        keys[name] = f"p/_catalog/events/{base + i:020d}-{i:032x}.parquet"
        store.put_bytes(keys[name], encode_events(evs))
    bad = f"p/_catalog/events/{base + 9:020d}-{9:032x}.parquet"
    store.put_bytes(bad, b"not parquet")
    cat = _cat(store)
    name_of = {k: name for name, k in keys.items()}
    held = compaction._FlatFiles(cat, sorted([*keys.values(), bad]))
    assert sorted(store.got) == sorted([*keys.values(), bad])  # one GET each, none again below
    assert held.runs_of[bad] == set() and bad in cat.unreadable
    assert held.files_of == {"a": [keys["ab"], keys["abc"]], "b": [keys["ab"], keys["b"], keys["abc"]],
                             "c": [keys["abc"]]}  # fmt: skip
    for run in ("a", "b", "c"):
        got = [e for t in held.events(run) for e, _, _ in _decode_rows(t, "")]
        assert got == [e for k in held.files_of[run] for e in files[name_of[k]] if e.run == run], run
        held.done(run)
    assert not held._raw and not held._decoded  # every run moved: nothing held
    assert len(store.got) == 4
    compaction.compact(cat, time.time(), workers=4)
    assert cat.current() == fold_python([e for evs in files.values() for e in evs])


class _Racing(MemStore):
    """Runs `hook` once, just before the first snapshot of `run` is written."""

    def __init__(self, run: str) -> None:
        super().__init__()
        self.run, self.hook = run, None  # type: ignore[var-annotated]

    def put_bytes(self, key: str, data: bytes, **kw: Any) -> None:
        if self.hook is not None and f"/run={self.run}/snapshot/" in key:
            hook, self.hook = self.hook, None
            hook()
        super().put_bytes(key, data, **kw)


def test_a_writer_appending_while_a_run_is_moved_loses_nothing() -> None:
    store = _Racing("run-1")
    evs = _flat_fleet(store, runs=4, steps=2)
    new = Event("run-1", 5, "discovered", 9e9, format="hf")
    store.hook = lambda: _cat(store).append([new])  # type: ignore[assignment]
    cat = _cat(store)
    cat.compact(time.time(), runs=["run-0"])
    appended = [k for k in store.objects if "/run=run-1/events/" in k]
    assert len(appended) == 2  # the moved file and the appended one, neither covered nor deleted wrongly
    assert cat.current() == fold_python([*evs, new])
    cat.compact(time.time() + 1, runs=["run-1"])
    assert _reads_from_snapshots(cat) and cat.current() == fold_python([*evs, new])


def test_two_passes_migrating_at_once_read_each_event_once() -> None:
    store = _Racing("run-1")
    evs = _flat_fleet(store, runs=4, steps=2)
    store.hook = lambda: _cat(store).compact(time.time(), runs=["run-3"])  # type: ignore[assignment]
    cat = _cat(store)
    cat.compact(time.time(), runs=["run-0"])
    assert not any(k.startswith("p/_catalog/events/") for k in store.objects)
    assert cat.current() == fold_python(evs)
    assert sorted(e.event for e in cat.events()) == sorted(e.event for e in evs)  # none doubled
    cat.compact(time.time() + 1)
    assert _reads_from_snapshots(cat) and cat.current() == fold_python(evs)
