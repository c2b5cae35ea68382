"""`ckptvault catalog stats`: how big the catalog is and what it describes, from one LIST of `_catalog/`,
the current state, and the combined snapshot, or for a run it does not cover its partition's newest
snapshot and the event files that does not cover."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptvault.catalog.codec import _ORIGIN, _ROW
from ckptvault.catalog.layout import _Part, classify
from ckptvault.catalog.model import CheckpointState

if TYPE_CHECKING:
    from ckptvault.catalog.reading import CatalogReader

_ID_COLUMNS = ["run", "step", "event", "at"]  # the fewest a file is checked by; identities come with them


def writer_pairs(written_by: dict[str, str]) -> list[tuple[str, str]]:
    """A save's (writer, version) pairs, as `catalog stats` and `ckptvault_saves_by_writer` group them: one
    per entry of its `written_by` (a Megatron save counts under megatron-core.torch_dist and torch.dcp)."""
    return sorted((str(k), str(v)) for k, v in written_by.items())


def writers_as_records(by_writer: dict[tuple[str, str], tuple[int, int]]) -> list[dict[str, Any]]:
    return [{"writer": w, "version": v, "checkpoints": n, "bytes": b} for (w, v), (n, b) in sorted(by_writer.items())]


@dataclass
class CatalogStats:
    runs: int
    checkpoints: int  # checkpoint saves, (run, step, save), as `ls` lists them
    events: int  # distinct events (by identity), as the fold counts them
    event_files: int
    snapshots: int
    flat_files: int  # the layout before partitions, not yet migrated
    set_aside: int  # under _catalog/unreadable/
    catalog_bytes: int
    by_state: dict[str, int]
    by_class: dict[str, tuple[int, int]]  # storage class -> (saves, original bytes) of what is in the store
    unreadable: dict[str, str] = field(default_factory=dict)
    # storage class -> what those saves' objects occupy (compressed size where compressed): what the
    # class bills; by_class's bytes are the files' original sizes, what a restore writes
    stored_by_class: dict[str, int] = field(default_factory=dict)
    # combined snapshots under _catalog/_combined/: one, or two while a compaction ends; with [store]
    # deletes = "tier-only" up to a day's worth until tier --apply (docs/FORMAT.md)
    combined: int = 0
    # the folded states counted above, for a caller that prices them (`catalog stats` per store): not
    # part of as_dict
    states: list[CheckpointState] = field(default_factory=list, repr=False)
    # (writer, version) -> (saves, original bytes) of the saves in the store whose checkpoint records
    # what wrote it (the verified event's written_by, docs/FORMAT.md "What wrote a save"); a save counts
    # under each pair it records. writer_unrecorded: the saves in the store that record none
    by_writer: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    writer_unrecorded: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs, "checkpoints": self.checkpoints, "events": self.events,
            "files": {"events": self.event_files, "snapshots": self.snapshots, "combined": self.combined,
                      "flat": self.flat_files, "set_aside": self.set_aside},
            "catalog_bytes": self.catalog_bytes, "by_state": dict(sorted(self.by_state.items())),
            "by_class": {c: {"checkpoints": n, "bytes": b, "stored_bytes": self.stored_by_class.get(c, b)}
                         for c, (n, b) in sorted(self.by_class.items())},
            "unreadable": dict(sorted(self.unreadable.items())),
            "by_writer": writers_as_records(self.by_writer), "writer_unrecorded": self.writer_unrecorded,
        }  # fmt: skip


def stats(cat: CatalogReader) -> CatalogStats:
    kinds: Counter[str] = Counter()
    size = 0
    for o in cat.store.list(cat.root):
        size += o.size
        kind, _ = classify(cat.root, o.key)
        if not kind and o.key[len(cat.root) :].startswith("unreadable/"):
            kind = "set_aside"
        kinds[kind] += 1
    states = cat.current()
    flat, parts, combined = cat._list(None)
    # the same combined snapshot `current` read (kept by key): its event counts for the runs it covers
    comb = cat._combined(combined) if combined and not flat else None
    flat_ids: dict[str, set[tuple[str, int]]] = {}
    for t in cat._read_tables(flat, _ID_COLUMNS):
        for run, o, r in zip(t["run"].to_pylist(), t[_ORIGIN].to_pylist(), t[_ROW].to_pylist(), strict=True):
            flat_ids.setdefault(run, set()).add((o, r))
    events = 0
    for run in set(parts) | set(flat_ids):
        p = parts.get(run, _Part([], []))
        if comb is not None and comb.covers(run, p):
            events += comb.runs[run].events
            continue
        snap = cat._snapshot(p.snapshots) if p.snapshots else None
        extra = set(flat_ids.get(run, ()))
        for t in cat._read_tables([k for k in p.events if snap is None or k not in snap.covers], _ID_COLUMNS):
            extra |= set(zip(t[_ORIGIN].to_pylist(), t[_ROW].to_pylist(), strict=True))
        if snap is not None:
            # the snapshot's identities as a set only when an event outside it may repeat one of them
            if extra:
                covered = snap.ids()
                events += len(covered)
                extra -= covered
            else:
                events += snap.count()
        events += len(extra)
    by_class: dict[str, tuple[int, int]] = {}
    stored: Counter[str] = Counter()
    by_writer: dict[tuple[str, str], tuple[int, int]] = {}
    unrecorded = 0
    for s in states:
        if s.uploaded_at is None or s.expired:
            continue  # not, or no longer, in the store
        cls = s.storage_class or "STANDARD"
        n, b = by_class.get(cls, (0, 0))
        by_class[cls] = (n + 1, b + s.bytes)
        stored[cls] += s.billed_bytes
        pairs = writer_pairs(s.written_by)
        unrecorded += not pairs
        for pair in pairs:
            n, b = by_writer.get(pair, (0, 0))
            by_writer[pair] = (n + 1, b + s.bytes)
    return CatalogStats(
        runs=len({s.run for s in states}), checkpoints=len(states), events=events,
        event_files=kinds["events"], snapshots=kinds["snapshot"], flat_files=kinds["flat"],
        set_aside=kinds["set_aside"], catalog_bytes=size, by_state=dict(Counter(s.state for s in states)),
        by_class=by_class, unreadable=dict(cat.unreadable), stored_by_class=dict(stored),
        combined=kinds["combined"], states=states, by_writer=by_writer, writer_unrecorded=unrecorded,
    )  # fmt: skip
