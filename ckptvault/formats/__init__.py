"""Checkpoint layouts: one module per training framework, each a stateless `Layout` object.

`LAYOUTS` maps the config's `format` names to them; `detect_layout` implements `format = "auto"`.
"""

from __future__ import annotations

from pathlib import Path

from ckptvault.checkpoint.layout_names import LAYOUT_NAMES
from ckptvault.errors import CkptvaultError
from ckptvault.formats import dcp, deepspeed, hf, lightning, megatron, nemo, orbax
from ckptvault.formats._fs import is_temp_name
from ckptvault.formats.base import Candidate, Layout

__all__ = [
    "LAYOUTS",
    "Candidate",
    "FormatError",
    "Layout",
    "counts_for_shape",
    "detect_layout",
    "get_layout",
    "is_temp_name",
    "read_metrics",
    "read_written_by",
]


class FormatError(CkptvaultError, ValueError):
    """The checkpoint format cannot be determined or is unknown; the message names the fix."""


LAYOUTS: dict[str, Layout] = {
    "hf": hf.LAYOUT,
    "dcp": dcp.LAYOUT,
    "megatron": megatron.LAYOUT,
    "deepspeed": deepspeed.LAYOUT,
    "orbax": orbax.LAYOUT,
    "lightning": lightning.LAYOUT,
    "nemo": nemo.LAYOUT,
}
if tuple(LAYOUTS) != LAYOUT_NAMES:  # the config checks `format` against the names alone
    raise ImportError(f"ckptvault.checkpoint.layout_names.LAYOUT_NAMES must name {tuple(LAYOUTS)}, in order")

# What `detect_layout` looks for, phrased for the error message.
_SIGNS = {
    "hf": "checkpoint-<N>/",
    "dcp": "step-<N>/ with *.distcp, also under checkpoint/",
    "megatron": "iter_<NNNNNNN>/ or latest_checkpointed_iteration.txt",
    "deepspeed": "global_step<N>/, or `latest` naming a tag directory",
    "orbax": "<N>/ with _CHECKPOINT_METADATA",
    "lightning": "*step=<S>*.ckpt, also under checkpoints/ and <logger>/version_<N>/checkpoints/",
    "nemo": "*step=<S>*/ with weights/ and context/",
}


def get_layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        known = ", ".join(sorted(LAYOUTS))
        msg = f'unknown checkpoint format {name!r}; set format = one of {known} or "auto" in [[sources]]'
        raise FormatError(msg) from None


def detect_layout(root: Path) -> Layout:
    """The one layout whose run-root signature `root` shows; FormatError if none or several do."""
    hits = [layout for layout in LAYOUTS.values() if layout.matches(root)]
    if len(hits) == 1:
        return hits[0]
    options = " | ".join(f'"{n}"' for n in LAYOUTS)
    if not hits:
        looked = "; ".join(f"{n}: {sign}" for n, sign in _SIGNS.items())
        raise FormatError(
            f'format = "auto" found no known checkpoint layout under {root} (looked for {looked}); '
            f"if checkpoints are there, set format = {options} in [[sources]] for this path."
        )
    names = ", ".join(h.name for h in hits)
    choices = " or ".join(f'"{h.name}"' for h in hits)
    raise FormatError(
        f'format = "auto" is ambiguous under {root}: it looks like {names} '
        f"(looked for {'; '.join(f'{h.name}: {_SIGNS[h.name]}' for h in hits)}); "
        f"set format = {choices} in [[sources]] for this path."
    )


def read_metrics(fmt: str, path: Path) -> dict[str, float]:
    """Training metrics a checkpoint records where they are cheap to read without executing anything;
    {} otherwise. What is read, per format:

    - hf: `trainer_state.json` (the last value of every numeric key of `log_history`, `global_step`).
    - orbax: the metrics given to `CheckpointManager.save(..., metrics=...)` (`metrics/metrics` and
      `_CHECKPOINT_METADATA`), e.g. `loss`.
    - lightning: `global_step`, `epoch`, and each ModelCheckpoint's monitored score (`<monitor>`,
      `best_<monitor>`; a `val*loss` monitor also as `eval_loss`, another `*loss` as `loss`), read
      from the `.ckpt`'s pickle by its opcodes (formats/lightning.py); no monitor, no score.
    - deepspeed, dcp (torchtitan), megatron, nemo: none. Their loss, where they keep one, lives in
      client state inside pickles (DeepSpeed's client_state, torchtitan's `train_state` as a
      torch.save blob in a `.distcp`) under keys the framework does not fix; the loss gates note
      that no loss was recorded.
    """
    if fmt == "hf":
        return hf.read_metrics(path)
    if fmt == "orbax":
        return orbax.read_metrics(path)
    if fmt == "lightning":
        return lightning.read_metrics(path)
    return {}


_MAX_VERSION = 64  # characters: a version string longer than this is not a version


def read_written_by(fmt: str, path: Path) -> dict[str, str]:
    """The versions a checkpoint itself records of what wrote it, read without unpickling anything
    (JSON text, or a pickle's opcodes); {} where it records none or they do not read (never an error:
    this is a record, not a check). Keys (docs/FORMAT.md, "What wrote a save"): a package's name as
    pip knows it for that package's version, `<package>.<format>` for the version of its on-disk
    format where that is all the checkpoint says:

    - hf: `transformers` (`transformers_version` of `config.json`, else `generation_config.json`).
    - lightning: `pytorch-lightning` (the checkpoint's `pytorch-lightning_version`).
    - deepspeed: `deepspeed` (`ds_version` of the tag's `mp_rank_00_model_states.pt`).
    - megatron (torch_dist): `megatron-core.torch_dist` (`metadata.json`'s `sharded_backend_version`,
      keyed by its `sharded_backend`) and `torch.dcp` (its `.metadata`'s format version); legacy: none.
    - dcp: `torch.dcp` (`Metadata.version` of `.metadata`); torch's own version is recorded nowhere.
    - nemo: what its `weights/` records, as megatron's torch_dist.
    - orbax: none (orbax-checkpoint 0.12 writes no version into `_CHECKPOINT_METADATA` or an item's
      `_METADATA`).
    """
    if fmt == "hf":
        got = hf.read_written_by(path)
    elif fmt == "lightning":
        got = lightning.read_written_by(path)
    elif fmt == "deepspeed":
        got = deepspeed.read_written_by(path)
    elif fmt == "megatron":
        got = {**megatron.read_written_by(path), **dcp.read_written_by(path)}
    elif fmt == "dcp":
        got = dcp.read_written_by(path)
    elif fmt == "nemo":
        weights = path / nemo.WEIGHTS
        got = {**megatron.read_written_by(weights), **dcp.read_written_by(weights)}
    else:
        got = {}
    # what a checkpoint says is kept only where it looks like a version: printable, short
    return {k: v for k, v in sorted(got.items()) if 0 < len(v) <= _MAX_VERSION and v.isprintable()}


def counts_for_shape(fmt: str, rel: str) -> bool:
    """Whether file `rel` of a `fmt` checkpoint counts for the shape gate (file count, shard sizes): a
    file whose number changes from one healthy save to the next does not (Orbax's OCDBT chunk files)."""
    if fmt == "orbax":
        return orbax.counts_for_shape(rel)
    return True
