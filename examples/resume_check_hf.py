"""Resume check for a Hugging Face Trainer checkpoint (`[drill] verify_command`, docs/drills.md).

    verify_command = ["/opt/train/venv/bin/python", "examples/resume_check_hf.py", "{dest}", "{step}"]

Resumes training from the restored `checkpoint-N` directory with the Trainer's own
`train(resume_from_checkpoint=...)`, two steps, and fails the checkpoint (exit 1) when the resume is not a
resume: the Trainer's step is not the one the save was recorded at, the optimizer state did not load
(AdamW's `state` empty, or its step count reset: what "resumes as if from scratch" looks like), or the
loss of a fixed batch is not finite. Its last stdout line is `{"loss": L, "reference": R}`: the fixed
batch's loss after the two steps, and the same batch's loss on the restored weights before them, which
the drill compares within `verify_tolerance` (HF's recorded `loss` is the mean of a logging window of
other batches, so it is not the reference). Any other failure (an import, a model that does not match
the checkpoint) exits 2: the drill reports it as `verify_error`, "the check broke", and leaves the save
unmarked.

Copy this file next to your training code and replace the part marked REPLACE with your model, data
and TrainingArguments: the model must be the one that wrote the checkpoint.
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


# --- REPLACE: your model, data and training arguments --------------------------------------------------
# This is the tiny GPT-2 that ckptvault's tests train (tests/frameworks/writers.py, `_hf_parts`), so that
# they can run this file against real checkpoints. Yours must build the same model as the training that
# wrote the checkpoint (a different shape fails to load: exit 2).
SEED = 1234


def build_model() -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64))


def build_dataset() -> Any:
    import torch

    class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return 1024

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, 1000, (32,), generator=torch.Generator().manual_seed(SEED + i))
            return {"input_ids": ids, "labels": ids}

    return Tokens()


def fixed_batch() -> dict[str, Any]:
    """The batch whose loss is measured before and after the resumed steps: the same every time."""
    import torch

    ids = torch.randint(0, 1000, (4, 32), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def training_arguments(output_dir: str, max_steps: int) -> Any:
    from transformers import TrainingArguments

    # As the training's, but for where it writes (a scratch directory), how far it goes and no saving.
    return TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, save_strategy="no", logging_steps=1,
        per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], seed=SEED, data_seed=SEED,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip


# --- the check -----------------------------------------------------------------------------------------


def batch_loss(model: Any, batch: dict[str, Any]) -> float:
    import torch

    was_training = model.training
    model.eval()  # no dropout: the same batch gives the same loss
    with torch.no_grad():
        loss = float(model(**{k: v.to(model.device) for k, v in batch.items()}).loss)
    model.train(was_training)
    return loss


def check_optimizer(optimizer: Any, step: int) -> None:
    """Every trainable parameter has AdamW state whose step count is the training's step."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the torch optimizer
    params = [p for group in inner.param_groups for p in group["params"] if p.requires_grad]
    if not inner.state:
        raise BadCheckpoint("the optimizer state did not load: AdamW's state is empty (it would resume from scratch)")
    missing = sum(1 for p in params if p not in inner.state)
    if missing:
        raise BadCheckpoint(f"the optimizer state did not load for {missing} of {len(params)} parameters")
    steps = {float(inner.state[p]["step"]) for p in params}
    if steps != {float(step)}:
        raise BadCheckpoint(f"the optimizer's step count is {sorted(steps)}, not the checkpoint's step {step}")


def resume(checkpoint: Path, step: int) -> dict[str, float]:
    from transformers import Trainer, TrainerCallback

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    if state["global_step"] != step:
        raise BadCheckpoint(f"trainer_state.json says step {state['global_step']}, the save was recorded as {step}")
    batch = fixed_batch()
    seen: dict[str, float] = {}

    class Probe(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # after the Trainer loaded the weights, the optimizer, the scheduler and its state
            if state.global_step != step:
                raise BadCheckpoint(f"the Trainer resumed at step {state.global_step}, not {step}")
            check_optimizer(kw["optimizer"], step)
            seen["reference"] = batch_loss(kw["model"], batch)

    with tempfile.TemporaryDirectory(prefix="resume-check-") as out:
        trainer = Trainer(
            model=build_model(), args=training_arguments(out, step + RESUMED_STEPS), train_dataset=build_dataset(),
            callbacks=[Probe()],
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=str(checkpoint))
        if trainer.state.global_step != step + RESUMED_STEPS:
            raise BadCheckpoint(f"training ended at step {trainer.state.global_step}, not {step + RESUMED_STEPS}")
        loss = batch_loss(trainer.model, batch)
    if not (math.isfinite(loss) and math.isfinite(seen["reference"])):
        raise BadCheckpoint(f"the fixed batch's loss is not finite: {seen['reference']} before, {loss} after")
    return {"loss": loss, "reference": seen["reference"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="the restored checkpoint-N directory ({dest})")
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
