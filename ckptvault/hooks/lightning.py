"""Lightning's hook: `CkptvaultLightningCallback(run="...")` in `Trainer(callbacks=[...])`.

`Callback.on_save_checkpoint` runs inside `dump_checkpoint`, before the file is written, so it cannot be
the signal. The file is in place when the strategy's `CheckpointIO.save_checkpoint` returns
(lightning/pytorch/strategies/strategy.py `save_checkpoint`, called on global rank zero only;
`TorchCheckpointIO` writes through `_atomic_save`, a rename into the final name). So the callback wraps
the strategy's CheckpointIO at `setup` and signals after each save it makes: every `ModelCheckpoint` save
and every `trainer.save_checkpoint`. Strategies that write without their CheckpointIO (DeepSpeed,
FSDP's sharded state dict) are not seen: call `ckptvault.hooks.notify_saved` after their save. An
`AsyncCheckpointIO` returns before its file is written: the signal is then early, and ingest's commit
rule (a readable zip, then settle_seconds: Lightning has no marker) makes the step wait.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.io import CheckpointIO

from ckptvault.hooks.signal import notify_saved


class _NotifyingIO(CheckpointIO):
    """The strategy's own CheckpointIO, and a signal after each save it returns from."""

    def __init__(self, inner: CheckpointIO, hook: CkptvaultLightningCallback) -> None:
        self.inner, self.hook = inner, hook

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        try:
            step = int(checkpoint.get("global_step", -1))
            if step >= 0:
                notify_saved(self.hook.run, step, os.fspath(path), config=self.hook.config, signal=self.hook.signal)
        except Exception:  # notify_saved never raises; reading the checkpoint dict must not either
            pass

    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class CkptvaultLightningCallback(Callback):
    """Signals "run `run`, step S is committed at PATH" after each checkpoint file is in place
    (ckptvault/hooks/signal.py). `config` and `signal` as for the Hugging Face callback."""

    def __init__(self, run: str, *, config: str | None = None, signal: str | None = None) -> None:
        self.run, self.config, self.signal = run, config, signal

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        io = strategy.checkpoint_io
        if not isinstance(io, _NotifyingIO):
            strategy.checkpoint_io = _NotifyingIO(io, self)
