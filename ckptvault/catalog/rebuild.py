"""The catalog from the manifests alone, the source of truth: one `verified` event per committed
checkpoint, the manifests fetched concurrently."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ckptvault.catalog.model import Event
from ckptvault.manifest import MANIFEST_NAME, VALIDATION_NAME, Manifest, ManifestError, parse_save_dir

if TYPE_CHECKING:
    from ckptvault.catalog.eventlog import Catalog

_MANIFEST_READERS = 16  # manifests are small: latency-bound, more in flight than event files


def rebuild_from_manifests(
    cat: Catalog, progress: Callable[[int], Callable[[int], None]] | None = None, run: str | None = None
) -> list[Event]:
    """One "verified" event per checkpoint whose manifest is in the bucket, at its upload time. The
    storage class is the most common among the checkpoint's data objects. Nothing is appended: the
    caller decides (e.g. `cat.append(cat.rebuild_from_manifests())` into an empty catalog).
    `progress`, given the number of manifests once they are listed, returns what is called with 1
    per manifest fetched (e.g. a ProgressBar). `run`: only that run's checkpoints (one LIST of its prefix)."""
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
        elif not (len(rel) == 3 and rel[2] == VALIDATION_NAME):
            classes.setdefault(ckpt, Counter())[o.storage_class] += 1
    tick = progress(len(manifests)) if progress is not None else None

    def event_of(item: tuple[str, float]) -> Event:
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
            return Event(run=run, step=step, save=save, event="invalid", at=modified, detail=detail)
        counts = classes.get(f"{run}/{sdir}")
        # Ties go to the alphabetically first class so a rebuild is deterministic.
        cls = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else "STANDARD"
        detail = json.dumps({"source": "rebuild_from_manifests", "manifest": key, "metrics": m.metrics})
        return Event(
            run=m.run, step=m.step, save=m.save, event="verified", at=m.uploaded_at, format=m.format,
            bytes=m.total_bytes, files=len(m.files), storage_class=cls, created_at=m.created_at,
            detail=detail, stored_bytes=0 if m.stored_bytes == m.total_bytes else m.stored_bytes,
        )  # fmt: skip

    # Each GET is mostly a round trip: fetched concurrently, in listing order for a deterministic result.
    # Each manifest becomes its event as it arrives, so only the events are held, never every body.
    with ThreadPoolExecutor(max_workers=_MANIFEST_READERS) as pool:
        return list(pool.map(event_of, manifests))
