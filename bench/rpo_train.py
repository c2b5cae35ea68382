"""bench/rpo.py's training child: one small model trained by one real framework, saving a checkpoint every
`--every` steps, or at the first step end `--every-seconds` after the last save (`--saves` of them), with or
without ckptvault's hook, timing every training step.

    python bench/rpo_train.py FW ROOT --saves 20 (--every K | --every-seconds S) [--hook RUN] --out TIMES.json

By time, each framework's own means where it has one: Lightning's ModelCheckpoint(train_time_interval),
the Trainer's `control.should_save` set from a callback, the plain loop's own check; the run stops after
its last save.

FW is hf (a Hugging Face Trainer, GPT-2 shaped, ~0.7 M parameters, ~8 MB a save with its optimizer),
lightning (a Lightning MLP, ~1.2 M parameters, ~14 MB a save) or dcp (the same MLP in a plain loop,
`torch.distributed.checkpoint.save` then `notify_saved`, as torchtitan saves). The layouts are the ones
tests/frameworks/writers.py writes (HF output_dir, Lightning default_root_dir, ROOT/checkpoint/step-N).

--hook RUN: the framework's hook (`CkptvaultCallback`, `CkptvaultLightningCallback`, `notify_saved`)
for run RUN, its signal as the environment says (CKPTVAULT_HOOK_SIGNAL, CKPTVAULT_CONFIG). Without it,
nothing but the framework's own save.

The step time is the wall time from the end of one training step to the end of the next (the framework's
own end-of-step callback), so a save and whatever the hook does inside it fall in the step that saved.
torch runs one thread: the machine has two cores, and the other is left to the ingests and the store.
The process's CPU time per step is kept too: what the hook itself costs the training process (its
thread's work included), which the other engineers' load on the machine does not move as it moves wall
time. TIMES.json: {"step_seconds": [...], "step_cpu_seconds": [...], "saved_at": {step: unix time}, "wall": s,
"step_end_unix": [...] (each step's end, unix time, aligned with step_seconds)}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("WANDB_DISABLED", "true")

SEED = 1234
IN, HIDDEN, OUT, BATCH = 64, 1024, 16, 64


class Clock:
    """Every step's end (perf_counter, and the process's CPU time: every thread's, the hook's included)
    and each save's return (unix time)."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.cpu: list[float] = []
        self.unix_ends: list[float] = []  # the same ends as unix time: placed against the ingests' windows
        self.saved_at: dict[int, float] = {}

    def step_end(self) -> None:
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())
        self.unix_ends.append(time.time())

    def result(self, every: int, wall: float) -> dict[str, Any]:
        steps = [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]  # step 2 onwards
        cpu = [b - a for a, b in zip(self.cpu, self.cpu[1:], strict=False)]
        return {"step_seconds": steps, "step_cpu_seconds": cpu, "every": every, "saved_at": self.saved_at,
                "wall": wall, "step_end_unix": self.unix_ends[1:]}  # fmt: skip


class Due:
    """--every-seconds: a save is due at the first step end `seconds` after the last one was due (the
    first: after the first step's end, so model building and start-up are not counted)."""

    def __init__(self, seconds: float, saves: int) -> None:
        self.seconds, self.left = seconds, saves
        self.last: float | None = None

    def now(self) -> bool:
        t = time.monotonic()
        if self.last is None:
            self.last = t
        if self.left <= 0 or t - self.last < self.seconds:
            return False
        self.last, self.left = t, self.left - 1
        return True


def _mlp() -> Any:
    import torch

    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUT),
    )  # fmt: skip


def _batch(step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(SEED + step)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def hf(root: Path, steps: int, every: int, hook: str | None, clock: Clock, due: Due | None) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, 2000, (32,), generator=torch.Generator().manual_seed(SEED + i))
            return {"input_ids": ids, "labels": ids}

    class Timing(TrainerCallback):
        # on_save runs after _save_checkpoint returned, after on_step_end: the save is in the next interval
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.step_end()
            if due is not None and due.now():  # after DefaultFlowCallback: the save happens this step
                control.should_save = True
                control.should_training_stop = due.left == 0

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.saved_at[state.global_step] = time.time()

    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=2000, n_positions=64))
    args = TrainingArguments(
        output_dir=str(root), max_steps=steps if due is None else 10**9,
        save_steps=every if due is None else 10**9, save_strategy="steps", logging_steps=10**6,
        per_device_train_batch_size=8, learning_rate=1e-3, report_to=[], use_cpu=True, seed=SEED,
        data_seed=SEED, dataloader_num_workers=0, save_total_limit=None, disable_tqdm=True,
    )  # fmt: skip
    callbacks: list[Any] = [Timing()]
    if hook:
        from ckptvault.hooks import CkptvaultCallback

        callbacks.append(CkptvaultCallback(hook))
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks).train()


def lightning(root: Path, steps: int, every: int, hook: str | None, clock: Clock, due: Due | None) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Steps(torch.utils.data.Dataset[tuple[Any, Any]]):
        def __len__(self) -> int:
            return 10**6

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            x, y = _batch(i)
            return x, y

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: Any, i: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x[0]), y[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    saved, last = [0], (due.left if due is not None else 0)  # by time: stop once the last save is done

    class Timing(L.Callback):  # type: ignore[misc,name-defined]
        # first in the list: ModelCheckpoint saves in its own on_train_batch_end, after this one
        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            clock.step_end()
            if due is not None and saved[0] >= last:
                trainer.should_stop = True  # the last save was in the step before

        def on_save_checkpoint(self, *a: Any) -> None:
            saved[0] += 1

    L.seed_everything(SEED, verbose=False)
    if due is None:
        checkpoint = ModelCheckpoint(every_n_train_steps=every, save_top_k=-1)
    else:
        checkpoint = ModelCheckpoint(train_time_interval=dt.timedelta(seconds=due.seconds), save_top_k=-1)
    callbacks: list[Any] = [Timing(), checkpoint]
    if hook:
        from ckptvault.hooks import CkptvaultLightningCallback

        callbacks.append(CkptvaultLightningCallback(hook))
    trainer = L.Trainer(
        default_root_dir=str(root), max_steps=steps if due is None else -1, callbacks=callbacks, accelerator="cpu",
        devices=1, enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=True,
    )  # fmt: skip
    data = torch.utils.data.DataLoader(Steps(), batch_size=1, shuffle=False)
    trainer.fit(Module(), data)
    for p in root.rglob("*.ckpt"):  # ModelCheckpoint's file name carries the step: epoch=0-step=N.ckpt
        step = int(p.stem.rsplit("step=", 1)[1])
        clock.saved_at[step] = p.stat().st_mtime


def dcp(root: Path, steps: int, every: int, hook: str | None, clock: Clock, due: Due | None) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ckptvault.hooks import notify_saved

    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    folder = root / "checkpoint"  # torchtitan: {job.dump_folder}/{checkpoint.folder}/step-{N}
    step = 0
    while (step < steps) if due is None else (due.left > 0):
        step += 1
        x, y = _batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if (step % every == 0) if due is None else due.now():
            msd, osd = get_state_dict(model, opt)
            path = folder / f"step-{step}"
            dcp.save({"model": msd, "optimizer": osd, "train_state": {"step": step}}, checkpoint_id=str(path))
            clock.saved_at[step] = time.time()
            if hook:
                notify_saved(hook, step, path)
        clock.step_end()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("fw", choices=("hf", "lightning", "dcp"))
    p.add_argument("root", type=Path)
    p.add_argument("--saves", type=int, default=20)
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", type=int, help="a save every K steps")
    when.add_argument("--every-seconds", type=float, help="a save at the first step end S seconds after the last")
    p.add_argument("--hook", default=None, help="train with ckptvault's hook for this run")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    clock = Clock()
    t0 = time.perf_counter()
    due = None if a.every_seconds is None else Due(a.every_seconds, a.saves)
    every = a.every or 0
    {"hf": hf, "lightning": lightning, "dcp": dcp}[a.fw](a.root, a.saves * every, every, a.hook, clock, due)
    wall = time.perf_counter() - t0
    if a.hook:
        from ckptvault.hooks.signal import DISPATCHER

        DISPATCHER.drain(30)  # the last save's signal handed on before the timings are written
    a.out.write_text(json.dumps(clock.result(every, wall)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
