"""The per-checkpoint manifest: the unit of truth, and the commit marker of a checkpoint in the store.

Object layout (docs/FORMAT.md): a checkpoint is (run, step, save). Save 1 of a step lives at
`<prefix>/<run>/step-<step:010d>/<relative path>` (the only layout before saves existed, so old
buckets read as they are); save K >= 2, a re-save of the same step after a restart, at
`<prefix>/<run>/step-<step:010d>.save-<K>/...`, a sibling prefix that never overlaps save 1's. The
manifest is `_MANIFEST.json` under the save's prefix, written last. A checkpoint without it does not exist.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptvault.errors import CkptvaultError

MANIFEST_NAME = "_MANIFEST.json"
VALIDATION_NAME = "_VALIDATION.json"
BLOCKS_NAME = "_BLOCKS.json"  # the block CRC32C sidecar (docs/FORMAT.md, "Block checksums"); no manifest names it
SCHEMA = "ckptvault.manifest/1"
STEP_WIDTH = 10
CODEC_NONE = "none"
KNOWN_CODECS = (CODEC_NONE, "shuffle-zstd")  # ckptvault.codec's; repeated so this module stays light


class ManifestError(CkptvaultError, ValueError):
    """A manifest that cannot be trusted: unreadable, wrong schema, or an unsafe path."""


FIRST_SAVE = 1
_SAVE_SEP = ".save-"


def step_dir(step: int, save: int = FIRST_SAVE) -> str:
    """`step-0000000300` for save 1; `step-0000000300.save-2` for a re-save of the same step."""
    base = f"step-{step:0{STEP_WIDTH}d}"
    return base if save == FIRST_SAVE else f"{base}{_SAVE_SEP}{save}"


def checkpoint_prefix(prefix: str, run: str, step: int, save: int = FIRST_SAVE) -> str:
    parts = [p for p in (prefix.strip("/"), run, step_dir(step, save)) if p]
    return "/".join(parts) + "/"


def parse_save_dir(name: str) -> tuple[int, int] | None:
    """(step, save) of a checkpoint directory name, or None when it is not one."""
    if not name.startswith("step-"):
        return None
    digits, sep, save = name[5:].partition(_SAVE_SEP)
    if not digits.isdigit():
        return None
    if not sep:
        return int(digits), FIRST_SAVE
    if not save.isdigit() or int(save) <= FIRST_SAVE or str(int(save)) != save:
        return None
    return int(digits), int(save)


def safe_relpath(path: str) -> str:
    """Reject absolute paths and anything that escapes the checkpoint root (restore writes these)."""
    if not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise ManifestError(f"unsafe path {path!r} in manifest: must be relative and use '/'")
    norm = posixpath.normpath(path)
    if norm != path or norm == "." or norm.startswith("../") or norm == "..":
        raise ManifestError(f"unsafe path {path!r} in manifest: escapes the checkpoint directory")
    if path in (MANIFEST_NAME, VALIDATION_NAME):
        raise ManifestError(f"path {path!r} in manifest collides with a ckptvault control file")
    return path


def fingerprint(files: Iterable[tuple[str, int, float]]) -> str:
    """A short digest of (path, size, mtime) for every file, order-free: equal exactly when a local
    checkpoint looks, to a stat, like the one a manifest describes (the cheap change test of ingest)."""
    h = hashlib.sha256()
    for path, size, mtime in sorted(files):
        h.update(f"{path}\0{size}\0{mtime!r}\n".encode())
    return h.hexdigest()[:32]


def _codec_fields(f: dict[str, Any], origin: str) -> dict[str, Any]:
    codec = str(f.get("codec", CODEC_NONE))
    if codec not in KNOWN_CODECS:
        raise ManifestError(
            f"{origin}: {f.get('path')!r} is stored with codec {codec!r}, which this version cannot decode "
            "(written by a newer ckptvault? upgrade it)"
        )
    if codec == CODEC_NONE:
        return {}
    frames = tuple((int(a), int(b), int(c), str(e)) for a, b, c, e in f["frames"])
    out = {"codec": codec, "typesize": int(f["typesize"]), "stored_size": int(f["stored_size"]), "frames": frames}
    # Compat: reads compressed entries from before `stored_crc32c` (FORMAT.md); may go: never
    if f.get("stored_crc32c") is not None:
        out["stored_crc32c"] = str(f["stored_crc32c"])
    return out


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, '/'-separated
    size: int
    mtime: float
    crc32c: str  # base64 of the big-endian CRC32C, as S3's x-amz-checksum-crc32c
    sha256: str | None = None
    mode: int | None = None  # permission bits (st_mode & 0o7777); absent in older manifests
    # How the object stores the file (docs/FORMAT.md, "Compressed files"). `size` and `crc32c` above
    # stay the original file's whatever the codec. Absent in the JSON when `none`, so a manifest of an
    # uncompressed checkpoint is byte for byte what versions before codecs wrote.
    codec: str = CODEC_NONE
    typesize: int | None = None
    stored_size: int | None = None
    # [stored offset, stored length, original length, crc32c of the original bytes] per frame; plain
    # tuples, not ckptvault.codec.Frame, so reading a manifest never imports the compression library
    frames: tuple[tuple[int, int, int, str], ...] = ()
    # CRC32C of the object's stored bytes, what a server's whole-object checksum is compared with
    # (the eviction re-check); None in compressed entries written before it was recorded
    stored_crc32c: str | None = None
    # The file's block CRC32Cs as its upload computed them (docs/FORMAT.md, "Block checksums"): carried
    # from the upload to the sidecar written before the manifest, never part of the manifest itself
    # (not in to_dict, not compared: a manifest read back equals the one written).
    blocks: tuple[int, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("blocks")
        if self.codec == CODEC_NONE:
            for k in ("codec", "typesize", "stored_size", "frames", "stored_crc32c"):
                d.pop(k)
        else:
            d["frames"] = [list(f) for f in self.frames]
            if self.stored_crc32c is None:
                d.pop("stored_crc32c")
        return d

    @property
    def stored_bytes(self) -> int:
        """What the object occupies in the store (the original size when it is stored as it is)."""
        return self.size if self.codec == CODEC_NONE or self.stored_size is None else self.stored_size

    @property
    def stored_expected(self) -> tuple[int, str | None]:
        """The size and CRC32C the object's stored bytes must have: the manifest's stored values for a
        compressed file (CRC None: an entry written before `stored_crc32c` was recorded), its own otherwise."""
        return (self.size, self.crc32c) if self.codec == CODEC_NONE else (self.stored_bytes, self.stored_crc32c)


@dataclass(frozen=True)
class NodePlacement:
    """Where a node-local checkpoint's files lived when it was ingested (its source's `nodes`,
    `node_pattern`, `ranks_per_node`): the record restore --node-local places them by."""

    nodes: int
    node_pattern: str
    ranks_per_node: int = 1


LOCK_MODES = ("GOVERNANCE", "COMPLIANCE")  # S3's; repeated so reading a manifest never imports the store


@dataclass(frozen=True)
class SaveLock:
    """The Object Lock retention a save's objects and its manifest were written with at the commit
    (docs/FORMAT.md, "The manifest": `lock`); only the first lock, since a locked manifest is never rewritten."""

    mode: str  # GOVERNANCE or COMPLIANCE
    retain_until: float  # unix seconds


@dataclass(frozen=True)
class Manifest:
    run: str
    step: int
    format: str
    files: tuple[FileEntry, ...]
    created_at: float  # the newest mtime among the files: when the checkpoint was written
    uploaded_at: float
    source: str  # where it came from on the hot tier
    single_file: bool = False  # lightning: the checkpoint is one file, not a directory
    tool_version: str = ""
    metrics: dict[str, float] = field(default_factory=dict)  # from trainer_state.json where present
    save: int = FIRST_SAVE  # which save of this step (a restart re-saves steps); absent in old manifests: 1
    placement: NodePlacement | None = None  # node-local sources only; absent in older manifests
    lock: SaveLock | None = None  # committed with [lock] on; absent when nothing was locked, and in older manifests
    # the versions the checkpoint itself records of what wrote it (docs/FORMAT.md, "What wrote a save"),
    # e.g. {"transformers": "4.57.1"}; absent when it records none, and in older manifests
    written_by: dict[str, str] = field(default_factory=dict)
    schema: str = SCHEMA

    @property
    def fingerprint(self) -> str:
        """What a local copy must still match to be this save: every path, size and mtime."""
        return fingerprint((f.path, f.size, f.mtime) for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def stored_bytes(self) -> int:
        """What the checkpoint's objects occupy in the store (total_bytes when none is compressed)."""
        return sum(f.stored_bytes for f in self.files)

    def to_json(self) -> bytes:
        d: dict[str, Any] = asdict(self)
        d["total_bytes"] = self.total_bytes
        d["files"] = [f.to_dict() for f in self.files]
        if self.placement is None:
            del d["placement"]  # every other checkpoint's manifest stays as it was
        if self.lock is None:
            del d["lock"]  # a save written without [lock] has the manifest it had before the key existed
        if not self.written_by:
            del d["written_by"]  # a save that records no writer has the manifest it had before the key existed
        return json.dumps(d, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, origin: str = "manifest") -> Manifest:
        try:
            d = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestError(f"{origin}: not valid JSON ({e})") from None
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise ManifestError(f"{origin}: not a ckptvault manifest (schema {SCHEMA!r} expected)")
        # Compat: reads manifests from before `mode`, codecs, `save`, `placement`, `lock`, `written_by`;
        # may go: never (FORMAT.md)
        try:
            files = tuple(
                FileEntry(
                    path=safe_relpath(str(f["path"])),
                    size=int(f["size"]),
                    mtime=float(f["mtime"]),
                    crc32c=str(f["crc32c"]),
                    sha256=f.get("sha256"),
                    mode=int(f["mode"]) if f.get("mode") is not None else None,
                    **_codec_fields(f, origin),
                )
                for f in d["files"]
            )
            m = cls(
                run=str(d["run"]),
                step=int(d["step"]),
                format=str(d["format"]),
                files=files,
                created_at=float(d["created_at"]),
                uploaded_at=float(d["uploaded_at"]),
                source=str(d.get("source", "")),
                single_file=bool(d.get("single_file", False)),
                tool_version=str(d.get("tool_version", "")),
                metrics={str(k): float(v) for k, v in d.get("metrics", {}).items()},
                save=int(d.get("save", FIRST_SAVE)),
                placement=_placement(d.get("placement")),
                lock=_lock(d.get("lock")),
                written_by=_written_by(d.get("written_by")),
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ManifestError):
                raise
            raise ManifestError(f"{origin}: missing or malformed field ({e})") from None
        if "total_bytes" in d and int(d["total_bytes"]) != m.total_bytes:
            raise ManifestError(f"{origin}: total_bytes {d['total_bytes']} disagrees with its files ({m.total_bytes})")
        return m


def _placement(value: Any) -> NodePlacement | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"placement is not an object: {type(value).__name__}")
    nodes, pattern, per = value["nodes"], value["node_pattern"], value.get("ranks_per_node", 1)
    if not (isinstance(nodes, int) and isinstance(pattern, str) and isinstance(per, int)) or nodes < 1 or per < 1:
        raise ValueError("placement needs nodes >= 1 and ranks_per_node >= 1 (integers) and a node_pattern string")
    return NodePlacement(nodes, pattern, per)


def _lock(value: Any) -> SaveLock | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"lock is not an object: {type(value).__name__}")
    mode, until = value["mode"], value["retain_until"]
    if mode not in LOCK_MODES or not isinstance(until, int | float) or isinstance(until, bool):
        raise ValueError(f"lock needs a mode in {LOCK_MODES} and a numeric retain_until, not {value!r}")
    return SaveLock(str(mode), float(until))


def _written_by(value: Any) -> dict[str, str]:
    """A manifest's `written_by`, {} when absent. A malformed one is left out, not an error: it is a
    record of what wrote the save, and the save's files restore without it."""
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}
