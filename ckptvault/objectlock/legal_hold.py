"""Legal holds on a committed save (`ckptvault hold` / `release`): set or cleared on every object of
the save, its manifest included. While held, the store refuses to delete any of them whatever their
retention, and the tier flow never expires the save (ckptvault.tiering.apply.expire)."""

from __future__ import annotations

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.errors import CkptvaultError
from ckptvault.store import ObjectStore


class HoldError(CkptvaultError):
    """The save cannot be held or released: it is not committed, or the bucket has no Object Lock."""


def set_legal_hold(store: ObjectStore, prefix: str, run: str, step: int, save: int, on: bool) -> int:
    """Hold (on) or release every object under the save's prefix; returns how many. The manifest goes
    first on hold (the save is protected as a whole from its first request) and last on release."""
    base = checkpoint_prefix(prefix, run, step, save)
    manifest = base + MANIFEST_NAME
    if store.head(manifest) is None:
        raise HoldError(
            f"{run} step {step} save {save} has no manifest in {store.bucket}: it is not committed, so there is "
            f"nothing to {'hold' if on else 'release'}. See `ckptvault ls --run {run}`"
        )
    if not store.lock_status().enabled:
        raise HoldError(
            f"bucket {store.bucket} has no Object Lock, so it cannot hold anything. A legal hold needs a bucket "
            "created with Object Lock (docs/object-lock.md)"
        )
    others = [o.key for o in store.list(base) if o.key != manifest]
    keys = [manifest, *others] if on else [*others, manifest]
    for key in keys:
        store.put_legal_hold(key, on)
    return len(keys)
