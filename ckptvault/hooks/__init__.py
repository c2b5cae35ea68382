"""Framework hooks: say "run R, step S is committed at PATH" right after a save, so the checkpoint is
archived within seconds instead of at the next scheduled ingest (docs/hooks.md).

- `notify_saved(run, step, path)`: for DCP / torchtitan, DeepSpeed, Megatron, Orbax and any other
  writer, called after its save returns;
- `CkptvaultCallback`: the Hugging Face `TrainerCallback` (ckptvault/hooks/hf.py);
- `CkptvaultLightningCallback`: the Lightning `Callback` (ckptvault/hooks/lightning.py).

The frameworks are imported only when their callback is asked for, so `import ckptvault.hooks` works
without transformers, lightning or torch. How the signal travels: ckptvault/hooks/signal.py.
"""

from __future__ import annotations

from typing import Any

from ckptvault.hooks.signal import EVENT, notify_saved

__all__ = ["EVENT", "CkptvaultCallback", "CkptvaultLightningCallback", "notify_saved"]


def __getattr__(name: str) -> Any:
    if name == "CkptvaultCallback":
        from ckptvault.hooks.hf import CkptvaultCallback

        return CkptvaultCallback
    if name == "CkptvaultLightningCallback":
        from ckptvault.hooks.lightning import CkptvaultLightningCallback

        return CkptvaultLightningCallback
    raise AttributeError(f"module 'ckptvault.hooks' has no attribute {name!r}")
