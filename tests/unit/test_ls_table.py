"""`ls --json` from the Arrow tables (ckptvault/catalog/table_view.py) prints byte for byte what the
`CheckpointState` path prints, with every filter: snapshots, events since them, no snapshot, the flat layout."""

from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptvault.catalog import EVENT_KINDS, LIFECYCLE_STATES, Catalog, Event, encode_events
from ckptvault.catalog.listing import render_json, select
from ckptvault.catalog.table_view import current_table, select_table
from tests.helpers import render_json_table
from tests.unit.test_catalog_layout import MemStore

_RUNS = ["a", 'team/r\u00e9"\\x', "b\n\u2603", "z"]


def _old_path(cat: Catalog, run: str | None, state: str | None, since: float | None, limit: int | None) -> str:
    states = cat.current(run)
    if state:
        states = [s for s in states if s.state == state]
    return render_json(select(states, since, limit))


def _assert_same(cat: Catalog) -> None:
    t = current_table(cat)
    whens = sorted({x for c in ("created_at", "uploaded_at", "updated_at") for x in t[c].to_pylist() if x})
    sinces = [None, *whens[:: max(1, len(whens) // 3)]]
    for run in [None, "a", _RUNS[1], "missing"]:
        table = current_table(cat, run)
        for state in [None, *LIFECYCLE_STATES]:
            for since in sinces:
                for limit in (None, 1, 3):
                    want = _old_path(cat, run, state, since, limit)
                    got = render_json_table(select_table(table, state, since, limit))
                    assert got == want, (run, state, since, limit)


def _every_state(run: str, t: float) -> list[Event]:
    m = '{"metrics": {"loss": 0.5, "acc": 1}, "fingerprint": "f\u00e9"}'
    return [
        Event(run, 1, "discovered", t, format="hf", created_at=t - 5.5),  # pending
        Event(run, 2, "invalid", t + 1, format="torch", detail='{"reasons": ["x"]}'),
        Event(run, 3, "invalid", t + 2),
        Event(run, 3, "accepted", t + 3),
        Event(run, 4, "uploaded", t + 4, bytes=100, stored_bytes=60, files=3, storage_class="STANDARD", detail=m),
        Event(run, 4, "verified", t + 5, detail=m),  # verified, compressed, no created_at
        Event(run, 5, "verified", t + 6, bytes=7, created_at=t - 1e6, detail='{"rpo_seconds": 3.1415}'),
        Event(run, 5, "drilled", t + 7.999, ok=False),  # suspect
        Event(run, 6, "verified", t + 8, bytes=9, storage_class="GLACIER"),
        Event(run, 6, "superseded", t + 9, detail='{"reason": "a restart \u00e9 \\"before\\""}'),
        Event(run, 6, "verified", t + 8, save=2, bytes=9),
        Event(run, 6, "drilled", t + 10, save=2, ok=True),
        Event(run, 7, "verified", t + 11, bytes=1),
        Event(run, 7, "expired", t + 12),
        Event(run, 8, "superseded", t + 13),  # superseded but never verified: pending
        Event(run, 9, "verified", t + 14, bytes=3, created_at=t + 14),  # ties in `when` across runs
        Event(run, 10, "verified", t + 15, bytes=2**40, detail='{"parts": {"model": 3, "optimizer": 1099511627773}}'),
        # what wrote it, with a key and a version JSON must escape
        Event(
            run,
            11,
            "verified",
            t + 16,
            bytes=5,
            detail=json.dumps({"written_by": {"transformers": "4.57.1", 'x"é': "1\\"}}),
        ),
    ]


def test_every_state_snapshots_events_since_and_the_flat_layout_print_the_same() -> None:
    store = MemStore()
    cat = Catalog(store, "p")  # type: ignore[arg-type]
    for i, run in enumerate(_RUNS):
        cat.append(_every_state(run, 1.7e9 + 100 * i))
    cat.compact(time.time() + 10)  # a snapshot per run, nothing since
    _assert_same(cat)
    cat.append([Event("a", 4, "drilled", 1.8e9, ok=False), Event("a", 10, "discovered", 1.8e9)])  # since
    cat.append([Event("z", 1, "verified", 1.0)])  # older than the snapshot: folded again from all
    cat.append([Event("new", 1, "verified", 1.9e9, bytes=4)])  # a run with no snapshot
    store.objects["p/_catalog/events/00000000000000000001-x.parquet"] = encode_events(
        [Event("b\n\u2603", 99, "uploaded", 5.0), Event("flat", 1, "verified", 6.0)]
    )  # the layout before partitions
    store.objects["p/_catalog/run=a/snapshot/99999999999999999999-bad.parquet"] = b"garbage"  # skipped
    _assert_same(cat)
    assert render_json_table(current_table(Catalog(MemStore(), "p"))) == "[]"  # type: ignore[arg-type]


def test_snapshots_written_before_the_written_by_column_list_it_as_empty() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = MemStore()
    cat = Catalog(store, "p")  # type: ignore[arg-type]
    for i, run in enumerate(_RUNS):
        cat.append(_every_state(run, 1.7e9 + 100 * i))
    cat.compact(time.time() + 10)
    said = [w for w in current_table(cat)["written_by"].to_pylist() if w != "{}"]
    assert len(said) == len(_RUNS) and all(json.loads(w)["transformers"] == "4.57.1" for w in said)  # as written
    old = [k for k in store.objects if "/snapshot/" in k or "/_combined/" in k]
    assert any("/_combined/" in k for k in old) and any("/snapshot/" in k for k in old)
    for key in old:
        t = pq.read_table(pa.BufferReader(store.objects[key]))
        sink = pa.BufferOutputStream()
        pq.write_table(t.drop_columns(["written_by"]), sink)
        store.objects[key] = sink.getvalue().to_pybytes()
    cat = Catalog(store, "p")  # type: ignore[arg-type]  # a reader that has not read them yet
    assert set(current_table(cat)["written_by"].to_pylist()) == {"{}"}
    for states in (cat.current(), cat.current("a")):  # the combined snapshot, then a run's own
        assert states and all(s.written_by == {} for s in states)
    _assert_same(cat)


def test_snapshots_written_before_the_model_and_optimizer_columns_list_them_as_null() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    store = MemStore()
    cat = Catalog(store, "p")  # type: ignore[arg-type]
    for i, run in enumerate(_RUNS):
        cat.append(_every_state(run, 1.7e9 + 100 * i))
    cat.compact(time.time() + 10)
    assert current_table(cat)["model_bytes"].drop_null().to_pylist() == [3] * len(_RUNS)  # as written
    # every snapshot and the combined one as a version before the columns wrote them
    old = [k for k in store.objects if "/snapshot/" in k or "/_combined/" in k]
    assert any("/_combined/" in k for k in old) and any("/snapshot/" in k for k in old)
    for key in old:
        t = pq.read_table(pa.BufferReader(store.objects[key]))
        sink = pa.BufferOutputStream()
        pq.write_table(t.drop_columns(["model_bytes", "optimizer_bytes"]), sink)
        store.objects[key] = sink.getvalue().to_pybytes()
    cat = Catalog(store, "p")  # type: ignore[arg-type]  # a reader that has not read them yet
    t = current_table(cat)
    assert t["model_bytes"].null_count == t["optimizer_bytes"].null_count == t.num_rows > 0
    for states in (cat.current(), cat.current("a")):  # the combined snapshot, then a run's own
        assert states and all(s.model_bytes is None and s.optimizer_bytes is None for s in states)
    assert current_table(cat, "a")["model_bytes"].null_count == len(cat.current("a"))
    _assert_same(cat)


_EVENT = st.builds(
    Event,
    run=st.sampled_from(["r", "s\u00e9"]),
    step=st.integers(0, 3),
    event=st.sampled_from(EVENT_KINDS),
    at=st.floats(0, 4e9),
    bytes=st.sampled_from([0, 5, 2**40]),
    stored_bytes=st.sampled_from([0, 3]),
    storage_class=st.sampled_from(["", "STANDARD", "GLACIER"]),
    created_at=st.none() | st.floats(0, 4e9),
    ok=st.none() | st.booleans(),
    detail=st.sampled_from(
        [
            "",
            '{"reason": "x"}',
            '{"metrics": {"l": 1}}',
            '{"store": "dr", "storage_class": "COLD", "retain_until": 2e9}',
            '{"fingerprint": "f", "uploaded_at": 1e9, "rpo_seconds": 2.0005}',  # a half millisecond
            '{"rpo_seconds": 1234.567}',
            '{"rpo_seconds": NaN}',  # not a duration: null, as a detail without it
            '{"parts": {"model": 2, "optimizer": 3}}',
            '{"parts": {"model": 1.5, "optimizer": 3}}',  # not a split: null, as a detail without it
        ]
    ),
    save=st.integers(1, 2),
)


@settings(max_examples=25, deadline=None)
@given(st.lists(_EVENT, min_size=1, max_size=12), st.lists(_EVENT, max_size=4), st.integers(1, 4))
def test_any_events_print_the_same(first: list[Event], later: list[Event], limit: int) -> None:
    store = MemStore()
    cat = Catalog(store, "p")  # type: ignore[arg-type]
    cat.append(first)
    cat.compact(time.time() + 10)
    if later:
        cat.append(later)
    for state in [None, *LIFECYCLE_STATES]:
        for lim in (None, limit):
            want = _old_path(cat, None, state, None, lim)
            assert render_json_table(select_table(current_table(cat), state, None, lim)) == want
