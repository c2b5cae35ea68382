"""Block checksums (docs/FORMAT.md, "Block checksums"): the `_BLOCKS.json` sidecar of a save, a CRC32C
per 4 MiB block of each big uncompressed file, and the ranged read that checks every block it returns.

The manifest does not name the sidecar (a locked manifest cannot be rewritten, and older saves gain one
by a backfill), so nothing in it is trusted by itself: `load_blocks` keeps a file's list only where it
has one CRC per block and the CRCs combined in order give the manifest's whole-file `crc32c`. A bad
sidecar therefore costs whole-file reads, never a wrong byte.

No store import here (the store imports this package): the reads go through `BlockReads`, which every
`ObjectStore` is.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ckptvault.checkpoint.manifest import BLOCKS_NAME, CODEC_NONE, FileEntry, Manifest, checkpoint_prefix
from ckptvault.checksum import BLOCK_SIZE, combine_blocks, crc32c_update, from_b64, to_b64, wants_blocks
from ckptvault.errors import CkptvaultError

SCHEMA = "ckptvault.blocks/1"
log = logging.getLogger("ckptvault.checkpoint.blocks")


class BlockMismatchError(CkptvaultError):
    """A block read from the store does not have the CRC32C its save recorded: the stored object is damaged."""


class BlockReads(Protocol):
    """What reading blocks needs of a store: every ObjectStore has these (ckptvault/store/port.py)."""

    bucket: str

    def head(self, key: str) -> Any: ...

    def get_bytes(self, key: str) -> bytes: ...

    def read_range(self, key: str, offset: int, length: int, *, size: int) -> bytes: ...


def encode_crcs(crcs: Iterable[int]) -> str:
    """The sidecar's spelling of a file's block CRCs: base64 of their big-endian 4 bytes, concatenated."""
    return base64.b64encode(b"".join(c.to_bytes(4, "big") for c in crcs)).decode("ascii")


def decode_crcs(text: str) -> tuple[int, ...]:
    """Inverse of `encode_crcs`; ValueError when `text` is not base64 of a whole number of CRCs."""
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as e:
        raise ValueError(f"not base64: {e}") from None
    if len(raw) % 4:
        raise ValueError(f"{len(raw)} bytes is not a whole number of 4-byte CRCs")
    return tuple(int.from_bytes(raw[i : i + 4], "big") for i in range(0, len(raw), 4))


def sidecar_json(files: Mapping[str, Iterable[int]]) -> bytes:
    """The `_BLOCKS.json` of a save: `files` maps each manifest path to its block CRCs in order. Sorted
    keys, so the same blocks always give the same bytes (a rerun's conditional write sees its own)."""
    doc = {"schema": SCHEMA, "block_size": BLOCK_SIZE, "files": {p: encode_crcs(c) for p, c in files.items()}}
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def sidecar_of(entries: Iterable[FileEntry]) -> bytes | None:
    """The sidecar the ingest writes for these manifest entries (each carrying the blocks its upload
    computed), or None when no file has blocks, or a file of the checkpoint is itself named `_BLOCKS.json`."""
    entries = list(entries)
    if any(e.path == BLOCKS_NAME for e in entries):
        return None
    files = {e.path: e.blocks for e in entries if e.blocks and e.codec == CODEC_NONE and wants_blocks(e.size)}
    return sidecar_json(files) if files else None


@dataclass(frozen=True)
class FileBlocks:
    """One file's verified block CRC32Cs: block i is bytes [i * block_size, min(size, (i + 1) * block_size))."""

    path: str
    size: int
    block_size: int
    crcs: tuple[int, ...]

    def span(self, offset: int, length: int) -> tuple[int, int]:
        """The byte range [start, end) of the whole blocks around [offset, offset + length)."""
        if length < 1 or offset < 0 or offset + length > self.size:
            raise ValueError(f"{self.path}: range {offset}+{length} is empty or outside its {self.size} bytes")
        start = offset // self.block_size * self.block_size
        end = min(self.size, -(-(offset + length) // self.block_size) * self.block_size)
        return start, end

    def check(self, start: int, data: bytes | memoryview) -> None:
        """Check `data`, whole blocks read from byte `start` (a block boundary), against the recorded
        CRCs; BlockMismatchError naming the file, the block and its byte range at the first that differs."""
        if start % self.block_size:
            raise ValueError(f"{self.path}: {start} is not on a block boundary ({self.block_size} bytes)")
        view = memoryview(data)
        end = start + len(view)
        if end > self.size or (end != self.size and end % self.block_size):
            raise ValueError(f"{self.path}: bytes [{start}, {end}) are not whole blocks of its {self.size} bytes")
        for at in range(start, end, self.block_size):
            i = at // self.block_size
            stop = min(end, at + self.block_size)
            got = crc32c_update(view[at - start : stop - start])
            if got != self.crcs[i]:
                raise BlockMismatchError(
                    f"{self.path}: block {i} (bytes {at}-{stop - 1}) read with CRC32C {to_b64(got)}, its save "
                    f"recorded {to_b64(self.crcs[i])}: the stored object is damaged. Restore it from another "
                    "copy (ckptvault scrub --repair) or restore the file whole"
                )


def verified(entry: FileEntry, crcs: tuple[int, ...], block_size: int = BLOCK_SIZE) -> FileBlocks | None:
    """`crcs` as the blocks of the manifest's `entry`, or None when they cannot be trusted: not one per
    block, not combining to the entry's whole-file CRC32C, or a file not stored as it is."""
    if entry.codec != CODEC_NONE or entry.size == 0:
        return None
    if len(crcs) != -(-entry.size // block_size):
        return None
    if combine_blocks(crcs, entry.size, block_size) != from_b64(entry.crc32c):
        return None
    return FileBlocks(entry.path, entry.size, block_size, crcs)


def parse_sidecar(raw: bytes, manifest: Manifest, origin: str) -> tuple[dict[str, FileBlocks], list[str]]:
    """The verified block lists of a sidecar's bytes, and why each other one was left out."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return {}, [f"{origin}: not valid JSON ({e})"]
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("block_size") != BLOCK_SIZE:
        return {}, [f"{origin}: not a {SCHEMA} sidecar with block_size {BLOCK_SIZE}"]
    files = doc.get("files")
    if not isinstance(files, dict):
        return {}, [f"{origin}: no `files` object"]
    by_path = {e.path: e for e in manifest.files}
    out: dict[str, FileBlocks] = {}
    dropped: list[str] = []
    for path, text in files.items():
        entry = by_path.get(path)
        try:
            crcs = decode_crcs(text) if isinstance(text, str) else None
        except ValueError:
            crcs = None
        got = verified(entry, crcs) if entry is not None and crcs is not None else None
        if got is None:
            dropped.append(f"{origin}: the blocks of {path!r} do not verify against the manifest; read whole")
        else:
            out[path] = got
    return out, dropped


def load_blocks(store: BlockReads, manifest: Manifest, prefix: str = "") -> dict[str, FileBlocks]:
    """The verified block lists of a save's files, by manifest path: {} when the save has no sidecar (a
    save committed before them, or without a big uncompressed file). `prefix` is the store's `[store]
    prefix`. A list that does not verify is left out, with one warning per file."""
    key = checkpoint_prefix(prefix, manifest.run, manifest.step, manifest.save) + BLOCKS_NAME
    if any(f.path == BLOCKS_NAME for f in manifest.files) or store.head(key) is None:
        return {}
    out, dropped = parse_sidecar(store.get_bytes(key), manifest, f"{store.bucket}/{key}")
    for why in dropped:
        log.warning(why)
    return out


def fetch_verified_range(store: BlockReads, key: str, blocks: FileBlocks, offset: int, length: int) -> bytes:
    """Bytes [offset, offset + length) of the object `key` (the file `blocks` describes): the whole
    blocks around them in one ranged GET, each checked against its CRC32C (BlockMismatchError naming the
    file and block), then cut to exactly what was asked. Memory: the blocks read; keep ranges to parts."""
    start, end = blocks.span(offset, length)
    data = store.read_range(key, start, end - start, size=blocks.size)
    blocks.check(start, data)
    return data[offset - start : offset - start + length]
