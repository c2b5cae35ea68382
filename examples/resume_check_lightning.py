"""Resume check for a Lightning checkpoint (`[drill] verify_command`, docs/drills.md).

    verify_command = ["/opt/train/venv/bin/python", "examples/resume_check_lightning.py", "{dest}", "{step}"]

Resumes training from the restored `.ckpt` file with Lightning's own `Trainer.fit(..., ckpt_path=...)`,
two steps further (`max_steps`), and fails the checkpoint (exit 1) when the resume is not a resume: the
checkpoint's or the Trainer's `global_step` is not the step the save was recorded at, the optimizer
state did not load (AdamW's `state` empty, or its step count reset: what "resumes as if from scratch"
looks like), or the loss of a fixed batch is not finite. Its last stdout line is
`{"loss": L, "reference": R}`: the fixed batch's loss after the two steps, and the same batch's loss on
the restored weights before them, which the drill compares within `verify_tolerance`. Any other failure
(an import, a module that does not match the checkpoint) exits 2: the drill reports it as
`verify_error`, "the check broke", and leaves the save unmarked.

Copy this file next to your training code and replace the part marked REPLACE with your LightningModule
and data: the module must be the one that wrote the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

BAD_CHECKPOINT = 1  # verify_fail_codes' default: the drill marks the save suspect
CHECK_BROKE = 2  # anything but 0 and 1: a verify_error, the save is left as it is
RESUMED_STEPS = 2


class BadCheckpoint(Exception):
    """The checkpoint loaded, but training does not resume from it as it should."""


# --- REPLACE: your LightningModule and data ------------------------------------------------------------
# This is the tiny MLP that ckptvault's tests train (tests/frameworks/writers.py, `_lightning_parts`), so
# that they can run this file against real checkpoints. Yours must be the module that wrote the checkpoint
# (a different shape fails to load: exit 2).
SEED = 1234
BATCH, IN, HIDDEN, OUT = 8, 64, 512, 16


def build_module() -> Any:
    import lightning as L
    import torch

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(SEED)
            self.net = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))

        def training_step(self, batch: Any, i: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Module()


def build_dataloader() -> Any:
    import torch

    class Steps(torch.utils.data.Dataset[tuple[Any, Any]]):
        def __len__(self) -> int:
            return 10**4

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            g = torch.Generator().manual_seed(SEED + i + 1)
            return torch.randn(BATCH, IN, generator=g)[0], torch.randn(BATCH, OUT, generator=g)[0]

    return torch.utils.data.DataLoader(Steps(), batch_size=BATCH, shuffle=False)


def fixed_batch() -> tuple[Any, Any]:
    """The batch whose loss is measured before and after the resumed steps: the same every time."""
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def batch_loss(module: Any, batch: tuple[Any, Any]) -> float:
    import torch

    x, y = batch
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(module.net(x.to(module.device)), y.to(module.device)))


# --- the check -----------------------------------------------------------------------------------------


def check_optimizer(optimizer: Any, step: int) -> None:
    """Every trainable parameter has AdamW state whose step count is the training's step."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if not optimizer.state:
        raise BadCheckpoint("the optimizer state did not load: AdamW's state is empty (it would resume from scratch)")
    missing = sum(1 for p in params if p not in optimizer.state)
    if missing:
        raise BadCheckpoint(f"the optimizer state did not load for {missing} of {len(params)} parameters")
    steps = {float(optimizer.state[p]["step"]) for p in params}
    if steps != {float(step)}:
        raise BadCheckpoint(f"the optimizer's step count is {sorted(steps)}, not the checkpoint's step {step}")


def resume(checkpoint: Path, step: int) -> dict[str, float]:
    import lightning as L
    import torch

    # what the file says before Lightning acts on it (weights_only: a Lightning .ckpt holds plain types)
    recorded = torch.load(checkpoint, map_location="cpu", weights_only=True).get("global_step")
    if recorded != step:
        raise BadCheckpoint(f"the checkpoint's global_step is {recorded}, the save was recorded as {step}")
    batch = fixed_batch()
    seen: dict[str, float] = {}

    class Probe(L.Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            # after Lightning restored the weights, the optimizer, the loops and the callbacks' state
            if trainer.global_step != step:
                raise BadCheckpoint(f"Lightning resumed at step {trainer.global_step}, not {step}")
            check_optimizer(trainer.optimizers[0], step)
            seen["reference"] = batch_loss(module, batch)

    with tempfile.TemporaryDirectory(prefix="resume-check-") as out:
        trainer = L.Trainer(
            default_root_dir=out, max_steps=step + RESUMED_STEPS, callbacks=[Probe()], enable_checkpointing=False,
            logger=False, enable_progress_bar=False, enable_model_summary=False, devices=1,
        )  # fmt: skip
        module = build_module()
        trainer.fit(module, build_dataloader(), ckpt_path=str(checkpoint))
        if trainer.global_step != step + RESUMED_STEPS:
            raise BadCheckpoint(f"training ended at step {trainer.global_step}, not {step + RESUMED_STEPS}")
        loss = batch_loss(module, batch)
    if not (math.isfinite(loss) and math.isfinite(seen["reference"])):
        raise BadCheckpoint(f"the fixed batch's loss is not finite: {seen['reference']} before, {loss} after")
    return {"loss": loss, "reference": seen["reference"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="the restored .ckpt file ({dest})")
    ap.add_argument("step", type=int, help="the step the save was recorded at ({step})")
    a = ap.parse_args()
    try:
        result = resume(a.checkpoint, a.step)
    except BadCheckpoint as e:
        print(f"resume check: the checkpoint is bad: {e}", file=sys.stderr)
        return BAD_CHECKPOINT
    except Exception:
        traceback.print_exc()
        print("resume check: the check itself failed (not a verdict on the checkpoint)", file=sys.stderr)
        return CHECK_BROKE
    print(f"resumed {a.checkpoint} at step {a.step} and trained {RESUMED_STEPS} steps")
    print(json.dumps(result))  # the last line: what the drill compares
    return 0


if __name__ == "__main__":
    sys.exit(main())
