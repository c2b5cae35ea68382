"""Which part of a training state each file of a checkpoint holds, from its relative path alone (no
download): the model (its weights and what a loader reads beside them: config, tokenizer, index), the
optimizer (optimizer, scheduler, RNG and trainer state: what only a resume reads), or both mixed in one
file, which only a tensor-level read can separate (done for torch DCP's .distcp files:
ckptvault/formats/dcp_tensors.py classes their tensors by name, ckptvault/restore/tensors.py fetches them).

The rules are the frameworks' own file names, one function per layout; docs/frameworks/ says for each
layout what `restore --only model` brings back and why. A file no rule names goes with the model: a
restore for a model load may bring back a small file it did not need, never leave out one it needed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePosixPath


class Part(Enum):
    MODEL = "model"
    OPTIMIZER = "optimizer"
    MIXED = "mixed"  # model and optimizer tensors in the same file


@dataclass(frozen=True)
class Classified:
    path: str
    part: Part
    why: str  # for MIXED: why this file cannot be split (named in the refusal); else the rule that classed it


class _Save:
    """The save's paths, and what a rule asks of all of them, computed once per directory: a save of
    thousands of rank files is classed in linear time."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = frozenset(paths)
        self._zero3: dict[str, bool] = {}

    def zero3(self, base: str) -> bool:
        """Whether DeepSpeed's files under `base` ("" or "DIR/") are a ZeRO-3 save's."""
        if base not in self._zero3:
            self._zero3[base] = any(p.startswith(base) and _DS_ZERO3_MODEL.search(p[len(base) :]) for p in self.paths)
        return self._zero3[base]


# --- Hugging Face Trainer: transformers/trainer.py's names (OPTIMIZER_NAME, SCHEDULER_NAME, ...) -----------
_HF_TRAINING = re.compile(
    r"^(optimizer\.(pt|bin)|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|trainer_state\.json|training_args\.bin)$"
)


def _hf(path: str, save: _Save) -> Classified:
    top, name = PurePosixPath(path).parts[0], PurePosixPath(path).name
    if re.fullmatch(r"global_step\d+", top):  # the Trainer with DeepSpeed: DeepSpeed's own files
        return _deepspeed(path, save, base=top + "/")
    if re.fullmatch(r"optimizer_\d+", top):  # the Trainer with FSDP's sharded state: the optimizer's DCP
        return Classified(path, Part.OPTIMIZER, "FSDP's sharded optimizer state (optimizer_N/)")
    if re.fullmatch(r"pytorch_model_fsdp_\d+", top):  # ... and the model's, a DCP of the model alone
        return Classified(path, Part.MODEL, "FSDP's sharded model state (pytorch_model_fsdp_N/)")
    if _HF_TRAINING.match(name) and len(PurePosixPath(path).parts) == 1:
        return Classified(path, Part.OPTIMIZER, "the Trainer's training state")
    return Classified(path, Part.MODEL, "weights, config or tokenizer")


# --- DeepSpeed: deepspeed/runtime/engine.py `_get_ckpt_name`, `_get_zero_ckpt_name` -------------------------
_DS_ZERO3_MODEL = re.compile(r"(^|/)zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt$")
_DS_OPTIM = re.compile(r"optim_states\.pt$")
ZERO3_WHY = (
    "DeepSpeed ZeRO-3 partitions the weights across ranks: they are kept only inside the *_optim_states.pt "
    "files, beside the optimizer state (the *_model_states.pt files hold no weights)"
)


def _deepspeed(path: str, save: _Save, base: str = "") -> Classified:
    if _DS_OPTIM.search(path):
        if save.zero3(base):
            return Classified(path, Part.MIXED, ZERO3_WHY)
        return Classified(path, Part.OPTIMIZER, "ZeRO's optimizer state partition")
    if path.endswith("model_states.pt"):
        return Classified(path, Part.MODEL, "the module's weights (load_module_only reads them)")
    return Classified(path, Part.MODEL, "a file beside the weights")


# --- torch DCP (torchtitan), Megatron, NeMo 2 ---------------------------------------------------------------
DCP_WHY = (
    "torch DCP writes each rank's model and optimizer tensors into the same .distcp file; a restore selects "
    "them by tensor inside it (ckptvault/restore/tensors.py, by the names in ckptvault/formats/dcp_tensors.py)"
)


def _dcp(path: str, save: _Save) -> Classified:
    if path.endswith(".distcp"):
        return Classified(path, Part.MIXED, DCP_WHY)
    return Classified(path, Part.MODEL, "the checkpoint's metadata")


LEGACY_MEGATRON_WHY = (
    "Megatron-LM's model_optim_rng.pt holds the model, the optimizer and the RNG state in one pickle "
    "(without --use-distributed-optimizer, which writes the optimizer to distrib_optim.pt)"
)


def _megatron(path: str, save: _Save) -> Classified:
    p = PurePosixPath(path)
    if p.name == "distrib_optim.pt":
        return Classified(path, Part.OPTIMIZER, "the distributed optimizer's state")
    if p.name == "model_optim_rng.pt":
        if str(p.with_name("distrib_optim.pt")) in save.paths:
            return Classified(path, Part.MODEL, "the model (its optimizer is in distrib_optim.pt)")
        return Classified(path, Part.MIXED, LEGACY_MEGATRON_WHY)
    return _dcp(path, save)  # torch_dist: a DCP checkpoint with common.pt and metadata.json beside it


# --- Lightning, Orbax ----------------------------------------------------------------------------------------
LIGHTNING_WHY = "Lightning's .ckpt holds state_dict and optimizer_states in one pickle"


def _lightning(path: str, save: _Save) -> Classified:
    if path.endswith(".ckpt"):
        return Classified(path, Part.MIXED, LIGHTNING_WHY)
    return Classified(path, Part.MODEL, "a file beside the checkpoint")


ORBAX_MODEL_ITEMS = frozenset({"params", "model", "model_params", "ema_params"})
ORBAX_OPTIMIZER_ITEMS = frozenset({"opt_state", "optimizer", "optimizer_state", "metrics", "dataset", "data_iter"})


def _orbax(path: str, save: _Save) -> Classified:
    parts = PurePosixPath(path).parts
    if len(parts) == 1:  # _CHECKPOINT_METADATA, commit_success.txt
        return Classified(path, Part.MODEL, "the step's metadata")
    item = parts[0]
    if item in ORBAX_MODEL_ITEMS:
        return Classified(path, Part.MODEL, f"Orbax item {item!r}")
    if item in ORBAX_OPTIMIZER_ITEMS:
        return Classified(path, Part.OPTIMIZER, f"Orbax item {item!r}")
    why = (
        f"Orbax item {item!r} is one tree that may hold the params and the optimizer state together (a single "
        "StandardSave item does); only items named " + ", ".join(sorted(ORBAX_MODEL_ITEMS)) + " are the model's"
    )
    return Classified(path, Part.MIXED, why)


_RULES: dict[str, Callable[[str, _Save], Classified]] = {
    "hf": _hf,
    "deepspeed": _deepspeed,
    "dcp": _dcp,
    "megatron": _megatron,
    "nemo": _dcp,  # weights/ is a DCP checkpoint; context/ the model's config
    "lightning": _lightning,
    "orbax": _orbax,
}


def classify(fmt: str, paths: Sequence[str]) -> list[Classified]:
    """Every path of a `fmt` checkpoint with its part, in the order given. A format without rules (a
    manifest from a layout this version does not know) classes every file MIXED: nothing is guessed."""
    rule = _RULES.get(fmt)
    if rule is None:
        return [Classified(p, Part.MIXED, f"ckptvault does not know which files of a {fmt!r} checkpoint hold what")
                for p in paths]  # fmt: skip
    save = _Save(paths)
    return [rule(p, save) for p in paths]
