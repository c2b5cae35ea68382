"""A restore's read of its run (`from_manifests.read_run`): resolved from the catalog's current state
(the snapshot and the events since) where the catalog read in full, from the fold of the events joined
with the manifests' where it did not."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

from ckptvault.catalog import Catalog, Event, fold, run_partition
from ckptvault.restore import from_manifests
from ckptvault.store import MemoryStore, ObjectInfo


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


class _Counting(MemoryStore):
    """Counts each LIST prefix and each GET key."""

    def __init__(self) -> None:
        super().__init__("b")
        self.lists: Counter[str] = Counter()
        self.gets: Counter[str] = Counter()

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.lists[prefix] += 1
        return super().list(prefix)

    def get_bytes(self, key: str) -> bytes:
        self.gets[key] += 1
        return super().get_bytes(key)


def _counted() -> tuple[_Counting, Catalog]:
    store = _Counting()
    cat = Catalog(store, "vault")
    for i in range(3):
        cat.append([Event("r", i, "uploaded", 10.0 * i, bytes=5), Event("r", i, "verified", 10.0 * i + 1)])
    cat.compact(time.time() + 10)
    cat.append([Event("r", 1, "superseded", 100.0, detail='{"reason": "resave"}')])
    cat.append([Event("r", 3, "uploaded", 110.0, bytes=5), Event("r", 3, "verified", 111.0)])
    store.lists.clear()
    store.gets.clear()
    return store, cat


def test_a_run_is_read_with_one_listing_of_each_prefix_and_one_get_of_each_object() -> None:
    store, cat = _counted()
    h = from_manifests.read_run(cat, "r")
    assert store.lists and set(store.lists.values()) == {1}  # current() and events() listed the same prefixes
    assert len(store.gets) >= 3 and set(store.gets.values()) == {1}  # the snapshot, and each event file once
    fresh = Catalog(MemoryStore("x"), "vault")  # what the two reads give each on its own, from a copy
    for o in store.list("vault/"):
        fresh.store.put_bytes(o.key, store.get_bytes(o.key))
    assert h.events == tuple(fresh.events("r")) and h.current == tuple(fresh.current("r"))
    assert [s.step for s in h.states()] == [0, 1, 2, 3]
    store.gets.clear()
    from_manifests.read_run(cat, "r")  # nothing kept beyond the read: a second restore reads again
    assert set(store.gets.values()) == {1}


def test_a_compaction_between_the_two_reads_is_read_through() -> None:
    store, cat = _counted()
    with cat.read_once():
        before = cat.current("r")
        Catalog(store, "vault").compact(time.time() + 10)  # another process merges and deletes the event files
        events = cat.events("r")
    assert [(s.step, s.superseded) for s in before] == [(0, False), (1, True), (2, False), (3, False)]
    assert events == Catalog(store, "vault").events("r")
