"""The CRC32C of an object's stored bytes as the store knows it, for a rerun deciding whether an object
already there is the one it would send (ingest's and the replicate pass's step 3, docs/FORMAT.md)."""

from __future__ import annotations

from ckptvault.store.port import CRC_TAG, ObjectInfo, ObjectStore


def kept_crc32c(store: ObjectStore, head: ObjectInfo) -> str | None:
    """The CRC32C the store keeps of the object, without reading it: the server's own whole-object
    checksum first (it computed it from the bytes), the `crc32c` metadata of a single PUT, ckptvault's
    tag on a multipart object (set once the upload verified). None: it keeps none."""
    crc = head.server_crc32c or head.metadata.get("crc32c")
    if crc is None and head.parts:
        crc = store.get_tags(head.key).get(CRC_TAG)
    return crc


def stored_crc32c(store: ObjectStore, key: str) -> str | None:
    """Metadata (a single PUT) or the server's full-object checksum; on a multipart object where the
    server keeps none (Ceph RGW, moto), ckptvault's CRC_TAG, set after the upload verified; and where a
    pass was killed between the completion and that tag, the object read back (docs/object-lock.md, "A
    crash mid-upload"): sending it again would leave the killed version behind, billed on a versioned
    bucket and, under a default retention, undeletable. None: absent, or archived and never tagged."""
    head = store.head(key)
    if head is None:
        return None
    stored = head.crc32c
    if stored is None and head.parts:
        stored = store.get_tags(key).get(CRC_TAG)
        if stored is None and not head.frozen:
            stored = store.read_crc32c(key)
    return stored
