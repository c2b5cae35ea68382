"""Resume check for a torch.distributed.checkpoint (DCP) save, as torchtitan writes it (`[drill]
verify_command`, docs/drills.md).

    verify_command = ["/opt/train/venv/bin/python", "examples/resume_check_dcp.py", "{dest}", "{step}"]

Loads the restored `step-N` directory as torchtitan resumes: `dcp.load` into the state dicts of a freshly
built model and optimizer (`get_state_dict`, which allocates the optimizer's state to load into), then
`set_state_dict`; and trains one step. It fails the checkpoint (exit 1) when the resume is not a resume:
the saved `train_state.step` is not the step the save was recorded at, the optimizer state did not load
(AdamW's step count is not the training's: a freshly initialised optimizer saved in its place), or the
loss of a fixed batch is not finite. Its last stdout line is `{"loss": L, "reference": R}`: the fixed
batch's loss after the step, and the same batch's loss on the restored weights before it, which the
drill compares within `verify_tolerance` (DCP records no metric of its own). Any other failure (an
import, a model that does not match the checkpoint, a key the checkpoint lacks) exits 2: the drill
reports it as `verify_error`, "the check broke", and leaves the save unmarked.

One process, no process group: enough for a checkpoint written by any number of ranks, since DCP
reshards on load. Copy this file next to your training code and replace the part marked REPLACE with
your model, optimizer, state layout and data: the model must be the one that wrote the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from pathlib import Path
from typing import Any

BAD_CHECKPOINT = 1  # verify_fail_codes' default: the drill marks the save suspect
CHECK_BROKE = 2  # anything but 0 and 1: a verify_error, the save is left as it is


class BadCheckpoint(Exception):
    """The checkpoint loaded, but training does not resume from it as it should."""


# --- REPLACE: your model, optimizer, state layout and data ----------------------------------------------
# This is the tiny MLP that ckptvault's tests train and save with dcp.save (tests/frameworks/writers.py,
# `dcp_train`), so that they can run this file against real checkpoints. Yours must build the model that
# wrote the checkpoint; the state's keys ("model", "optimizer", "train_state") are the ones it saved.
SEED = 1234
BATCH, IN, HIDDEN, OUT = 8, 64, 512, 16


def build_model_and_optimizer() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def loss_of(model: Any, batch: tuple[Any, Any]) -> Any:
    import torch

    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def training_batch(step: int) -> tuple[Any, Any]:
    """The batch of 1-based training step `step`."""
    import torch

    g = torch.Generator().manual_seed(SEED + step)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def fixed_batch() -> tuple[Any, Any]:
    """The batch whose loss is measured before and after the resumed step: the same every time."""
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


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
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    model, optimizer = build_model_and_optimizer()
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state, "train_state": {"step": -1}}
    load(state, checkpoint_id=str(checkpoint))  # in place, into the tensors above
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    saved_step = int(state["train_state"]["step"])
    if saved_step != step:
        raise BadCheckpoint(f"train_state.step is {saved_step}, the save was recorded as {step}")
    check_optimizer(optimizer, step)

    batch = fixed_batch()
    with torch.no_grad():
        reference = float(loss_of(model, batch))
    loss_of(model, training_batch(step + 1)).backward()  # the next step, as training would take it
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        loss = float(loss_of(model, batch))
    if not (math.isfinite(loss) and math.isfinite(reference)):
        raise BadCheckpoint(f"the fixed batch's loss is not finite: {reference} before, {loss} after")
    return {"loss": loss, "reference": reference}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="the restored step-N directory ({dest})")
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
    print(f"resumed {a.checkpoint} at step {a.step} and trained 1 step")
    print(json.dumps(result))  # the last line: what the drill compares
    return 0


if __name__ == "__main__":
    sys.exit(main())
