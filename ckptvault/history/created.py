"""Whether each key written after TIME verifies (`ckptvault recover --since`): a recovery keeps every key
written since, because a leaked ckptvault key writes exactly what ckptvault writes, so the operator is
told which of them hold up and which do not.

A new save verifies when its manifest parses and every object it lists is there with the manifest's
size and, where the store keeps one (the server's checksum, a single PUT's metadata, ckptvault's tag on a
multipart object), the manifest's CRC32C: HEADs only, so a recovery does not read new saves whole (`ckptvault
scrub` does). The store's kept CRC32C could be forged by a writer with the key; a save that verifies here
and fails scrub's read is someone's. A new object of a save is judged with its save's manifest; a catalog
or state object has nothing to be checked against (`catalog rebuild --as-of` ignores the catalog's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptvault.checkpoint.manifest import MANIFEST_NAME, Manifest
from ckptvault.errors import CkptvaultError
from ckptvault.history.recovery import KeyRole, key_role, save_dir_of
from ckptvault.history.versions import Change
from ckptvault.store import ObjectStore
from ckptvault.store.stored_crc import kept_crc32c


@dataclass(frozen=True)
class NewKey:
    key: str
    role: KeyRole
    verifies: bool | None  # None: nothing to check it against
    why: str


def check_save(store: ObjectStore, manifest_key: str) -> tuple[bool, str]:
    """Whether the save whose manifest is `manifest_key` verifies by HEADs, and why not."""
    try:
        manifest = Manifest.from_json(store.get_bytes(manifest_key), origin=manifest_key)
    except CkptvaultError as e:
        return False, f"its manifest does not read: {e}"
    base = manifest_key[: -len(MANIFEST_NAME)]
    for f in manifest.files:
        size, crc = f.stored_expected
        head = store.head(base + f.path)
        if head is None:
            return False, f"{f.path} is missing"
        if head.size != size:
            return False, f"{f.path} is {head.size} bytes, its manifest says {size}"
        kept = kept_crc32c(store, head)
        if crc is not None and kept is not None and kept != crc:
            return False, f"{f.path}: the store's CRC32C {kept} is not the manifest's {crc}"
    return True, f"its {len(manifest.files)} objects have the manifest's sizes and CRC32C (HEADs; scrub reads them)"


def check_created(store: ObjectStore, created: Sequence[Change], prefix: str) -> list[NewKey]:
    """A verdict on each key `recover` found written since TIME and keeps."""
    saves: dict[str, tuple[bool, str]] = {}

    def save_verdict(save: str) -> tuple[bool, str] | None:
        if save not in saves:
            if store.head(save + MANIFEST_NAME) is None:
                return None
            saves[save] = check_save(store, save + MANIFEST_NAME)
        return saves[save]

    found = []
    for c in created:
        role = key_role(c.key, prefix)
        save = save_dir_of(c.key, prefix)
        if role in (KeyRole.MANIFEST, KeyRole.SAVE_OBJECT) and save is not None:
            verdict = save_verdict(save)
            if verdict is None:
                orphan = "no manifest lists it (an upload in flight, or not ckptvault's)"
                found.append(NewKey(c.key, role, False, orphan))
            else:
                ok, why = verdict
                said = why if role is KeyRole.MANIFEST else f"its save's manifest: {why}"
                found.append(NewKey(c.key, role, ok, said))
        else:
            why = {
                KeyRole.CATALOG: "a catalog object: `catalog rebuild --as-of` and `ls --as-of` ignore it",
                KeyRole.STATE: "the alert or metrics state: rewritten by the flows",
            }.get(role, "not a key of ckptvault's layout")
            found.append(NewKey(c.key, role, None, why))
    return found
