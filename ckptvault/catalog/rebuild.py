"""The catalog from the manifests alone, the source of truth: one `verified` event per committed
checkpoint, the manifests fetched concurrently; for a save whose manifest says it was locked, what a
HEAD of that manifest shows since (a milestone extension, a legal hold: docs/FORMAT.md, "The lock in
the state")."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ckptvault.catalog.events import parts
from ckptvault.catalog.model import Event
from ckptvault.checkpoint.manifest import (
    BLOCKS_NAME,
    MANIFEST_NAME,
    VALIDATION_NAME,
    Manifest,
    ManifestError,
    parse_save_dir,
)

if TYPE_CHECKING:
    from ckptvault.catalog.reading import CatalogReader

REBUILT = "catalog-rebuild"  # the flow_run of the events a rebuild finds on the objects
_MANIFEST_READERS = 16  # manifests are small: latency-bound, more in flight than event files


def rebuild_from_manifests(
    cat: CatalogReader,
    progress: Callable[[int], Callable[[int], None]] | None = None,
    run: str | None = None,
    lock_heads: bool = True,
) -> list[Event]:
    """One "verified" event per checkpoint whose manifest is in the bucket, at its upload time, with
    the `locked_until` its manifest records. The storage class is the most common among the
    checkpoint's data objects. Nothing is appended: the caller decides (e.g.
    `cat.append(cat.rebuild_from_manifests())` into an empty catalog). `progress`, given the number of
    manifests once they are listed, returns what is called with 1 per manifest fetched (e.g. a
    ProgressBar). `run`: only that run's checkpoints (one LIST of its prefix). `lock_heads`: one HEAD
    of each manifest that records a lock, in the same pool right after its GET, adding a `locked` event
    where its retention now lasts longer (a milestone extension: the manifest is raised last) and a
    `held` one where it is under a legal hold; False for a reader that needs only which saves exist."""
    root = f"{cat.prefix}/" if cat.prefix else ""
    classes: dict[str, Counter[str]] = {}
    manifests: list[tuple[str, float]] = []
    for o in cat.store.list(root if run is None else f"{root}{run}/"):
        rel = o.key[len(root) :].split("/")
        if len(rel) < 3 or rel[0] == "_catalog" or parse_save_dir(rel[1]) is None:
            continue
        ckpt = "/".join(rel[:2])
        if len(rel) == 3 and rel[2] == MANIFEST_NAME:
            manifests.append((o.key, o.last_modified))
        elif not (len(rel) == 3 and rel[2] in (VALIDATION_NAME, BLOCKS_NAME)):
            classes.setdefault(ckpt, Counter())[o.storage_class] += 1
    tick = progress(len(manifests)) if progress is not None else None

    def events_of(item: tuple[str, float]) -> list[Event]:
        key, modified = item
        body = cat.store.get_bytes(key)
        if tick is not None:
            tick(1)
        run, sdir = key[len(root) :].split("/")[:2]
        try:
            m = Manifest.from_json(body, origin=key)
        except ManifestError as e:
            # Unreadable manifest: the checkpoint does not exist for readers, but say so.
            step, save = parse_save_dir(sdir) or (0, 1)
            detail = json.dumps({"source": "rebuild_from_manifests", "reason": str(e)})
            return [Event(run=run, step=step, save=save, event="invalid", at=modified, detail=detail)]
        counts = classes.get(f"{run}/{sdir}")
        # Ties go to the alphabetically first class so a rebuild is deterministic.
        cls = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else "STANDARD"
        extra: dict[str, object] = {} if m.lock is None else {"locked_until": m.lock.retain_until}
        split = parts(m)  # as the ingest's verified event records it (docs/FORMAT.md)
        if split is not None:
            extra["parts"] = split
        if m.written_by:
            extra["written_by"] = dict(sorted(m.written_by.items()))
        detail = json.dumps({"source": "rebuild_from_manifests", "manifest": key, "metrics": m.metrics, **extra})
        verified = Event(
            run=m.run, step=m.step, save=m.save, event="verified", at=m.uploaded_at, format=m.format,
            bytes=m.total_bytes, files=len(m.files), storage_class=cls, created_at=m.created_at,
            detail=detail, stored_bytes=0 if m.stored_bytes == m.total_bytes else m.stored_bytes,
        )  # fmt: skip
        if m.lock is None or not lock_heads:
            return [verified]
        return [verified, *_since_commit(cat, key, m)]

    # Each GET is mostly a round trip: fetched concurrently, in listing order for a deterministic result.
    # Each manifest becomes its events as it arrives, so only the events are held, never every body.
    with ThreadPoolExecutor(max_workers=_MANIFEST_READERS) as pool:
        return [e for got in pool.map(events_of, manifests) for e in got]


def _since_commit(cat: CatalogReader, key: str, m: Manifest) -> list[Event]:
    """What a HEAD of a locked save's manifest shows beyond its recorded lock, as the events the tier
    flow and `hold` write (ckptvault.catalog.events builds those; it imports the catalog, so they are spelled
    here): `locked` (the manifest is raised last, so its date holds for every object) and `held`.
    Dated now, after the `verified` event at the commit, so the fold ends on them."""
    head = cat.store.head(key)
    if head is None or m.lock is None:
        return []  # gone since the listing: its verified event stands as a reader found it
    out = []
    now, r = time.time(), head.retention
    if r is not None and r.until_ts > m.lock.retain_until:
        days = round((r.until_ts - m.uploaded_at) / 86_400)
        detail = json.dumps({"locked_until": r.until_ts, "mode": r.mode, "days": days, "objects": 1,
                             "source": "rebuild_from_manifests"})  # fmt: skip
        out.append(Event(run=m.run, step=m.step, save=m.save, event="locked", at=now, flow_run=REBUILT, detail=detail))
    if head.legal_hold:
        detail = json.dumps({"who": "", "why": "found on the manifest by catalog rebuild", "objects": 1,
                             "source": "rebuild_from_manifests"})  # fmt: skip
        out.append(Event(run=m.run, step=m.step, save=m.save, event="held", at=now, format=m.format,
                         flow_run=REBUILT, detail=detail))  # fmt: skip
    return out
