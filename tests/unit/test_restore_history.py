"""A restore's read of its run (`from_manifests.read_run`): resolved from the catalog's current state
(the snapshot and the events since) where the catalog read in full, from the fold of the events joined
with the manifests' where it did not."""

from __future__ import annotations

import time

from ckptvault.catalog import Catalog, Event, fold, run_partition
from ckptvault.restore import from_manifests
from ckptvault.store import MemoryStore


def _catalog() -> Catalog:
    cat = Catalog(MemoryStore("b"), "vault")
    for i in range(3):
        cat.append([Event("r", i, "uploaded", 10.0 * i, bytes=5), Event("r", i, "verified", 10.0 * i + 1)])
    cat.compact(time.time() + 10)
    cat.append([Event("r", 1, "superseded", 100.0, detail='{"reason": "resave"}'), Event("q", 1, "verified", 5.0)])
    return cat


def test_a_run_read_in_full_resolves_from_the_current_state_equal_to_the_fold() -> None:
    cat = _catalog()
    h = from_manifests.read_run(cat, "r")
    assert h.unreadable == {} and h.current is not None
    assert h.states() == list(h.current) == fold(h.events) == cat.current("r")
    assert [s.superseded for s in h.states()] == [False, True, False]


def test_with_an_unreadable_object_it_folds_the_events_it_could_read() -> None:
    cat = _catalog()
    bad = f"vault/_catalog/{run_partition('r')}events/{1:020d}-{'e' * 32}.parquet"
    cat.store.put_bytes(bad, b"garbage")
    h = from_manifests.read_run(cat, "r")
    assert bad in h.unreadable and h.current is None
    assert h.states() == fold(h.events) and [s.step for s in h.states()] == [0, 1, 2]
