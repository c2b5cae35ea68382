"""`ckptvault blocks backfill`: give committed saves the `_BLOCKS.json` sidecar they were committed
without (docs/FORMAT.md, "Block checksums"). Each big uncompressed object is read in order, in ranged
GETs of BACKFILL_CHUNK (memory: one chunk, never the object), its block CRCs computed as the bytes
arrive, and the list kept only if it combines to the manifest's CRC32C: a damaged object gets no
blocks (and is reported; scrub reports it too). The sidecar is written with the save's lock as its
manifest holds it now (its retention, raised by any milestone extension since the commit, and its
legal hold), never over one that already verifies. A maintenance job of the stored copies, so it
lives beside scrub and repair.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ckptvault.catalog import CheckpointState
from ckptvault.checkpoint.blocks import parse_sidecar, sidecar_json, verified
from ckptvault.checkpoint.manifest import BLOCKS_NAME, CODEC_NONE, MANIFEST_NAME, Manifest, checkpoint_prefix
from ckptvault.checksum import BLOCK_SIZE, BlockCrcs, combine_blocks, join_pieces, to_b64, wants_blocks
from ckptvault.store import ObjectFrozenError, ObjectStore, StoreError
from ckptvault.store.manifest_load import load_manifest

# Eight blocks per GET: whole blocks each, and no more memory than an upload part.
BACKFILL_CHUNK = 8 * BLOCK_SIZE

Outcome = Literal["written", "present", "none needed", "failed"]


@dataclass(frozen=True)
class Backfilled:
    """What the backfill did for one save."""

    run: str
    step: int
    save: int
    outcome: Outcome  # written; present: its sidecar already verifies; none needed: no file over 8 MiB stored as it is
    files: int = 0  # files whose blocks the sidecar holds
    bytes_read: int = 0
    detail: str = ""  # why it failed

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "step": self.step, "save": self.save, "outcome": self.outcome,
                "files": self.files, "bytes_read": self.bytes_read, "detail": self.detail}  # fmt: skip


def object_blocks(store: ObjectStore, key: str, size: int) -> tuple[int, ...]:
    """The block CRC32Cs of the object's bytes, read in order in chunks of whole blocks."""
    acc = BlockCrcs()
    for offset in range(0, size, BACKFILL_CHUNK):
        acc.update(store.read_range(key, offset, min(BACKFILL_CHUNK, size - offset), size=size))
    return join_pieces(acc.cut())


def backfill_save(store: ObjectStore, prefix: str, manifest: Manifest) -> Backfilled:
    """Write the save's sidecar where it has none that verifies; see the module's docstring."""
    m = manifest
    base = checkpoint_prefix(prefix, m.run, m.step, m.save)
    key = base + BLOCKS_NAME
    wanted = [f for f in m.files if f.codec == CODEC_NONE and wants_blocks(f.size)]
    if not wanted or any(f.path == BLOCKS_NAME for f in m.files):
        return Backfilled(m.run, m.step, m.save, "none needed")
    have = parse_sidecar(store.get_bytes(key), m, key)[0] if store.head(key) is not None else {}
    if set(have) == {f.path for f in wanted}:
        return Backfilled(m.run, m.step, m.save, "present", len(have))
    files: dict[str, tuple[int, ...]] = {p: fb.crcs for p, fb in have.items()}
    read = 0
    problems = []
    for f in wanted:
        if f.path in files:
            continue
        try:
            crcs = object_blocks(store, base + f.path, f.size)
        except ObjectFrozenError:
            problems.append(f"{f.path} is archived: thaw the save first (ckptvault restore thaws it)")
            continue
        except StoreError as e:
            problems.append(f"{f.path}: {e}")
            continue
        read += f.size
        if verified(f, crcs) is None:
            got = to_b64(combine_blocks(crcs, f.size))
            problems.append(
                f"{f.path}: its stored bytes' CRC32C is {got}, the manifest says {f.crc32c}: the object is damaged "
                "(ckptvault scrub --repair rewrites it from a good copy); no blocks written for this save"
            )
            continue
        files[f.path] = crcs
    if problems:
        return Backfilled(m.run, m.step, m.save, "failed", 0, read, "; ".join(problems))
    # the save's lock as it stands: the manifest is raised last by every extension and held with the rest,
    # so the sidecar neither outlives the save's protection nor shows as lock drift in a drill
    head = store.head(base + MANIFEST_NAME)
    retention = head.retention if head is not None else None
    live = retention is not None and retention.until_ts > time.time()
    writer = store.with_retention(retention) if live else store
    writer.put_bytes(key, sidecar_json(files), content_type="application/json")
    if head is not None and head.legal_hold:
        store.put_legal_hold(key, True)
    return Backfilled(m.run, m.step, m.save, "written", len(files), read)


def backfill(
    store: ObjectStore, prefix: str, states: Iterable[CheckpointState], *, run: str | None = None,
    step: int | None = None,
) -> list[Backfilled]:  # fmt: skip
    """Every committed, unexpired save of the catalog's `states` (only `run`, only `step` where given)."""
    out = []
    for s in sorted(states, key=lambda s: (s.run, s.step, s.save)):
        if not s.verified or s.expired or (run is not None and s.run != run) or (step is not None and s.step != step):
            continue
        try:
            manifest = load_manifest(store, prefix, s.run, s.step, s.save)
        except (StoreError, ValueError) as e:
            out.append(Backfilled(s.run, s.step, s.save, "failed", detail=f"its manifest: {e}"))
            continue
        out.append(backfill_save(store, prefix, manifest))
    return out
