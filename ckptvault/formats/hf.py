"""Hugging Face Trainer: `checkpoint-<N>/` directories.

The Trainer writes `trainer_state.json` after the weights (shards, then their index) and the optimizer,
so its presence means the save finished. A shard the index names but that is missing once
`trainer_state.json` exists will never arrive: that is corruption, reported loudly by
`structure.check_structure` (invalid), not a save to wait for forever.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from ckptvault.formats import _fs
from ckptvault.formats.base import Candidate

NAME = re.compile(r"^checkpoint-(\d+)$")
STATE = "trainer_state.json"


def _judge(path: Path) -> tuple[bool, str]:
    if (path / STATE).exists():
        return True, ""
    return False, f"no {STATE} yet (the Trainer writes it last)"


class HFLayout:
    name = "hf"

    def candidates(self, root: Path) -> list[Candidate]:
        return _fs.step_dirs(self.name, root, NAME, lambda e, _step: _judge(Path(e.path)))

    def matches(self, root: Path) -> bool:
        return any(NAME.match(_fs.strip_temp(e.name)) and _fs.is_dir(e) for e in _fs.entries(root))

    def pointer_file(self, step: int, ckpt_name: str) -> tuple[str, str] | None:
        return None


LAYOUT = HFLayout()


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def read_metrics(ckpt_dir: Path) -> dict[str, float]:
    """The last value of every numeric key in `trainer_state.json`'s `log_history` (loss, eval_loss,
    learning_rate, grad_norm, ...), plus `global_step`. NaN/inf stay as they are: callers look for
    them. Empty if the file is absent or unparsable."""
    try:
        doc = json.loads((ckpt_dir / STATE).read_bytes())  # json accepts NaN/Infinity, as HF writes them
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    metrics: dict[str, float] = {}
    history = doc.get("log_history")
    if isinstance(history, list):
        for entry in history:
            if not isinstance(entry, dict):
                continue
            for key, value in entry.items():
                num = _numeric(value)
                if num is not None:
                    metrics[str(key)] = num
    for key in ("global_step", "best_metric"):
        num = _numeric(doc.get(key))
        if num is not None and not (key == "best_metric" and math.isnan(num)):
            metrics[key] = num
    return metrics


# save_pretrained's files that record the writing transformers' version (PretrainedConfig.to_dict,
# GenerationConfig.to_dict: `transformers_version`); config.json first, the model's own
CONFIGS = ("config.json", "generation_config.json")


def read_written_by(ckpt_dir: Path) -> dict[str, str]:
    """`{"transformers": version}` from the checkpoint's `config.json` (or `generation_config.json`),
    the JSON text alone; {} when neither records it."""
    for name in CONFIGS:
        v = (_fs.read_small_json(ckpt_dir / name) or {}).get("transformers_version")
        if isinstance(v, str) and v:
            return {"transformers": v}
    return {}
