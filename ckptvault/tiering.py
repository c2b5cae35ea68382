"""Carrying out a tiering plan: transitions, expiry, local eviction, and server-side lifecycle rules.

Each function is one step a task wraps, and each is safe to rerun after a crash: a transition that
finds an object already in its target class skips it; an expiry deletes the manifest first, so the
checkpoint stops existing for every reader in one request, and a rerun finishes deleting its data;
an eviction deletes a local file only when it still matches, byte count and mtime, the manifest
entry that was verified in the store.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptvault.manifest import MANIFEST_NAME, Manifest, checkpoint_prefix, safe_relpath
from ckptvault.store import ObjectFrozenError, ObjectStore, StoreError, lifecycle

TIER_TAG = "ckptvault-tier"
MILESTONE_TAG = "ckptvault-milestone"


class TieringError(Exception):
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
            store.copy_storage_class(key, to_class, f.size)
            moved += 1
            moved_bytes += f.size
        tags[TIER_TAG] = tier
        if milestone:
            tags[MILESTONE_TAG] = "true"
        store.put_tags(key, tags)
        after = store.head(key)
        if after is None or after.storage_class != to_class or after.size != f.size:
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


def expire(store: ObjectStore, prefix: str, run: str, step: int, save: int = 1) -> StepResult:
    """Manifest first (the checkpoint ceases to exist at once), then every remaining object under it."""
    base = checkpoint_prefix(prefix, run, step, save)
    if store.head(base + MANIFEST_NAME) is not None:
        store.delete(base + MANIFEST_NAME)
    n = total = 0
    for obj in store.list(base):
        store.delete(obj.key)
        n += 1
        total += obj.size
    return StepResult(run, step, "expire", n, total)


def evict_local(manifest: Manifest) -> StepResult:
    """Free the hot tier: delete the local copy only if every file still matches its verified entry.
    Anything that differs (rewritten, resized, replaced by a symlink) stops the eviction untouched."""
    root = Path(manifest.source)
    if manifest.single_file:
        targets = [(root, manifest.files[0])]
    else:
        targets = [(root / safe_relpath(f.path), f) for f in manifest.files]
    mismatches = []
    for path, entry in targets:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue  # already gone: an earlier eviction got this far
        if not path.is_file() or path.is_symlink() or st.st_size != entry.size or abs(st.st_mtime - entry.mtime) > 1e-3:
            mismatches.append(str(path))
    if mismatches:
        raise TieringError(
            f"{manifest.run} step {manifest.step}: local files differ from the verified copy, not evicted: "
            + ", ".join(mismatches[:5])
        )
    freed = 0
    for path, entry in targets:
        if path.exists():
            path.unlink()
            freed += entry.size
    if not manifest.single_file:
        _remove_empty_dirs(root)
    return StepResult(manifest.run, manifest.step, "evict_local", len(targets), freed, str(root))


def _remove_empty_dirs(root: Path) -> None:
    """Remove directories left empty, deepest first; anything not ours stays (rmdir fails on it)."""
    if not root.is_dir():
        return
    for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def lifecycle_rules(prefix: str, classes: Mapping[str, str], tiers: Sequence[str]) -> list[dict[str, Any]]:
    """Server mode: one rule per tier that moves objects tagged `ckptvault-tier=<tier>` to its class.

    The plan tags objects when they are due, so the rule only needs the smallest age (1 day: S3 counts
    from object creation, and a checkpoint due for a tier is older than that). Expiry is never left to
    the server: the manifest must go first, which a lifecycle rule cannot promise.
    """
    rules = []
    for tier in tiers:
        if tier not in classes:
            continue
        rules.append(
            {
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
        )
    return rules


def _min_days(storage_class: str) -> int:
    """AWS refuses a lifecycle transition into an infrequent-access class before 30 days."""
    return 30 if storage_class in ("STANDARD_IA", "ONEZONE_IA") else 1


def tag_for_server(store: ObjectStore, prefix: str, manifest: Manifest, tier: str, milestone: bool) -> StepResult:
    """Server mode: tag every data object with its due tier; the bucket's lifecycle rule moves it."""
    base = checkpoint_prefix(prefix, manifest.run, manifest.step, manifest.save)
    for f in manifest.files:
        key = base + safe_relpath(f.path)
        tags = _tags_of(store, key, manifest)
        tags[TIER_TAG] = tier
        if milestone:
            tags[MILESTONE_TAG] = "true"
        store.put_tags(key, tags)
    return StepResult(manifest.run, manifest.step, "tagged", len(manifest.files), manifest.total_bytes, tier)


def install_lifecycle(store: ObjectStore, rules: Sequence[dict[str, Any]]) -> int:
    """Merge our rules into the bucket's lifecycle configuration; rules of others (other prefixes'
    included) are kept, and a rule an older version wrote for this prefix under the plain ID is
    replaced."""
    try:
        existing = [have for have in store.get_lifecycle() if not any(lifecycle.replaced_by(have, r) for r in rules)]
    except StoreError as e:
        raise TieringError(f"cannot read the bucket lifecycle configuration: {e}") from None
    store.put_lifecycle([*existing, *rules])
    store.ensure_abort_incomplete_mpu_rule(1)
    return len(rules)
