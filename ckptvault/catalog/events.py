"""Catalog events, one builder per thing that happens to a checkpoint: the flows record these.

Every wing records through here, so a builder takes plain values (run, step, counts, strings) or the
neutral records (a Manifest), never a wing's result type: this module imports no wing."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ckptvault.catalog.model import Event
from ckptvault.checkpoint.manifest import Manifest


def _detail(**fields: Any) -> str:
    return json.dumps(fields)


def _stored(manifest: Manifest) -> int:
    """The catalog's `stored_bytes`: 0 when it is the checkpoint's size, so uncompressed checkpoints
    write exactly the rows they did before (docs/FORMAT.md, "The catalog")."""
    stored = manifest.stored_bytes
    return 0 if stored == manifest.total_bytes else stored


def parts(manifest: Manifest) -> dict[str, int] | None:
    """`{"model": BYTES, "optimizer": BYTES}` of a save: the original sizes of the files its layout
    classes as each (the split `restore --only` makes), from the manifest's paths alone; None when a
    file holds both, so the layout cannot tell (docs/FORMAT.md, "The model and the optimizer of a save")."""
    # here, not at the module's top: the layouts' modules are not on a restore's path (test_restore_imports)
    from ckptvault.formats.parts import Part, classify

    out = {Part.MODEL.value: 0, Part.OPTIMIZER.value: 0}
    for f, c in zip(manifest.files, classify(manifest.format, [f.path for f in manifest.files]), strict=True):
        if c.part is Part.MIXED:
            return None
        out[c.part.value] += f.size
    return out


def verified(
    manifest: Manifest,
    flow_run: str = "",
    storage_class: str = "STANDARD",
    locked_until: float | None = None,
    committed_at: float | None = None,
    upload_started_at: float | None = None,
    split: dict[str, int] | None = None,
) -> Event:
    """`committed_at`: when the checkpoint was committed on the hot tier (its commit marker's mtime, or
    its newest file's); the detail's `rpo_seconds` is from then to the manifest's commit (docs/FORMAT.md,
    "The catalog"). Absent when unknown (a rebuild from manifests). `upload_started_at`: when this pass
    began sending the save's files; `upload_seconds` is from then to the manifest's commit, absent when
    this pass sent nothing (it only recorded a commit) or the manifest is another writer's, older than
    this pass's start. `parts`: the save's model and optimizer bytes, where its layout tells them from the
    manifest's paths, else `split` (a torch DCP save's, read at ingest from its local `.metadata`).
    `written_by`: the manifest's (what the checkpoint records of what wrote it), where it has one."""
    extra: dict[str, object] = {} if locked_until is None else {"locked_until": locked_until}
    if committed_at is not None:
        extra["rpo_seconds"] = round(manifest.uploaded_at - committed_at, 3)
    if upload_started_at is not None and manifest.uploaded_at >= upload_started_at:
        extra["upload_seconds"] = round(manifest.uploaded_at - upload_started_at, 3)
    split = parts(manifest) or split
    if split is not None:
        extra["parts"] = split
    if manifest.written_by:
        extra["written_by"] = dict(sorted(manifest.written_by.items()))
    return Event(
        run=manifest.run,
        step=manifest.step,
        event="verified",
        at=time.time(),
        format=manifest.format,
        bytes=manifest.total_bytes,
        stored_bytes=_stored(manifest),
        files=len(manifest.files),
        storage_class=storage_class,
        created_at=manifest.created_at,
        # the fingerprint lets the next ingest tell "unchanged" from "saved again" without a GET
        detail=_detail(
            metrics=manifest.metrics, uploaded_at=manifest.uploaded_at, fingerprint=manifest.fingerprint, **extra
        ),
        flow_run=flow_run,
        save=manifest.save,
    )


def superseded(run: str, step: int, save: int, reason: str, by_step: int, by_save: int, flow_run: str = "") -> Event:
    """A later save of the step, or a restart before it, replaced this save; its objects stay."""
    return Event(run=run, step=step, save=save, event="superseded", at=time.time(),
                 detail=_detail(reason=reason, by_step=by_step, by_save=by_save), flow_run=flow_run)  # fmt: skip


def rejected(
    run: str,
    step: int,
    fmt: str,
    nbytes: int,
    files: int,
    newest_mtime: float,
    problems: Sequence[str],
    flow_run: str = "",
    kind: str = "invalid",
    save: int = 1,
) -> Event:
    """`invalid` (quarantined: not uploaded) or `warned` (uploaded, flagged), with every reason, of the
    local checkpoint discovery found: `nbytes` in `files` files, the newest written at `newest_mtime`."""
    return Event(
        save=save,
        run=run,
        step=step,
        event=kind,
        at=time.time(),
        format=fmt,
        bytes=nbytes,
        files=files,
        created_at=newest_mtime,
        detail=_detail(reasons=list(problems)),
        flow_run=flow_run,
    )


def accepted(run: str, step: int, fmt: str, who: str, why: str, save: int = 1) -> Event:
    return Event(run=run, step=step, save=save, event="accepted", at=time.time(), format=fmt,
                 detail=_detail(who=who, why=why))  # fmt: skip


def held(run: str, step: int, save: int, fmt: str, who: str, why: str, objects: int, on: bool = True) -> Event:
    """A legal hold set (`held`) or cleared (`released`) on every object of a save, by whom and why."""
    return Event(run=run, step=step, save=save, event="held" if on else "released", at=time.time(), format=fmt,
                 detail=_detail(who=who, why=why, objects=objects))  # fmt: skip


def locked(
    run: str, step: int, save: int, until: float, mode: str, days: int, objects: int, flow_run: str = ""
) -> Event:
    """The tier flow extended the Object Lock of every object of a milestone save to `until` (unix s)."""
    return Event(run=run, step=step, save=save, event="locked", at=time.time(), flow_run=flow_run,
                 detail=_detail(locked_until=until, mode=mode, days=days, objects=objects))  # fmt: skip


def expired(run: str, step: int, reason: str, objects: int, flow_run: str = "", save: int = 1) -> Event:
    return Event(run=run, step=step, save=save, event="expired", at=time.time(),
                 detail=_detail(reason=reason, objects=objects), flow_run=flow_run)  # fmt: skip


def evicted_local(run: str, step: int, reason: str, path: str, flow_run: str = "", save: int = 1) -> Event:
    return Event(run=run, step=step, save=save, event="evicted_local", at=time.time(),
                 detail=_detail(reason=reason, path=path), flow_run=flow_run)  # fmt: skip


# A daily tier run re-records a skipped eviction until it is resolved: keep each event small even when a
# whole sharded checkpoint was rewritten. The counts say how many were left out.
MAX_EVENT_FILES = 100


def evict_skipped(
    run: str,
    step: int,
    save: int,
    reason: str,
    skipped: str,
    path: str,
    local: Sequence[object],
    store: Sequence[object],
    flow_run: str = "",
) -> Event:
    """The re-check before an eviction found the local copy at `path` or the store differing from the
    manifest: nothing was deleted. `reason` is the plan's (why it was due); `skipped` says why it was not
    done; `local` and `store` are the differences found (each recorded as its str)."""
    return Event(
        run=run,
        step=step,
        save=save,
        event="evict_skipped",
        at=time.time(),
        detail=_detail(
            reason=reason,
            skipped=skipped,
            path=path,
            local=[str(m) for m in local[:MAX_EVENT_FILES]],
            store=[str(m) for m in store[:MAX_EVENT_FILES]],
            local_count=len(local),
            store_count=len(store),
        ),
        flow_run=flow_run,
    )


def transitioned(manifest: Manifest, to_class: str, reason: str, mode: str, flow_run: str = "") -> Event:
    """A client-side copy that was HEAD-verified in `to_class`: the class is what the store says now."""
    return Event(
        run=manifest.run,
        step=manifest.step,
        save=manifest.save,
        event="transitioned",
        at=time.time(),
        storage_class=to_class,
        bytes=manifest.total_bytes,
        stored_bytes=_stored(manifest),
        files=len(manifest.files),
        detail=_detail(reason=reason, mode=mode),
        flow_run=flow_run,
    )


def transition_scheduled(
    manifest: Manifest, rule: str, to_class: str, takes_effect: float, reason: str, flow_run: str = ""
) -> Event:
    """Server mode: the objects are tagged and lifecycle rule `rule` will move them from `takes_effect` on.
    No storage class here: the catalog keeps the one the objects are in until a listing shows the move."""
    return Event(
        run=manifest.run,
        step=manifest.step,
        save=manifest.save,
        event="transition_scheduled",
        at=time.time(),
        bytes=manifest.total_bytes,
        stored_bytes=_stored(manifest),
        files=len(manifest.files),
        detail=_detail(reason=reason, mode="server", rule=rule, to_class=to_class, takes_effect=takes_effect),
        flow_run=flow_run,
    )


def transition_observed(
    run: str, step: int, save: int, scheduled_class: str, classes: dict[str, int], flow_run: str = ""
) -> Event:
    """The listing shows the lifecycle engine moved a scheduled checkpoint (`classes`: its data objects
    per class): now the class changes. The event's time is when it was seen, at most one tier run after
    the move, so minimum-duration charges counted from it are overstated by that much, never understated."""
    n, total = classes.get(scheduled_class, 0), sum(classes.values())
    return Event(
        run=run,
        step=step,
        save=save,
        event="transitioned",
        at=time.time(),
        storage_class=scheduled_class,
        detail=_detail(
            reason=f"observed: {n} of {total} data objects in {scheduled_class}",
            mode="server",
            observed=classes,
        ),
        flow_run=flow_run,
    )


def drilled(run: str, step: int, save: int, ok: bool, detail: str, flow_run: str = "") -> Event:
    """`detail`: the drill result's own JSON (ckptvault/restore/drill.py, DrillResult.detail)."""
    return Event(run=run, step=step, save=save, event="drilled", at=time.time(), ok=ok, detail=detail,
                 flow_run=flow_run)  # fmt: skip


def restore_requested(
    run: str, step: int, tier: str, requests: Mapping[str, int], flow_run: str = "", save: int = 1
) -> Event:
    return Event(run=run, step=step, save=save, event="restore_requested", at=time.time(),
                 detail=_detail(tier=tier, requests=dict(requests)), flow_run=flow_run)  # fmt: skip


def restored(
    manifest: Manifest, dest: str, flow_run: str = "", seconds: float = 0.0, *, store: str | None = None,
    fallbacks: int = 0, partial: Mapping[str, Any] | None = None,
) -> Event:  # fmt: skip
    """`seconds` the download took: the catalog's measure of this store's restore throughput. `store`: the
    copy read first when it was not the primary (a replica's name), `fallbacks`: files read from another
    copy than that one (docs/FORMAT.md, "Replicas"); neither is in the detail when unset. `partial`: a
    partial restore's `only`, `exclude`, `files` and `bytes` (docs/FORMAT.md, "Catalog events"): the
    event's own bytes and files stay the whole save's (the catalog's record of the save), the detail's
    bytes and rate are the part's."""
    moved = int(partial["bytes"]) if partial is not None else manifest.total_bytes
    mib_s = moved / 2**20 / seconds if seconds > 0 else 0.0
    extra: dict[str, object] = {}
    if partial is not None:
        extra["partial"] = dict(partial)
    if store is not None:
        extra["store"] = store
    if fallbacks:
        extra["fallbacks"] = fallbacks
    return Event(
        run=manifest.run,
        step=manifest.step,
        save=manifest.save,
        event="restored",
        at=time.time(),
        format=manifest.format,
        bytes=manifest.total_bytes,
        stored_bytes=_stored(manifest),
        files=len(manifest.files),
        detail=_detail(dest=dest, seconds=round(seconds, 3), bytes=moved, mib_per_s=round(mib_s, 1), **extra),
        flow_run=flow_run,
    )


def replicated(
    run: str,
    step: int,
    save: int,
    *,
    store: str,
    key: str,
    nbytes: int,
    seconds: float,
    storage_class: str,
    retain_until: float | None = None,
    hot_bytes: int = 0,
    flow_run: str = "",
) -> Event:
    """A save committed on a replica (docs/FORMAT.md, "Replicas"). Everything is in `detail`: the
    event's own `bytes` and `storage_class` columns stay empty, because the fold takes a save's size
    and class from the last event that fills them, and those are the primary's."""
    # the replica's lock date as `retain_until`: a detail naming `locked_until` would be taken by the
    # fold as the primary's
    lock = {} if retain_until is None else {"retain_until": retain_until}
    detail = _detail(store=store, key=key, bytes=nbytes, hot_bytes=hot_bytes, seconds=round(seconds, 3),
                     storage_class=storage_class, **lock)  # fmt: skip
    return Event(run=run, step=step, save=save, event="replicated", at=time.time(), detail=detail,
                 flow_run=flow_run)  # fmt: skip


def scrubbed(
    run: str,
    step: int,
    save: int,
    *,
    store: str,
    ok: bool,
    objects: int,
    read: int,
    size_only: int,
    found: int,
    repaired: int,
    problems: Sequence[str],
    flow_run: str = "",
) -> Event:
    """`ckptvault scrub` checked every object of a save on one copy (docs/FORMAT.md, "Scrub and repair"):
    `ok` nothing is wrong there now; `problems` what is left (the first MAX_SCRUB_PROBLEMS)."""
    detail = _detail(
        store=store, ok=ok, objects=objects, read=read, size_only=size_only, found=found, repaired=repaired,
        problems=list(problems)[:MAX_SCRUB_PROBLEMS],
    )  # fmt: skip
    return Event(run=run, step=step, save=save, event="scrubbed", at=time.time(), ok=ok, detail=detail,
                 flow_run=flow_run)  # fmt: skip


# A save with a thousand shards all missing on a lost replica says so in its scrub's report; the event
# keeps the first few and the count (`found`).
MAX_SCRUB_PROBLEMS = 20


def repaired(
    run: str, step: int, save: int, *, store: str, path: str, source: str, why: str, nbytes: int, flow_run: str = ""
) -> Event:
    """`scrub --repair` rewrote one object of a save on copy `store` from copy `source`."""
    detail = _detail(store=store, path=path, **{"from": source}, why=why, bytes=nbytes)
    return Event(run=run, step=step, save=save, event="repaired", at=time.time(), detail=detail,
                 flow_run=flow_run)  # fmt: skip
