"""The Hugging Face Trainer's hook: `CkptvaultCallback(run="...")` in `Trainer(callbacks=[...])`.

`on_save` is called by `Trainer._maybe_log_save_evaluate` right after `_save_checkpoint` has returned,
which writes the weights, the optimizer, scheduler and RNG states and `trainer_state.json` last (the HF
layout's commit marker, ckptvault/formats/hf.py), into `<output_dir>/checkpoint-<global_step>`. Every
process calls it; only the world's process zero signals.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ckptvault.hooks.signal import notify_saved


class CkptvaultCallback(TrainerCallback):
    """Signals "run `run`, step S is committed" after each save (ckptvault/hooks/signal.py: a Prefect
    event, or a detached `ckptvault ingest --run R --step S`). `config`: the ckptvault config the
    ingest reads (default $CKPTVAULT_CONFIG); `signal`: auto, event, ingest, both or off (default
    $CKPTVAULT_HOOK_SIGNAL, else auto)."""

    def __init__(self, run: str, *, config: str | None = None, signal: str | None = None) -> None:
        self.run, self.config, self.signal = run, config, signal

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        try:
            if state.is_world_process_zero:
                path = os.path.join(args.output_dir or "", f"checkpoint-{state.global_step}")
                notify_saved(self.run, state.global_step, path, config=self.config, signal=self.signal)
        except Exception:  # notify_saved never raises; reading args/state must not either
            pass
        return None
