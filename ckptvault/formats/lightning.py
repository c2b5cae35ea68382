"""PyTorch Lightning: `*.ckpt` files with `step=S` in the name (`epoch=E-step=S.ckpt`); the candidate
path is the file itself.

Where `ModelCheckpoint` saves (lightning/pytorch/callbacks/model_checkpoint.py,
`ModelCheckpoint.__resolve_ckpt_dir`, Lightning 2.6): its `dirpath` if given (point the source at it);
else `<logger save_dir>/<logger name>/<version>/checkpoints`, with the default logger
`<default_root_dir>/lightning_logs/version_<N>/checkpoints`; with no logger
`<default_root_dir>/checkpoints`. A source may point at any of these or at `default_root_dir`: its
`checkpoints/` and every `*/*/checkpoints/` are searched. When a restarted job (a new `version_<N>`)
saves a step again, the newest version's file is the one taken.

`last.ckpt` (and `last-v1.ckpt`, ...) and any `.ckpt` without a `step=` are skipped: they are copies
or aliases of a stepped checkpoint (ModelCheckpoint's `save_last`), so archiving them would store the
same bytes twice under no step.

The commit rule is what Lightning writes. `_atomic_save` (lightning/fabric/utilities/cloud_io.py)
serialises the whole checkpoint into memory with `torch.save`, then, inside an fsspec transaction,
writes it to a temporary file (`tempfile.mkstemp()`, in TMPDIR) and `shutil.move`s it to the final
name at commit. On one file system that is a rename and the final name appears complete; when TMPDIR
is on another file system (a node-local /tmp, checkpoints on Lustre) `shutil.move` copies, and the
final name grows while it is written. There is no marker, so a file counts as complete when it is a
readable zip: its end-of-central-directory record, which torch.save writes last, is there and reads
(a partial copy, or one killed mid-write, has none). Then discovery's `settle_seconds` must pass with
nothing changed. `*.ckpt.tmp` names are never complete.

Metrics (`read_metrics`): `CheckpointConnector.dump_checkpoint` (lightning/pytorch/trainer/connectors/
checkpoint_connector.py) stores `epoch`, `global_step` and `callbacks`, where each `ModelCheckpoint`
keeps its `state_dict()` (callbacks/model_checkpoint.py): `monitor` (the logged metric it ranks by),
`current_score` (that metric at this save: `_update_best_and_save` sets it right before saving;
a NaN is stored as +/-inf) and `best_model_score`. They are read from the `.ckpt`'s pickle by its
opcodes (`_pickle.read`, nothing executed, no torch import) and the one-element score tensors from
their few storage bytes. Reported: `global_step`, `epoch`, `<monitor>` = current_score and
`best_<monitor>` = best_model_score; and for the loss gates, a monitor named `val*loss` also as
`eval_loss`, any other `*loss` as `loss`. A ModelCheckpoint without `monitor` records no score, so
then there is no loss to gate.
"""

from __future__ import annotations

import functools
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptvault.formats import _fs, _pickle
from ckptvault.formats.base import Candidate

STEP = re.compile(r"(?:^|[-_ ])step=(\d+)")
SUFFIX = ".ckpt"
CHECKPOINTS = "checkpoints"
_VERSION = re.compile(r"(\d+)$")


def _step(name: str) -> int | None:
    base = _fs.strip_temp(name)
    if not base.endswith(SUFFIX) or base.startswith("last"):
        return None
    m = STEP.search(base)
    return int(m[1]) if m else None


def _version(path: Path) -> int:
    m = _VERSION.search(path.parent.name) if path.name == CHECKPOINTS else None
    return int(m[1]) if m else -1


def checkpoint_dirs(root: Path) -> list[Path]:
    """The directories ModelCheckpoint writes into under `root`, oldest logger version first."""
    found = [root]
    if (root / CHECKPOINTS).is_dir():
        found.append(root / CHECKPOINTS)
    nested = []
    for logger in _fs.entries(root):
        if not _fs.is_dir(logger) or logger.name == CHECKPOINTS:
            continue
        for version in _fs.entries(Path(logger.path)):
            d = Path(version.path) / CHECKPOINTS
            if _fs.is_dir(version) and d.is_dir():
                nested.append(d)
    return found + sorted(nested, key=lambda d: (_version(d), str(d)))


def _judge(path: Path) -> tuple[bool, str]:
    try:
        with zipfile.ZipFile(path):  # reads the end record and the central directory only
            return True, ""
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        return False, (
            f"not a readable zip yet ({e}): Lightning is still writing it (a copy across file systems "
            "grows under its final name), or the save was cut short"
        )


PICKLE_LIMIT = 256 << 20  # a data.pkl larger than this (millions of tensors) is not walked for metrics


def _loss_key(monitor: str) -> str | None:
    low = monitor.lower()
    if not low.endswith("loss"):
        return None
    return "eval_loss" if low.startswith("val") else "loss"


def _read(z: zipfile.ZipFile) -> tuple[str, Any]:
    pkls = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
    if len(pkls) != 1 or z.getinfo(pkls[0]).file_size > PICKLE_LIMIT:
        return "", None
    prefix = pkls[0][: -len("data.pkl")]
    try:
        order = z.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
    except KeyError:
        order = "little"  # torch.save wrote no byteorder record before 1.10: little-endian
    if order != "little":
        return prefix, None
    with z.open(pkls[0]) as f:
        return prefix, _pickle.read(f)


@dataclass(frozen=True)
class _Facts:
    metrics: dict[str, float]
    written_by: dict[str, str]


WRITER_KEY = "pytorch-lightning_version"  # CheckpointConnector.dump_checkpoint: the writing Lightning's __version__
_NONE = _Facts({}, {})


@functools.lru_cache(maxsize=8)
def _facts_of(path: str, size: int, mtime_ns: int) -> _Facts:
    """One walk of the `.ckpt`'s pickle for both the metrics and the writer: ingest asks for the metrics
    twice (the gate, the manifest) and the writer once, and each walk of a large data.pkl costs ~100 ms.
    Keyed by size and mtime, so a file rewritten in place is read again."""
    try:
        with zipfile.ZipFile(path) as z:
            prefix, root = _read(z)
            if not isinstance(root, dict):
                return _NONE
            out: dict[str, float] = {}
            for key in ("global_step", "epoch"):
                if (v := _pickle.scalar(z, prefix, root.get(key))) is not None:
                    out[key] = v
            callbacks = root.get("callbacks")
            for name, state in callbacks.items() if isinstance(callbacks, dict) else []:
                if not (isinstance(name, str) and name.startswith("ModelCheckpoint") and isinstance(state, dict)):
                    continue
                monitor = state.get("monitor")
                if not isinstance(monitor, str) or not monitor:
                    continue
                current = _pickle.scalar(z, prefix, state.get("current_score"))
                best = _pickle.scalar(z, prefix, state.get("best_model_score"))
                if current is not None:
                    out.setdefault(monitor, current)
                    if (alias := _loss_key(monitor)) is not None:
                        out.setdefault(alias, current)
                if best is not None:
                    out.setdefault(f"best_{monitor}", best)
            v = root.get(WRITER_KEY)
            return _Facts(out, {"pytorch-lightning": v} if isinstance(v, str) and v else {})
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, IndexError, KeyError):
        return _NONE


def _facts(path: Path) -> _Facts:
    try:
        st = path.stat()
    except OSError:
        return _NONE
    return _facts_of(str(path), st.st_size, st.st_mtime_ns)


def read_metrics(path: Path) -> dict[str, float]:
    """What the module docstring lists, from one `.ckpt`; {} if it does not read as a Lightning checkpoint."""
    return dict(_facts(path).metrics)


def read_written_by(path: Path) -> dict[str, str]:
    """`{"pytorch-lightning": version}`: what `dump_checkpoint` recorded as `pytorch-lightning_version`
    (a top-level key of the checkpoint dict; `lightning` and `pytorch-lightning` carry the same version and
    write the same key), read from the same opcode walk as the metrics; {} if it does not read."""
    return dict(_facts(path).written_by)


class LightningLayout:
    name = "lightning"

    def candidates(self, root: Path) -> list[Candidate]:
        out: list[tuple[int, int, Candidate]] = []
        for order, d in enumerate(checkpoint_dirs(root)):
            for e in _fs.entries(d):
                step = _step(e.name)
                if step is None:
                    continue
                path = Path(e.path)
                if _fs.is_temp_name(e.name):
                    c = Candidate(self.name, step, path, False, _fs.TEMP_REASON)
                else:
                    complete, reason = _judge(path)
                    c = Candidate(self.name, step, path, complete, reason)
                out.append((step, -order, c))
        # per step, the newest logger version first: discovery takes the first of equal names
        return [c for _, _, c in sorted(out, key=lambda t: (t[0], t[2].path.name, t[1]))]

    def matches(self, root: Path) -> bool:
        return any(_step(e.name) is not None for d in checkpoint_dirs(root) for e in _fs.entries(d))

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = LightningLayout()
