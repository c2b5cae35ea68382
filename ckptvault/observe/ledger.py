"""The ledger: what the flows did, kept in the bucket for the counters of docs/metrics.md (alerts sent by
kind, bytes and seconds restored and drilled, failures by error class, each flow's last success). The
format, its merge and why it is safe are in docs/FORMAT.md, "The ledger".

Counters cannot live in a process (a flow that crashed would take them with it, and every scrape of a
new `serve` would start at 0), nor be read from every catalog event at each scrape. So each flow adds
one *entry* (its counts, the UTC day it was recorded) to a small document stored like the alert state,
one object per save, merged by every reader. Entries recorded two days ago or more are summed into the
document's *base*, which says which day it runs through: two writers folding the same closed days get
the same base, so the merge (the later base wins, entries it covers are dropped, the rest kept by id)
is order-free and idempotent, and a counter never counts an entry twice or loses one.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from ckptvault.store import ChecksumMismatchError, NotFoundError, ObjectStore, StoreError, retrying

log = logging.getLogger("ckptvault.ledger")

SCHEMA = "ckptvault.ledger/1"
LEDGER_DIR = "_state/ledger/"
_FILE_RE = re.compile(r"\d{20}-[0-9a-f]{32}\.json")
# An entry is summed into the base once its day is this many days closed: by then every flow that
# recorded on that day has written its object (a flow records when it ends, dated by that moment).
FOLD_AFTER_DAYS = 2
_READ_ROUNDS = 5
_GETS_IN_FLIGHT = 16

# The counter families and the label each one's key carries ("" for none): `family` or `family|value`.
FAMILIES: dict[str, str] = {
    "alerts_sent": "kind",
    "restore_bytes": "",
    "restore_seconds": "",
    "drill_bytes": "",
    "drill_seconds": "",
    "upload_failures": "error_class",
    "restore_failures": "error_class",
    # transient store errors retried under the port (ckptvault/store/retrying.py), by the port call
    "store_retries": "operation",
}


def counter_key(family: str, label: str = "") -> str:
    if family not in FAMILIES:
        raise ValueError(f"unknown ledger counter family {family!r}")
    return f"{family}|{label}" if FAMILIES[family] else family


def split_key(key: str) -> tuple[str, str]:
    """(family, label value) of a counter key; the label is "" for a family without one."""
    family, _, label = key.partition("|")
    return family, label


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def _add(into: dict[str, float], counts: Mapping[str, float]) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0.0) + v


@dataclass(frozen=True)
class Entry:
    """One flow's contribution: its counts, and the day it was recorded (UTC, `YYYY-MM-DD`)."""

    id: str
    day: str
    counts: dict[str, float] = field(default_factory=dict)


# The gauges a flow sets (the value its last run found, not a sum): name -> help, for docs/metrics.md.
GAUGES: dict[str, str] = {
    "tampered_saves": "Committed saves the last tamper check found deleted or overwritten after their commit.",
    "drill_verify_seconds": "Seconds the last drill that ran a resume check spent in its verify commands, all saves "
    "together.",
}


@dataclass(frozen=True)
class Ledger:
    last_success: dict[str, float] = field(default_factory=dict)  # flow name -> unix seconds
    through: str = ""  # the base holds every entry of this day and before ("" : none yet)
    base: dict[str, float] = field(default_factory=dict)
    entries: dict[str, Entry] = field(default_factory=dict)
    # gauge name -> (value, when it was set): the latest setting wins the merge
    gauges: dict[str, tuple[float, float]] = field(default_factory=dict)
    # the keys of the stored objects whose content this object's holds (not part of the ledger: a reader
    # of the object that holds it need not GET them)
    covers: tuple[str, ...] = field(default=(), compare=False)

    def totals(self) -> dict[str, float]:
        """Each counter: the base plus every entry not yet in it."""
        out = dict(self.base)
        for e in self.entries.values():
            _add(out, e.counts)
        return out

    def to_json(self) -> bytes:
        doc = {
            "schema": SCHEMA,
            "last_success": self.last_success,
            "base": {"through": self.through, "counts": self.base},
            "entries": {i: {"day": e.day, "counts": e.counts} for i, e in sorted(self.entries.items())},
            "covers": list(self.covers),
        }
        if self.gauges:  # absent until a flow sets one: a document older versions wrote reads the same
            doc["gauges"] = {k: [v, t] for k, (v, t) in self.gauges.items()}
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Ledger:
        """Raises ValueError for anything but a ledger document."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
                raise ValueError(f"not a {SCHEMA} document")
            base = doc.get("base") or {}
            entries = {
                str(i): Entry(str(i), str(e["day"]), {str(k): float(v) for k, v in (e.get("counts") or {}).items()})
                for i, e in (doc.get("entries") or {}).items()
            }
            return cls(
                last_success={str(k): float(v) for k, v in (doc.get("last_success") or {}).items()},
                gauges={str(k): (float(v[0]), float(v[1])) for k, v in (doc.get("gauges") or {}).items()},
                through=str(base.get("through") or ""),
                base={str(k): float(v) for k, v in (base.get("counts") or {}).items()},
                entries=entries,
                covers=tuple(str(k) for k in (doc.get("covers") or [])),
            )
        except (TypeError, KeyError, AttributeError, IndexError, json.JSONDecodeError) as e:
            raise ValueError(f"not a readable {SCHEMA} document: {e}") from None


def merge(parts: Iterable[Ledger]) -> Ledger:
    """Order-free and idempotent: the latest success per flow; the base that runs through the latest day
    (equal days: the same entries summed, so the larger of each count, which is the same count); every
    entry by id, but those that base already holds."""
    last: dict[str, float] = {}
    gauges: dict[str, tuple[float, float]] = {}
    through, base = "", {}
    entries: dict[str, Entry] = {}
    for p in parts:
        for f, t in p.last_success.items():
            last[f] = max(last.get(f, t), t)
        for g, (v, t) in p.gauges.items():
            if g not in gauges or (t, v) > (gauges[g][1], gauges[g][0]):
                gauges[g] = (v, t)
        if p.through > through:
            through, base = p.through, dict(p.base)
        elif p.through == through:
            for k, v in p.base.items():
                base[k] = max(base.get(k, v), v)
        entries.update(p.entries)
    kept = {i: e for i, e in entries.items() if e.day > through}
    return Ledger(last, through, base, kept, gauges)


def fold_closed(ledger: Ledger, now: float) -> Ledger:
    """Sum the entries of every day at least FOLD_AFTER_DAYS closed into the base."""
    through = (datetime.fromtimestamp(now, UTC) - timedelta(days=FOLD_AFTER_DAYS)).strftime("%Y-%m-%d")
    if through <= ledger.through:
        return ledger
    base = dict(ledger.base)
    for e in ledger.entries.values():
        if e.day <= through:
            _add(base, e.counts)
    return Ledger(
        dict(ledger.last_success), through, base,
        {i: e for i, e in ledger.entries.items() if e.day > through}, dict(ledger.gauges),
    )  # fmt: skip


def entry(counts: Mapping[str, float], now: float | None = None) -> Entry:
    """A new entry of these counts (zeros left out), dated now."""
    t = time.time() if now is None else now
    return Entry(uuid.uuid4().hex, day_of(t), {k: float(v) for k, v in counts.items() if v})


def ledger_dir(prefix: str) -> str:
    return "/".join(p for p in (prefix.strip("/"), LEDGER_DIR) if p)


def _keys(store: ObjectStore, prefix: str) -> list[str]:
    folder = ledger_dir(prefix)
    return [o.key for o in store.list(folder) if _FILE_RE.fullmatch(o.key[len(folder) :])]


@dataclass(frozen=True)
class Stored:
    """What a read of the stored ledger found: the objects it read, and the listed ones it did not need to
    read because one of those holds their content (a record that may delete deletes both)."""

    parts: list[tuple[str, Ledger]]
    covered: list[str]

    def merged(self) -> Ledger:
        return merge(p for _, p in self.parts)

    def holds(self) -> tuple[str, ...]:
        """Every key whose content the parts hold: what a new object merging them covers."""
        return tuple(sorted([*(k for k, _ in self.parts), *self.covered]))


def read_stored(store: ObjectStore, prefix: str) -> Stored:
    """The newest readable object, then every listed object its `covers` does not name (in parallel: one
    each per record not yet merged, e.g. written at once by two flows). One that cannot be read is logged
    and left out: neither merged nor ever deleted (it may be a newer version's)."""
    known: dict[str, Ledger | None] = {}
    keys: list[str] = []
    covered: set[str] = set()

    def get(k: str) -> Ledger | bool | None:  # False: gone (folded into a newer object by a concurrent save)
        try:
            return Ledger.from_json(store.get_bytes(k))
        except NotFoundError:
            return False
        except (ChecksumMismatchError, ValueError) as e:
            log.warning("skipping ledger object %s: %s", k, e)
            return None

    def fetch(want: list[str]) -> bool:
        """GET these into `known`; False if one had vanished."""
        if len(want) > 1:
            with ThreadPoolExecutor(min(_GETS_IN_FLIGHT, len(want))) as pool:
                got = list(pool.map(get, want))
        else:
            got = [get(k) for k in want]
        for k, g in zip(want, got, strict=True):
            if g is not False:
                known[k] = g if isinstance(g, Ledger) else None
        return all(g is not False for g in got)

    for _ in range(_READ_ROUNDS):
        keys = _keys(store, prefix)  # oldest first: the keys begin with their write time
        listed = set(keys)
        covered = set()
        complete = True
        for k in reversed(keys):  # the newest readable object holds what it covers
            if k not in known:
                complete = fetch([k]) and complete
            got = known.get(k)
            if got is not None:
                covered = set(got.covers) & listed
                break
        complete = fetch([k for k in keys if k not in known and k not in covered]) and complete
        for k in keys:
            if k not in covered and (got := known.get(k)) is not None:
                covered |= set(got.covers) & listed
        if complete:
            break
    parts = [(k, p) for k in keys if k not in covered and (p := known.get(k)) is not None]
    return Stored(parts, sorted(covered))


def read_parts(store: ObjectStore, prefix: str) -> list[tuple[str, Ledger]]:
    """The objects a reader merges (`read_stored`'s parts)."""
    return read_stored(store, prefix).parts


def load(store: ObjectStore, prefix: str) -> Ledger:
    """The merged ledger (an empty one for a bucket written before it existed)."""
    return read_stored(store, prefix).merged()


def record_ledger(
    store: ObjectStore,
    prefix: str,
    counts: Mapping[str, float] | None = None,
    succeeded: str | None = None,
    *,
    delete: bool,
    now: float | None = None,
    gauges: Mapping[str, float] | None = None,
) -> str | None:
    """Add one entry of `counts` (and, with `succeeded`, that flow's success now; with `gauges`, each of
    those GAUGES set to its value as of now) to the stored ledger.

    The stored ledger is merged with it (closed days folded into the base) and written as one new object
    that names in `covers` every object whose content it holds; with `delete`, those are deleted after
    it is written. Without (`[store] deletes = "tier-only"`), they stay until a record that may delete
    (`tier --apply`), but a reader GETs only the newest and what it does not cover. Returns the new key,
    or None when there was nothing to record. Raises StoreError only when the new object could not be
    written (then nothing was deleted)."""
    t = time.time() if now is None else now
    # the store calls this process retried since the last record: counted by the record that is written
    retried = retrying.take_counts()
    try:
        key = _record(
            store, prefix, _with_retries(counts or {}, retried), succeeded, delete=delete, t=t, gauges=gauges or {}
        )
    except BaseException:
        retrying.give_back_counts(retried)
        raise
    if key is None:
        retrying.give_back_counts(retried)
    return key


def _with_retries(counts: Mapping[str, float], retried: Mapping[str, int]) -> dict[str, float]:
    out = dict(counts)
    for op, n in retried.items():
        k = counter_key("store_retries", op)
        out[k] = out.get(k, 0.0) + n
    return out


def _record(
    store: ObjectStore,
    prefix: str,
    counts: Mapping[str, float],
    succeeded: str | None,
    *,
    delete: bool,
    t: float,
    gauges: Mapping[str, float],
) -> str | None:
    unknown = sorted(set(gauges) - set(GAUGES))
    if unknown:
        raise ValueError(f"unknown ledger gauge(s) {', '.join(unknown)}")
    e = entry(counts, t)
    mine = Ledger(
        last_success={succeeded: t} if succeeded else {}, through="", base={}, entries={e.id: e} if e.counts else {},
        gauges={g: (float(v), t) for g, v in gauges.items()},
    )  # fmt: skip
    stored, read = Stored([], []), True
    try:
        stored = read_stored(store, prefix)
    except StoreError as err:  # ours alone loses nothing: the next record merges it with the rest
        log.warning("cannot read the stored ledger (%s); writing this entry beside it", err)
        read = False
    parts = stored.parts
    merged = merge([mine, *(p for _, p in parts)])
    # Fold only over a whole read: a fold of this entry alone would carry a newer `through` with an empty
    # base, which the merge prefers, so every count before that day would be dropped from then on.
    if read:
        merged = fold_closed(merged, t)
    if merged == Ledger():
        return None
    if len(parts) == 1 and parts[0][1] == merged and (not delete or not stored.covered):
        return None
    key = f"{ledger_dir(prefix)}{time.time_ns():020d}-{uuid.uuid4().hex}.json"
    body = replace(merged, covers=stored.holds()).to_json()
    store.put_bytes(key, body, if_none_match=True, content_type="application/json")
    if not delete:
        return key
    for k in stored.holds():
        try:
            store.delete(k)
        except StoreError as err:
            log.info("could not delete the folded ledger object %s (%s); the next save folds it again", k, err)
    return key


def alerts_sent(kinds: Iterable[str]) -> dict[str, float]:
    """The counts of alerts delivered, one per kind named."""
    return {counter_key("alerts_sent", k): float(n) for k, n in Counter(kinds).items()}


def note_ledger(
    store: ObjectStore,
    prefix: str,
    counts: Mapping[str, float] | None = None,
    succeeded: str | None = None,
    *,
    delete: bool,
    gauges: Mapping[str, float] | None = None,
) -> str | None:
    """`record_ledger`, for a flow's end: a ledger that cannot be written is logged, never the flow's
    failure (the work is done and in the catalog; the counters lag until the next record)."""
    try:
        return record_ledger(store, prefix, counts, succeeded, delete=delete, gauges=gauges)
    except StoreError as e:
        log.warning("could not record %s in the metrics' ledger under %s: %s", succeeded or "counts", prefix, e)
        return None
