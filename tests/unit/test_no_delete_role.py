"""`[store] deletes = "tier-only"` (docs/OPERATIONS.md, "Two roles"): ingest, drill, restore, hold and
watch run with credentials that cannot delete, on a MemoryStore that refuses every delete as an IAM deny
would. Their catalog compaction and alert-state saves send no delete, reads stay as fast and as right as
after a full compaction, and the tier role's full compaction and alert-state fold clear what they left.
The IAM side (no delete reachable from those flows, the ingest policy without s3:DeleteObject):
tests/infra/test_iam_policy.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.sending import (
    fold_alert_state,
    load_alert_state,
    save_alert_state,
    send_alerts,
    stored_state_keys,
)
from ckptvault.alerts.watch import AlertState, Episode
from ckptvault.catalog import Catalog, Event, compaction, eventlog, layout, run_partition
from ckptvault.catalog.snapshot import read_snapshot
from ckptvault.config import Config, StoreConfig
from ckptvault.store import StoreError
from ckptvault.store.memory import MemoryStore
from tests.helpers import deny_deletes, fold_python
from tests.unit.test_catalog_layout import _life

PREFIX = "p"
RUNS = ("a", "b/c")
CATALOG = f"{PREFIX}/_catalog/"


def _recording_gets(store: MemoryStore) -> list[str]:
    got: list[str] = []
    get: Callable[..., bytes] = store.get_bytes

    def recorded(key: str, *args: object, **kwargs: object) -> bytes:
        got.append(key)
        return get(key, *args, **kwargs)

    store.get_bytes = recorded  # type: ignore[method-assign]
    return got


def _keys(store: MemoryStore, where: str) -> list[str]:
    return [o.key for o in store.list(where)]


def _partition(store: MemoryStore, run: str, kind: str) -> list[str]:
    return _keys(store, f"{CATALOG}{run_partition(run)}{kind}/")


def test_config_switch_says_which_flows_may_delete() -> None:
    assert StoreConfig(bucket="ckpts").flows_delete  # the default keeps every flow tidying what it writes
    assert not StoreConfig(bucket="ckpts", deletes="tier-only").flows_delete
    with pytest.raises(ValueError, match="deletes"):
        StoreConfig(bucket="ckpts", deletes="never")  # type: ignore[arg-type]


class _Clock:
    """The catalog's clock for its keys (event files, snapshots): ingests 10 minutes apart in no time."""

    def __init__(self) -> None:
        self.ns = time.time_ns()

    def time_ns(self) -> int:
        self.ns += 1_000_000  # distinct keys within one ingest, in the order they are written
        return self.ns

    def time(self) -> float:
        return self.time_ns() / 1e9  # "now" is after every key written so far, float rounding included

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(eventlog, "time", c)
    monkeypatch.setattr(layout, "time", c)
    return c


def _ingest(stores: tuple[MemoryStore, ...], clock: _Clock, i: int, everything: list[Event]) -> None:
    """One 10-minute ingest that records a checkpoint of every run, then compacts as its store's role may."""
    clock.advance(600)
    evs = [e for r in RUNS for e in _life(r, i, 100.0 * i)]
    everything += evs
    for s in stores:
        Catalog(s, PREFIX).append(evs)
        Catalog(s, PREFIX).compact(clock.time(), runs=RUNS, deletes=s.bucket == "full")


def test_no_delete_ingests_then_a_tier_compaction_read_as_the_full_compaction_fold(clock: _Clock) -> None:
    full = MemoryStore("full")  # today's role: every ingest compacts fully
    store = MemoryStore("nodelete")
    tier = store.under(PREFIX)  # the same bucket with the tier role's credentials, which may delete
    attempted = deny_deletes(store)
    got = _recording_gets(store)
    everything: list[Event] = []
    # a snapshot at ingests 0, 3, 6, ..., 18: each 30 minutes (SNAPSHOT_EVERY_SECONDS) after the one before
    assert compaction.SNAPSHOT_EVERY_SECONDS == 1800
    ingests = 19
    for i in range(ingests):
        _ingest((full, store), clock, i, everything)
        # every read, of one run or of all, answers what the full compaction and the fold answer
        want = fold_python(everything)
        assert Catalog(store, PREFIX).current() == Catalog(full, PREFIX).current() == want
        for r in RUNS:
            assert Catalog(store, PREFIX).current(r) == [s for s in want if s.run == r]
    assert attempted == []  # not one delete sent

    # what 19 ingests left: every event file, 7 snapshots per run, a combined snapshot per snapshot round
    for r in RUNS:
        assert len(_partition(store, r, "events")) == ingests
        assert len(_partition(store, r, "snapshot")) == 7
    combined = _keys(store, CATALOG + "_combined/")
    assert len(combined) == 7

    # the reads stay as fast: every run covered, a read of all of them is the newest combined snapshot
    got.clear()
    assert Catalog(store, PREFIX).current() == want
    assert got == [max(combined)]
    # one run: its newest snapshot and no covered event file
    got.clear()
    Catalog(store, PREFIX).current("a")
    assert got == [max(_partition(store, "a", "snapshot"))]

    # two more ingests within 30 minutes of that snapshot: none written; a read GETs it and the two files
    for i in range(ingests, ingests + 2):
        _ingest((store,), clock, i, everything)
    assert len(_partition(store, "a", "snapshot")) == 7
    got.clear()
    assert Catalog(store, PREFIX).current("a") == [s for s in fold_python(everything) if s.run == "a"]
    assert got[0] == max(_partition(store, "a", "snapshot"))
    assert sorted(got[1:]) == _partition(store, "a", "events")[-2:]
    # the third is 30 minutes after it: a snapshot again, folded on top of the last one (its GET and the 3
    # files since, per run, and the combined snapshot it replaces), and the run reads as one GET again
    got.clear()
    _ingest((store,), clock, ingests + 2, everything)
    assert len(_partition(store, "a", "snapshot")) == 8
    for r in RUNS:
        assert sorted(k for k in got if run_partition(r) in k) == [
            *_partition(store, r, "events")[-3:],
            sorted(_partition(store, r, "snapshot"))[-2],
        ]
    assert len(got) == len(RUNS) * 4 + 1
    got.clear()
    assert Catalog(store, PREFIX).current() == fold_python(everything)
    assert got == [max(_keys(store, CATALOG + "_combined/"))]

    # checkpoints saved further apart than that: every ingest that records one writes a snapshot
    clock.advance(3600)
    _ingest((store,), clock, ingests + 3, everything)
    assert len(_partition(store, "a", "snapshot")) == 9
    _snapshot_is_the_fold_of_its_partition(store, "a", everything)
    # an event older than what the snapshot folded (catalog rebuild --write): folded again from every file
    late = [Event("a", 0, "drilled", 2.5, ok=False)]  # before step 0's drill at 4.0: that one stays the last
    everything += late
    Catalog(store, PREFIX).append(late)
    clock.advance(3600)
    Catalog(store, PREFIX).compact(clock.time(), runs=RUNS, deletes=False)
    assert len(_partition(store, "a", "snapshot")) == 10
    _snapshot_is_the_fold_of_its_partition(store, "a", everything)
    assert Catalog(store, PREFIX).current() == fold_python(everything)
    assert attempted == []

    # the daily tier run, whose role may delete: one merged file, one snapshot, one combined snapshot
    assert Catalog(tier, PREFIX).compact(clock.time()) == 2 * (ingests + 4) + 1
    for r in RUNS:
        assert len(_partition(store, r, "events")) == len(_partition(store, r, "snapshot")) == 1
    assert len(_keys(store, CATALOG + "_combined/")) == 1
    assert Catalog(store, PREFIX).current() == fold_python(everything)
    assert attempted == []


def _snapshot_is_the_fold_of_its_partition(store: MemoryStore, run: str, everything: list[Event]) -> None:
    """The newest snapshot of `run`, written on top of the one before, is what a fold of every event file
    gives: the same states, and the identity of every event (the origin file and its row) once."""
    key = max(_partition(store, run, "snapshot"))
    snap = read_snapshot(key, store.get_bytes(key))
    files = _partition(store, run, "events")
    assert set(files) <= snap.covers
    ids = {(k, i) for k in files for i in range(pq.read_metadata(pa.BufferReader(store.get_bytes(k))).num_rows)}
    assert snap.ids() == ids and snap.count() == len(ids)
    states = [s for s, _ in sorted(snap.states.values(), key=lambda v: (v[0].step, v[0].save))]
    assert states == [s for s in fold_python(everything) if s.run == run]


def test_the_alert_state_without_deletes_grows_only_when_it_changes_and_the_tier_fold_clears_it() -> None:
    store = MemoryStore("bkt")
    tier = store.under("")
    attempted = deny_deletes(store)
    now = time.time()
    first = AlertState(sent={"run_stale:r": now}, stale={"r": Episode(newest_at=now - 7200, opened_at=now)})
    assert save_alert_state(store, PREFIX, first, delete=False) is not None
    second = AlertState(sent={"budget:2026-12": now})
    assert save_alert_state(store, PREFIX, second, delete=False) is not None
    merged = load_alert_state(store, PREFIX)
    assert set(merged.sent) == {"run_stale:r", "budget:2026-12"} and merged.stale == first.stale
    # the hourly watch that learnt nothing new writes nothing, though two objects hold the state
    assert save_alert_state(store, PREFIX, merged, delete=False) is None
    assert save_alert_state(store, PREFIX, second, delete=False) is None
    # a dedup record past its retention is pruned from what is written, which alone is no reason to write
    old = AlertState(sent={"budget:2020-01": now - 30 * 86400})
    assert save_alert_state(store, PREFIX, old, delete=False) is not None  # new to the store: kept
    assert save_alert_state(store, PREFIX, AlertState(), forget_before=now - 86400, delete=False) is None
    assert len(stored_state_keys(store, PREFIX)) == 3
    assert attempted == []

    cfg = Config(store=StoreConfig(bucket="bkt", prefix=PREFIX, deletes="tier-only"))
    hold = alerts.build("legal_hold", run="r", step=10, save=1, on=True, who="ops", why="incident 7", objects=3)
    assert send_alerts(cfg, store, [hold]) == 1  # the console channel; its dedup record is saved
    assert len(stored_state_keys(store, PREFIX)) == 4 and attempted == []
    before = load_alert_state(store, PREFIX)

    # the tier flow's fold (its role may delete): one object, the same state less what is past retention
    assert fold_alert_state(cfg, tier) is not None
    assert len(stored_state_keys(store, PREFIX)) == 1
    after = load_alert_state(store, PREFIX)
    assert after.stale == before.stale and set(after.sent) == set(before.sent) - {"budget:2020-01"}
    assert fold_alert_state(cfg, tier) is None  # one object already: nothing to do


def test_every_flow_mode_still_folds_and_deletes_as_before() -> None:
    store = MemoryStore("bkt")
    cfg = Config(store=StoreConfig(bucket="bkt", prefix=PREFIX))
    for i in range(3):
        save_alert_state(store, PREFIX, AlertState(sent={f"k{i}": time.time()}))
    assert len(stored_state_keys(store, PREFIX)) == 1
    assert (
        send_alerts(
            cfg,
            store,
            [alerts.build("legal_hold", run="r", step=1, save=1, on=False, who="ops", why="done", objects=1)],
        )
        == 1
    )
    assert len(stored_state_keys(store, PREFIX)) == 1


def test_a_compaction_that_deletes_under_a_role_that_cannot_names_the_switch_and_loses_nothing() -> None:
    store = MemoryStore("bkt")
    attempted = deny_deletes(store)
    everything = [*_life("a", 1, 100.0), *_life("a", 2, 200.0)]
    Catalog(store, PREFIX).append(everything[:5])
    Catalog(store, PREFIX).append(everything[5:])
    with pytest.raises(StoreError, match='set \\[store\\] deletes = "tier-only"'):
        Catalog(store, PREFIX).compact(time.time())  # deletes=True: the ingest flow without the switch
    assert len(attempted) == 2
    assert Catalog(store, PREFIX).current() == fold_python(everything)  # merged and sources read once
