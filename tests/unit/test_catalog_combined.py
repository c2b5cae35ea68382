"""The combined snapshot (docs/FORMAT.md, "The combined snapshot") against an in-memory store: a read of
every run over it equals the read over the partitions, takes one GET where it covers every run, and
reads a run's partition wherever the run has anything it does not cover. The same on SeaweedFS, and
under SIGKILL: tests/integration/test_catalog_s3.py, test_compaction_sigkill.py."""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ckptvault.catalog import Catalog, Event, encode_events, run_partition
from ckptvault.catalog import compaction as compaction_module
from ckptvault.catalog.table_view import current_table
from tests.helpers import fold_python, render_json_table
from tests.unit.test_catalog_layout import MemStore, _life

RUNS = ("a", "b/c", "d")


def _cat(store: MemStore) -> Catalog:
    return Catalog(store, "p")  # type: ignore[arg-type]


def _combined(store: MemStore) -> list[str]:
    return sorted(k for k in store.objects if k.startswith("p/_catalog/_combined/"))


def _without_combined(store: MemStore) -> MemStore:
    other = MemStore()
    other.objects = {k: v for k, v in store.objects.items() if not k.startswith("p/_catalog/_combined/")}
    return other


def _built() -> tuple[MemStore, list[Event]]:
    store = MemStore()
    cat = _cat(store)
    everything: list[Event] = []
    for r in RUNS:
        for i in range(3):
            evs = _life(r, i, 100.0 * i)
            cat.append(evs)
            everything += evs
    cat.compact(time.time())
    return store, everything


def _same_as_partitions(store: MemStore, everything: list[Event]) -> None:
    """Every reader of all runs over the combined snapshot answers what the partitions alone answer."""
    plain = _cat(_without_combined(store))
    cat = _cat(store)
    assert cat.current() == plain.current() == fold_python(everything)
    t, u = current_table(cat), current_table(plain)
    assert t.equals(u) and render_json_table(t) == render_json_table(u)
    with_it, without = cat.stats().as_dict(), plain.stats().as_dict()
    assert with_it["files"].pop("combined") == len(_combined(store)) and without["files"].pop("combined") == 0
    assert with_it | {"catalog_bytes": 0} == without | {"catalog_bytes": 0}  # the object itself aside


def test_compaction_writes_one_combined_snapshot_and_a_read_of_every_run_is_one_get() -> None:
    store, everything = _built()
    [key] = _combined(store)
    _same_as_partitions(store, everything)
    store.got.clear()
    assert _cat(store).current() == fold_python(everything)
    assert store.got == [key]  # not one snapshot per run
    store.got.clear()
    assert current_table(_cat(store)).num_rows == 9 and store.got == [key]
    # a dataset reader of the partitions never sees it: it is outside every run=<run>/
    assert not any(k.startswith("p/_catalog/run=") for k in _combined(store))


def test_a_run_with_events_newer_than_the_combined_snapshot_shows_them() -> None:
    store, everything = _built()
    later = [Event("b/c", 1, "expired", 1000.0), Event("b/c", 7, "discovered", 1001.0)]
    _cat(store).append(later)
    everything += later
    _same_as_partitions(store, everything)
    store.got.clear()
    states = _cat(store).current()
    assert [s.state for s in states if s.run == "b/c"] == ["verified", "expired", "verified", "pending"]
    # the combined snapshot for a and d, b/c's partition (its snapshot and the new file) for b/c
    assert all(k.startswith(("p/_catalog/_combined/", "p/_catalog/run=b%2Fc/")) for k in store.got)


def test_a_run_compacted_after_the_combined_snapshot_shows_its_new_state(monkeypatch: pytest.MonkeyPatch) -> None:
    store, everything = _built()
    [key] = _combined(store)
    later = [Event("a", 0, "superseded", 2000.0, detail='{"reason": "resave"}'), Event("a", 5, "verified", 2001.0)]
    _cat(store).append(later)
    everything += later
    # a compaction that stopped after a's partition, before its combined snapshot
    monkeypatch.setattr(compaction_module, "_write_combined", lambda *a, **kw: None)
    assert _cat(store).compact(time.time(), runs=["a"]) == 2
    assert _combined(store) == [key]
    _same_as_partitions(store, everything)
    assert [s.superseded for s in _cat(store).current() if s.run == "a"] == [True, False, False, False]


def test_the_next_compaction_reads_only_what_changed() -> None:
    store, everything = _built()
    [old] = _combined(store)
    later = [Event("d", 1, "drilled", 3000.0, ok=False), Event("b/c", 2, "expired", 3001.0)]
    _cat(store).append(later)  # the last run and one between the others: its rows are spliced in
    everything += later
    store.got.clear()
    assert _cat(store).compact(time.time()) == 4
    # d's and b/c's partitions and the previous combined snapshot; not a's
    assert store.got and all(k.startswith(("p/_catalog/run=d/", "p/_catalog/run=b%2Fc/", old)) for k in store.got)
    [new] = _combined(store)
    assert new > old
    _same_as_partitions(store, everything)
    store.got.clear()
    assert _cat(store).current() == fold_python(everything) and store.got == [new]
    # nothing to compact, every run covered: no new combined snapshot
    assert _cat(store).compact(time.time()) == 0 and _combined(store) == [new]


def test_a_garbage_combined_snapshot_is_named_the_listing_is_right_and_compaction_sets_it_aside(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, everything = _built()
    bad = f"p/_catalog/_combined/{time.time_ns():020d}-{'f' * 32}.parquet"  # newer than the good one
    store.objects[bad] = b"garbage"
    cat = _cat(store)
    with caplog.at_level("WARNING", logger="ckptvault.catalog"):
        assert cat.current() == fold_python(everything)
    assert bad in caplog.text and bad in cat.unreadable
    assert None in cat.unreadable_by_run()  # alerted as all runs'
    store.objects[bad] = encode_events(everything[:1])  # Parquet, but an event file: not combined either
    other = _cat(store)
    assert render_json_table(current_table(other)) == render_json_table(current_table(_cat(_without_combined(store))))
    assert bad in other.unreadable
    other.compact(time.time())  # sets it aside once a new one is written, and the older one goes
    assert bad not in store.objects and f"p/_catalog/unreadable/_combined/{bad.rsplit('/', 1)[1]}" in store.objects
    assert len(_combined(store)) == 1
    _same_as_partitions(store, everything)


def test_a_bucket_without_one_reads_as_before_and_the_first_full_compaction_writes_it() -> None:
    store, everything = _built()
    for k in _combined(store):
        del store.objects[k]  # a bucket compacted by a version before combined snapshots
    store.got.clear()
    assert _cat(store).current() == fold_python(everything)
    assert sorted(store.got) == sorted(k for k in store.objects if "/snapshot/" in k)  # one per run, as before
    assert _cat(store).compact(time.time()) == 0  # nothing to merge; its clean snapshots are read once
    [key] = _combined(store)
    store.got.clear()
    assert _cat(store).current() == fold_python(everything) and store.got == [key]


def test_with_flat_layout_files_left_it_is_neither_used_nor_written(monkeypatch: pytest.MonkeyPatch) -> None:
    store, everything = _built()
    [key] = _combined(store)
    flat = [Event("a", 9, "verified", 5000.0)]
    store.put_bytes(f"p/_catalog/events/{time.time_ns():020d}-{'0' * 32}.parquet", encode_events(flat))
    everything += flat
    store.got.clear()
    assert _cat(store).current() == fold_python(everything)
    assert key not in store.got
    with monkeypatch.context() as m:
        m.setattr(compaction_module, "MIGRATE_FILES", 0)  # a migration that has not reached it yet
        _cat(store).compact(time.time())
    assert _combined(store) == [key]
    _cat(store).compact(time.time())  # migrated: the combined snapshot follows
    [new] = _combined(store)
    assert new != key
    _same_as_partitions(store, everything)


def test_rows_are_the_per_run_state_columns_with_covers_per_run() -> None:
    store, _ = _built()
    [key] = _combined(store)
    t = pq.read_table(pa.BufferReader(store.objects[key]))
    assert "_origins" not in t.column_names and t.column_names[0] == "run"
    assert sorted(set(t["run"].to_pylist())) == sorted(RUNS)
    c = _cat(store)._combined([key])
    assert c is not None and sorted(c.runs) == sorted(RUNS)
    for r in RUNS:
        part = [k for k in store.objects if k.startswith(f"p/_catalog/{run_partition(r)}")]
        # its snapshot and merged file, and the three appended files merged into it (since deleted)
        assert set(part) < c.runs[r].covers and len(c.runs[r].covers) == len(part) + 3 == 5
        assert c.runs[r].events == 15


def test_a_rewrite_reads_the_previous_one_a_row_group_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptvault.catalog import combined

    monkeypatch.setattr(combined, "_BATCH_ROWS", 2)  # row groups smaller than a run: runs span them
    store, everything = _built()
    [key] = _combined(store)
    assert pq.ParquetFile(pa.BufferReader(store.objects[key])).num_row_groups > 3
    later = [Event("b/c", 0, "expired", 4000.0)]
    _cat(store).append(later)
    everything += later
    _cat(store).compact(time.time(), runs=["b/c"])
    [new] = _combined(store)
    assert new != key
    _same_as_partitions(store, everything)
    store.got.clear()
    assert _cat(store).current() == fold_python(everything) and store.got == [new]


def test_a_previous_one_out_of_run_order_is_named_and_not_copied(caplog: pytest.LogCaptureFixture) -> None:
    store, everything = _built()
    [key] = _combined(store)
    t = pq.read_table(pa.BufferReader(store.objects[key]))
    sink = pa.BufferOutputStream()
    pq.write_table(t.take(pa.array(list(range(t.num_rows))[::-1])), sink)  # same metadata, rows reversed
    store.objects[key] = sink.getvalue().to_pybytes()
    later = [Event("d", 2, "expired", 4000.0)]
    _cat(store).append(later)
    everything += later
    with caplog.at_level("WARNING", logger="ckptvault.catalog"):
        _cat(store).compact(time.time(), runs=["d"])
    assert key in caplog.text and "not in run order" in caplog.text
    [new] = _combined(store)
    c = _cat(store)._combined([new])
    assert c is not None and sorted(c.runs) == ["d"]  # the others read from their partitions
    _same_as_partitions(store, everything)


def test_a_damaged_data_page_is_named_skipped_and_set_aside_like_a_garbage_footer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, everything = _built()
    [key] = _combined(store)
    data = bytearray(store.objects[key])
    col = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata.row_group(0).column(0)
    end = (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size
    data[end - 4 : end] = b"\xff\xff\xff\xff"  # the footer still reads: only the page behind it is bad
    store.objects[key] = bytes(data)
    with caplog.at_level("WARNING", logger="ckptvault.catalog"):
        assert _cat(store).current() == fold_python(everything)
    assert key in caplog.text
    cat = _cat(store)
    cat.append(_life("a", 7, 700.0))
    cat.compact(time.time())  # the rewrite must not decode it either: set aside, a new one written
    assert key not in store.objects and f"p/_catalog/unreadable/_combined/{key.rsplit('/', 1)[1]}" in store.objects
    assert len(_combined(store)) == 1
    _same_as_partitions(store, [*everything, *_life("a", 7, 700.0)])


def test_a_reader_decodes_only_the_columns_it_reads_and_a_compaction_every_column() -> None:
    """A damaged page in `metrics` (read by neither `ls --json` nor the metrics): both take every run
    from the combined snapshot; `current()` (every state column) and the compaction's rewrite find it
    and read the partitions instead; one Catalog reading first a few columns, then all, finds it too."""
    from ckptvault.catalog.summary import COLUMNS

    store, everything = _built()
    [key] = _combined(store)
    data = bytearray(store.objects[key])
    meta = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata
    i = [meta.schema.column(j).name for j in range(meta.num_columns)].index("metrics")
    col = meta.row_group(0).column(i)
    end = (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size
    data[end - 4 : end] = b"\xff\xff\xff\xff"
    store.objects[key] = bytes(data)
    plain = _cat(_without_combined(store))
    for columns in (COLUMNS, None):
        cat = _cat(store)
        store.got.clear()
        t = current_table(cat, columns=COLUMNS) if columns else current_table(cat)
        assert not cat.unreadable and store.got == [key]  # one GET, none of the partitions' snapshots
        assert t.equals(current_table(plain, columns=COLUMNS) if columns else current_table(plain))
        assert "metrics" not in t.column_names
        assert cat.current() == fold_python(everything) and key in cat.unreadable  # the same Catalog, all
    cat = _cat(store)
    cat.append(_life("a", 7, 700.0))
    cat.compact(time.time())
    assert key not in store.objects and len(_combined(store)) == 1
    _same_as_partitions(store, [*everything, *_life("a", 7, 700.0)])


def test_a_compaction_with_nothing_to_merge_does_not_fetch_the_combined_snapshot() -> None:
    store, _ = _built()
    store.got.clear()
    assert _cat(store).compact(time.time(), runs=["a"]) == 0  # an ingest's compaction of a clean run
    assert not [k for k in store.got if "/_combined/" in k], store.got


def test_setting_aside_a_file_another_compaction_just_moved_is_not_an_error() -> None:
    store, _ = _built()
    gone = "p/_catalog/_combined/00000000000000000001-" + "e" * 32 + ".parquet"
    compaction_module._set_aside(_cat(store), gone)  # NotFoundError before: the racing compaction's crash
    assert not any(k.endswith(gone.rsplit("/", 1)[1]) for k in store.objects)


def test_the_combined_rows_and_covers_are_those_of_the_runs_snapshots_decoded_one_at_a_time() -> None:
    # the combined snapshot is written from the runs' snapshots as stored, each decoded as its rows are
    # written (all decoded at once were the peak of the pass ending a migration: bench/README.md), and a
    # compacted run's cover is taken from its fold, not from decoding what was just written
    from ckptvault.catalog.combined import snapshot_cover, snapshot_rows

    store, _ = _built()
    [key] = _combined(store)
    c = _cat(store)._combined([key])
    assert c is not None
    t = pq.read_table(pa.BufferReader(store.objects[key]))
    for r in sorted(RUNS):
        [snap] = [k for k in store.objects if k.startswith(f"p/_catalog/{run_partition(r)}snapshot/")]
        assert snapshot_cover(snap, store.objects[snap]) == c.runs[r]
        mine = t.filter(pa.compute.equal(t["run"], r)).replace_schema_metadata(None)
        assert mine.equals(snapshot_rows(snap, store.objects[snap]))


def test_a_snapshot_whose_pages_do_not_decode_is_named_and_left_out_of_the_combined_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # its footer and covers read (the refresh takes it), a state column's page does not: found as the
    # combined snapshot is written, that run is left out of it and read from its partition
    store, everything = _built()
    for k in _combined(store):
        del store.objects[k]  # every clean run is refreshed into the next one from its snapshot
    [snap] = [k for k in store.objects if k.startswith(f"p/_catalog/{run_partition('d')}snapshot/")]
    data = bytearray(store.objects[snap])
    meta = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata
    col = meta.row_group(0).column(meta.schema.names.index("metrics"))
    end = (col.dictionary_page_offset or col.data_page_offset) + col.total_compressed_size
    data[end - 4 : end] = b"\xff\xff\xff\xff"
    store.objects[snap] = bytes(data)
    cat = _cat(store)
    with caplog.at_level("WARNING", logger="ckptvault.catalog"):
        cat.compact(time.time())
    assert snap in caplog.text and snap in cat.unreadable
    [key] = _combined(store)
    c = cat._combined([key])
    assert c is not None and sorted(c.runs) == ["a", "b/c"]
    assert _cat(store).current() == fold_python(everything)
