"""Carrying out a tiering plan: transitions, expiry and server-side lifecycle rules (local eviction:
`eviction`).

Each function is one step a task wraps, and each is safe to rerun after a crash: a transition that
finds an object already in its target class skips it; an expiry deletes the manifest first, so the
checkpoint stops existing for every reader in one request, and a rerun finishes deleting its data;
an eviction deletes the local copy only when, re-checked just before, every file still matches (size,
mtime) the manifest entry that was verified and the store still holds every object (size, CRC32C
where the store reports it); anything else skips that checkpoint and says why. Server mode tags
objects for the bucket lifecycle and says when the move takes effect; whether it happened is only ever
taken from a listing (`observe_scheduled`), so a rerun tags again and observes again.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptvault.catalog import CheckpointState, Event, events
from ckptvault.checkpoint.manifest import (
    BLOCKS_NAME,
    MANIFEST_NAME,
    VALIDATION_NAME,
    Manifest,
    checkpoint_prefix,
    safe_relpath,
)
from ckptvault.errors import CkptvaultError
from ckptvault.store import ObjectFrozenError, ObjectInfo, ObjectStore, StoreError, lifecycle
from ckptvault.tiering.policy import expiry_postponed

TIER_TAG = "ckptvault-tier"
MILESTONE_TAG = "ckptvault-milestone"
_DAY = 86400.0


class TieringError(CkptvaultError):
    """A plan step that could not be carried out; the message names the object or file."""


@dataclass(frozen=True)
class StepResult:
    run: str
    step: int
    kind: str
    objects: int
    bytes: int
    detail: str = ""


def transition(
    store: ObjectStore, prefix: str, manifest: Manifest, to_class: str, tier: str, milestone: bool
) -> StepResult:
    """CopyObject in place into `to_class` for every data object (the manifest stays in the hot class,
    so planning a restore never needs a thaw), then HEAD each to verify the class took."""
    base = checkpoint_prefix(prefix, manifest.run, manifest.step, manifest.save)
    moved = moved_bytes = 0
    wrong = []
    for f in manifest.files:
        key = base + safe_relpath(f.path)
        info = store.head(key)
        if info is None:
            raise TieringError(f"{key}: named by the manifest but missing from the store; run `ckptvault drill`")
        # read tags before the move: some servers (moto) refuse GetObjectTagging on archived objects
        tags = _tags_of(store, key, manifest)
        if info.storage_class != to_class:
            # the stored object moves as it is, compressed or not: a server-side copy, never decoded
            store.copy_storage_class(key, to_class, f.stored_bytes)
            moved += 1
            moved_bytes += f.stored_bytes
        tags[TIER_TAG] = tier
        if milestone:
            tags[MILESTONE_TAG] = "true"
        store.put_tags(key, tags)
        after = store.head(key)
        if after is None or after.storage_class != to_class or after.size != f.stored_bytes:
            wrong.append(key)
    if wrong:
        raise TieringError(f"{len(wrong)} objects did not reach {to_class} intact: {', '.join(wrong[:5])}")
    return StepResult(manifest.run, manifest.step, "transition", moved, moved_bytes, f"-> {to_class}")


def _tags_of(store: ObjectStore, key: str, manifest: Manifest) -> dict[str, str]:
    """The object's tags; for an archived object some servers refuse to say (moto), so rebuild the
    ones ingest set from the manifest rather than lose them."""
    try:
        return store.get_tags(key)
    except ObjectFrozenError:
        return {"run": manifest.run, "step": str(manifest.step), "format": manifest.format}


def lock_holds(info: ObjectInfo, now: float) -> str:
    """Why an object may not be deleted yet ("" if it may): its Object Lock retention or legal hold, in
    the plan's words (policy.expiry_postponed), with the mode the HEAD reports."""
    r = info.retention
    return expiry_postponed(r.until_ts if r else None, info.legal_hold, now, r.mode if r else None)


def expire(store: ObjectStore, prefix: str, run: str, step: int, save: int = 1) -> StepResult:
    """Manifest first (the checkpoint ceases to exist at once), then every remaining object under it.
    A save whose manifest is locked (Object Lock retention or a legal hold) is not touched: its expiry
    is postponed, kind "postponed" with the date in `detail` (on a versioned bucket a delete would
    only hide the locked versions behind delete markers, and the save would vanish for every reader)."""
    base = checkpoint_prefix(prefix, run, step, save)
    head = store.head(base + MANIFEST_NAME)
    if head is not None and (held := lock_holds(head, time.time())):
        return StepResult(run, step, "postponed", 0, 0, held)
    if head is not None:
        store.delete(base + MANIFEST_NAME)
    n = total = 0
    for obj in store.list(base):
        store.delete(obj.key)
        n += 1
        total += obj.size
    return StepResult(run, step, "expire", n, total)


def tier_rule(prefix: str, classes: Mapping[str, str], tier: str) -> dict[str, Any]:
    """The lifecycle rule that moves objects tagged `ckptvault-tier=<tier>` under `prefix` to its class."""
    return {
        "ID": lifecycle.rule_id(f"tier-{tier}", prefix),
        "Status": "Enabled",
        "Filter": {
            "And": {
                "Prefix": prefix.strip("/") + "/" if prefix else "",
                "Tags": [{"Key": TIER_TAG, "Value": tier}],
            }
        },
        "Transitions": [{"Days": _min_days(classes[tier]), "StorageClass": classes[tier]}],
    }


def lifecycle_rules(prefix: str, classes: Mapping[str, str], tiers: Sequence[str]) -> list[dict[str, Any]]:
    """Server mode: one rule per tier that moves objects tagged `ckptvault-tier=<tier>` to its class.

    The plan tags objects when they are due, so the rule only needs the smallest age S3 allows for the
    class (1 day; 30 for the infrequent-access classes, which a checkpoint due for them may not have
    reached yet: `takes_effect` says when). Expiry is never left to the server: the manifest must go
    first, which a lifecycle rule cannot promise.
    """
    return [tier_rule(prefix, classes, tier) for tier in tiers if tier in classes]


def _min_days(storage_class: str) -> int:
    """AWS refuses a lifecycle transition into an infrequent-access class before 30 days."""
    return 30 if storage_class in ("STANDARD_IA", "ONEZONE_IA") else 1


def takes_effect(created: float, days: int, tagged: float) -> float:
    """When a lifecycle transition of `days` applies to an object created at `created` and tagged for
    it at `tagged` (unix s), as S3 computes it: creation time plus the days, rounded up to the next
    midnight UTC; S3 evaluates rules once a day at midnight UTC, so a tag that arrives after that date
    counts from the first midnight after it. The engine then moves the object asynchronously, usually
    within a day or two of this date (Ceph: at its next lifecycle work window)."""
    due = max(created + days * _DAY, tagged)
    return math.ceil(due / _DAY) * _DAY


@dataclass(frozen=True)
class Scheduled:
    """A transition left to the bucket lifecycle: the objects are tagged, the rule moves them later."""

    run: str
    step: int
    save: int
    rule: str  # lifecycle rule ID
    to_class: str
    takes_effect: float  # unix s, see `takes_effect`
    objects: int
    bytes: int

    def event(self, manifest: Manifest, reason: str, flow_run: str = "") -> Event:
        """The catalog's `transition_scheduled` event of `manifest`'s checkpoint, tagged for `reason`."""
        return events.transition_scheduled(manifest, self.rule, self.to_class, self.takes_effect, reason, flow_run)


def tag_for_server(
    store: ObjectStore,
    prefix: str,
    manifest: Manifest,
    tier: str,
    milestone: bool,
    rule: Mapping[str, Any],
    now: float | None = None,
) -> Scheduled:
    """Server mode: tag every data object with its due tier; the bucket's lifecycle `rule` moves it,
    from the date it computes from the objects' age (one LIST: the newest object sets the date, since
    the checkpoint is in its new class only once every object is)."""
    base = checkpoint_prefix(prefix, manifest.run, manifest.step, manifest.save)
    listed = {info.key: info for info in store.list(base)}
    keys = [base + safe_relpath(f.path) for f in manifest.files]
    missing = [k for k in keys if k not in listed]
    if missing:
        raise TieringError(
            f"{len(missing)} objects named by the manifest are missing from the store, not tagged: "
            f"{', '.join(missing[:5])}; run `ckptvault drill`"
        )
    for key in keys:
        tags = _tags_of(store, key, manifest)
        tags[TIER_TAG] = tier
        if milestone:
            tags[MILESTONE_TAG] = "true"
        store.put_tags(key, tags)
    (transition,) = rule["Transitions"]
    newest = max((listed[k].last_modified for k in keys), default=manifest.uploaded_at)
    when = takes_effect(newest, int(transition["Days"]), time.time() if now is None else now)
    return Scheduled(
        manifest.run,
        manifest.step,
        manifest.save,
        str(rule["ID"]),
        str(transition["StorageClass"]),
        when,
        len(keys),
        manifest.total_bytes,
    )


def class_counts(objects: Iterable[ObjectInfo], base: str) -> Counter[str]:
    """Data objects per storage class under a checkpoint's prefix; the manifest and validation report
    always stay in the hot class, so they say nothing about where the checkpoint is."""
    counts: Counter[str] = Counter()
    for o in objects:
        if o.key[len(base) :] not in (MANIFEST_NAME, VALIDATION_NAME, BLOCKS_NAME):
            counts[o.storage_class] += 1
    return counts


def majority_class(counts: Mapping[str, int]) -> str | None:
    """The class most data objects are in (ties: alphabetically first, so the answer is stable)."""
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0] if counts else None


@dataclass(frozen=True)
class Observation:
    """Where a checkpoint with a scheduled transition was found: its data objects per class."""

    run: str
    step: int
    save: int
    scheduled_class: str
    classes: dict[str, int]

    @property
    def majority(self) -> str | None:
        return majority_class(self.classes)

    def event(self, flow_run: str = "") -> Event:
        """The catalog's `transitioned` event of a move the lifecycle engine made (server mode)."""
        return events.transition_observed(self.run, self.step, self.save, self.scheduled_class, self.classes,
                                          flow_run)  # fmt: skip

    @property
    def arrived(self) -> bool:
        """The lifecycle engine has moved it: most data objects are in the scheduled class."""
        return self.majority == self.scheduled_class


def observe_scheduled(store: ObjectStore, prefix: str, states: Iterable[CheckpointState]) -> list[Observation]:
    """One LIST per checkpoint whose transition is scheduled: has the lifecycle engine moved it yet?
    All of them, not only those past their date: engines run on their own clock (Ceph's
    rgw_lc_debug_interval, a server whose days are not ours), and a LIST costs next to nothing."""
    out = []
    for s in states:
        if not s.scheduled_class or s.expired:
            continue
        base = checkpoint_prefix(prefix, s.run, s.step, s.save)
        counts = class_counts(store.list(base), base)
        out.append(Observation(s.run, s.step, s.save, s.scheduled_class, dict(counts)))
    return out


def install_lifecycle(store: ObjectStore, rules: Sequence[dict[str, Any]], managed: bool = True) -> int:
    """Merge our rules into the bucket's lifecycle configuration; rules of others (other prefixes'
    included) are kept, and a rule an older version wrote for this prefix under the plain ID is
    replaced. `managed` False (`[store] lifecycle = "external"`): write nothing, only check that a rule
    of each ID is there (Terraform's may move later than ours: S3 wants 30 days before STANDARD_IA), and
    raise TieringError naming the missing ones: objects tagged for a rule nobody installed never move."""
    try:
        have = store.get_lifecycle()
    except StoreError as e:
        raise TieringError(f"cannot read the bucket lifecycle configuration: {e}") from None
    if not managed:
        ids = {r.get("ID") for r in have}
        if missing := [r["ID"] for r in rules if r["ID"] not in ids]:
            raise TieringError(
                f'the bucket\'s lifecycle has no rule {", ".join(missing)}, and [store] lifecycle = "external" '
                "leaves it to Terraform: apply infra/terraform with enable_tier_lifecycle = true (and the tiers "
                'in tier_transitions), or set [policy] apply_mode = "client"'
            )
        return 0
    existing = [r for r in have if not any(lifecycle.replaced_by(r, want) for want in rules)]
    store.put_lifecycle([*existing, *rules])
    store.ensure_abort_incomplete_mpu_rule(1)
    return len(rules)
