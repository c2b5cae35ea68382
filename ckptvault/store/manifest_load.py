"""A committed checkpoint's manifest read back from the store: ingest compares a local copy with it, the
tier and restore passes act on what it lists. Neither reads it any other way."""

from __future__ import annotations

from ckptvault.checkpoint.manifest import MANIFEST_NAME, Manifest, ManifestError, checkpoint_prefix
from ckptvault.store import ObjectStore


def load_manifest(store: ObjectStore, prefix: str, run: str, step: int, save: int = 1) -> Manifest:
    """ManifestError, saying the checkpoint cannot be restored, when it is not a readable manifest."""
    key = checkpoint_prefix(prefix, run, step, save) + MANIFEST_NAME
    try:
        return Manifest.from_json(store.get_bytes(key), key)
    except ManifestError as e:
        raise ManifestError(
            f"{e}. The checkpoint cannot be restored safely; run `ckptvault drill` to inspect it."
        ) from None
