"""Tiny models trained for a few steps by each real framework, saving with its own checkpoint API into
its default directory layout; and the same frameworks resuming from a checkpoint directory.

Run as a child process, one framework per process (`python -m tests.frameworks.writers CMD ...`), so
no framework's global state (DeepSpeed's process group, JAX's devices, Lightning's seeding) leaks into
the test process or into another framework. Models are a few MB, randomly initialised from a fixed
seed, configured here (no network: HF_HUB_OFFLINE=1), and trained on CPU with deterministic data.

Commands (each prints one JSON line on stdout):
  train FW ROOT [--steps N] [--every K] [--kill-at-last] [--resume-step S] [--hidden H] [--ranks R]
        [--zero-stage Z]
      FW is hf | hf-sharded | lightning | dcp | orbax | deepspeed | megatron. ROOT is what a user points
      [[sources]].path at: HF output_dir, Lightning default_root_dir, torchtitan's dump folder
      (checkpoints in ROOT/checkpoint/step-N), Orbax's CheckpointManager directory, DeepSpeed's save_dir,
      Megatron-LM's --save (ROOT/iter_000000N and latest_checkpointed_iteration.txt).
      --kill-at-last kills the process inside the framework's own save of the last checkpoint, at the
      point KILL_POINTS names, leaving the framework's in-progress state on disk. --resume-step S
      resumes from step S's checkpoint in ROOT first (the framework's own resume), as a restarted job.
      --hidden H widens the MLP (a 16 MiB weight at 65536). --ranks R (dcp): R processes forked on one
      gloo process group (127.0.0.1, a free port), the model and AdamW sharded by FSDP2's fully_shard, each
      rank `dcp.save`-ing its shards into its own __R_0.distcp. --zero-stage Z (deepspeed): ZeRO stage Z
      (1 by default; 3 keeps the weights only in the *_optim_states.pt partitions).
  resume FW CKPT OUT [--steps N]
      the framework loads CKPT (HF checkpoint-N dir, Lightning .ckpt, DCP step-N dir, Orbax root,
      DeepSpeed root through `latest`, Megatron root through its tracker), trains on to N steps, and
      writes OUT/loaded.pt (the state right after loading: model and optimizer tensors, flat) and
      OUT/final.pt (after training on), as plain
      tensors that torch.load(weights_only=True) reads; prints the step it resumed at and ended at.
  load-module ROOT OUT
      DeepSpeed's load_checkpoint(ROOT, load_module_only=True) through `latest`; the module's tensors
      to OUT/module.pt.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("WANDB_DISABLED", "true")

SEED = 1234
BATCH = 8
IN, HIDDEN, OUT = 64, 512, 16  # the MLP of Lightning, DCP, DeepSpeed and Orbax: ~0.6 MB of weights
HOOK_RUN: str | None = None  # --ckptvault-run: hf and lightning train with ckptvault's hook for this run
RANKS = 1  # --ranks: dcp's processes, each saving its own shards
ZERO_STAGE = 1  # --zero-stage: deepspeed's ZeRO stage

# Where --kill-at stops a save (the framework function the kill replaces, run at that moment):
KILL_POINTS = {
    "hf": "before trainer_state.json (transformers.trainer_callback.TrainerState.save_to_json)",
    "dcp": "before .metadata (torch.distributed.checkpoint.filesystem.FileSystemWriter.finish)",
    "orbax": "before the commit (orbax ... atomicity.AtomicRenameTemporaryPath.finalize)",
    "lightning": "mid-copy of the .ckpt to its final name (shutil.move across file systems, _atomic_save)",
}


def _kill_self() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _flat(prefix: str, obj: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Every tensor (or number) in a nested state, keyed by its path: what two states are compared by."""
    import torch

    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().cpu().clone()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            _flat(f"{prefix}.{i}", v, out)
    elif isinstance(obj, bool | int | float):
        out[prefix] = torch.tensor(obj)
    return out


def _save(path: Path, state: dict[str, Any]) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)


def _mlp() -> Any:
    import torch

    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))


def _batch(step: int) -> tuple[Any, Any]:
    """The batch of 1-based training step `step`: the same whichever process trains it."""
    import torch

    g = torch.Generator().manual_seed(SEED + step)
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


# --- Hugging Face Trainer ------------------------------------------------------------------------------


def _hf_parts(root: Path, steps: int, every: int, sharded: bool) -> tuple[Any, Any, Any]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return 1024

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = torch.randint(0, 1000, (32,), generator=torch.Generator().manual_seed(SEED + i))
            return {"input_ids": ids, "labels": ids}

    class ShardedTrainer(Trainer):
        """The Trainer's own save, with the model written as several shards (save_pretrained's
        max_shard_size) and its index: what a model too large for one file looks like."""

        def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
            assert output_dir is not None
            self.model.save_pretrained(output_dir, max_shard_size="400KB")
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    torch.manual_seed(SEED)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=str(root), max_steps=steps, save_steps=every, save_strategy="steps", logging_steps=1,
        per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], use_cpu=True, seed=SEED,
        data_seed=SEED, dataloader_num_workers=0, save_total_limit=None, disable_tqdm=True,
    )  # fmt: skip
    cls = ShardedTrainer if sharded else Trainer
    return cls, model, (args, Tokens())


def hf_train(
    root: Path, steps: int, every: int, kill_at_last: bool, resume_step: int | None = None, sharded: bool = False
) -> dict[str, Any]:
    cls, model, (args, data) = _hf_parts(root, steps, every, sharded)
    if kill_at_last:
        from transformers.trainer_callback import TrainerState

        real = TrainerState.save_to_json

        def save_to_json(self: Any, json_path: str) -> None:
            if self.global_step >= steps:
                _kill_self()
            real(self, json_path)

        TrainerState.save_to_json = save_to_json  # type: ignore[method-assign]
    callbacks = []
    if HOOK_RUN:
        from ckptvault.hooks import CkptvaultCallback

        callbacks.append(CkptvaultCallback(HOOK_RUN))
    trainer = cls(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=str(root / f"checkpoint-{resume_step}") if resume_step else None)
    return {"steps": steps}


def _hf_optimizer_state(trainer: Any) -> dict[str, Any]:
    return _flat("optimizer", trainer.optimizer.state_dict(), {})


def hf_resume(ckpt: Path, out: Path, steps: int) -> dict[str, Any]:
    from transformers import TrainerCallback

    cls, model, (args, data) = _hf_parts(out / "run", steps, 10**6, sharded=False)
    seen: dict[str, Any] = {"first_step": None}

    class Probe(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seen["resumed_at"] = state.global_step
            loaded = _flat("model", kw["model"].state_dict(), {})
            loaded.update(_hf_optimizer_state(trainer))
            _save(out / "loaded.pt", loaded)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if seen["first_step"] is None:
                seen["first_step"] = state.global_step

    trainer = cls(model=model, args=args, train_dataset=data, callbacks=[Probe()])
    trainer.train(resume_from_checkpoint=str(ckpt))
    final = _flat("model", trainer.model.state_dict(), {})
    final.update(_hf_optimizer_state(trainer))
    _save(out / "final.pt", final)
    return {"resumed_at": seen["resumed_at"], "first_step": seen["first_step"], "ended_at": trainer.state.global_step}


# --- Lightning -----------------------------------------------------------------------------------------


def _lightning_parts(steps: int, every: int) -> tuple[Any, Any, Any, Any]:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Steps(torch.utils.data.Dataset[tuple[Any, Any]]):
        def __len__(self) -> int:
            return 10**4

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            x, y = _batch(i + 1)
            return x[0], y[0]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: Any, i: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    L.seed_everything(SEED, verbose=False)
    # monitor: the score ModelCheckpoint records in its callback state (current_score), the loss ingest reads
    checkpoint = ModelCheckpoint(monitor="train_loss", every_n_train_steps=every, save_top_k=-1, save_last=True)
    data = torch.utils.data.DataLoader(Steps(), batch_size=BATCH, shuffle=False)
    return L, Module, checkpoint, data


def _lightning_trainer(L: Any, root: Path, steps: int, callbacks: list[Any]) -> Any:
    return L.Trainer(
        default_root_dir=str(root), max_steps=steps, callbacks=callbacks, accelerator="cpu", devices=1,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1, deterministic=True,
    )  # fmt: skip


def lightning_train(
    root: Path, steps: int, every: int, kill_at_last: bool, resume_step: int | None = None
) -> dict[str, Any]:
    L, Module, checkpoint, data = _lightning_parts(steps, every)
    if kill_at_last:
        # Lightning's _atomic_save writes into a temporary file and shutil.move()s it to the final name:
        # a rename on one file system, a copy across two (the temporary file lives in TMPDIR). The test
        # sets TMPDIR on another file system; here the copy of the last checkpoint is stopped half way,
        # by the kernel (RLIMIT_FSIZE, SIGXFSZ), as a job killed mid-write would leave it.
        import resource

        final = f"step={steps}.ckpt"

        def hook(event: str, args: tuple[Any, ...]) -> None:
            if event == "shutil.copyfile" and str(args[1]).endswith(final):
                half = os.path.getsize(args[0]) // 2
                signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                resource.setrlimit(resource.RLIMIT_FSIZE, (half, half))

        sys.addaudithook(hook)
    callbacks = [checkpoint]
    if HOOK_RUN:
        from ckptvault.hooks import CkptvaultLightningCallback

        callbacks.append(CkptvaultLightningCallback(HOOK_RUN))
    trainer = _lightning_trainer(L, root, steps, callbacks)
    ckpt = None
    if resume_step:
        ckpt = next(str(p) for p in sorted(root.rglob(f"*step={resume_step}.ckpt")))
    trainer.fit(Module(), data, ckpt_path=ckpt)
    return {"steps": steps}


def lightning_resume(ckpt: Path, out: Path, steps: int) -> dict[str, Any]:
    L, Module, _, data = _lightning_parts(steps, 10**6)
    seen: dict[str, Any] = {"first_step": None}

    class Probe(L.Callback):  # type: ignore[misc,name-defined]
        def on_train_start(self, trainer: Any, module: Any) -> None:
            seen["resumed_at"] = trainer.global_step
            loaded = _flat("model", module.state_dict(), {})
            loaded.update(_flat("optimizer", trainer.optimizers[0].state_dict(), {}))
            _save(out / "loaded.pt", loaded)

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if seen["first_step"] is None:
                seen["first_step"] = trainer.global_step

    trainer = _lightning_trainer(L, out / "run", steps, [Probe()])
    module = Module()
    trainer.fit(module, data, ckpt_path=str(ckpt))
    final = _flat("model", module.state_dict(), {})
    final.update(_flat("optimizer", trainer.optimizers[0].state_dict(), {}))
    _save(out / "final.pt", final)
    return {"resumed_at": seen["resumed_at"], "first_step": seen["first_step"], "ended_at": trainer.global_step}


# --- torch DCP, as torchtitan saves it -----------------------------------------------------------------


def _dcp_state(model: Any, opt: Any, step: int) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optimizer": osd, "train_state": {"step": step}}


def _train_step(model: Any, opt: Any, step: int) -> float:
    import torch

    x, y = _batch(step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)


def dcp_train(root: Path, steps: int, every: int, kill_at_last: bool, resume_step: int | None = None) -> dict[str, Any]:
    if RANKS > 1:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as s:  # a free port for rank 0's TCPStore
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # fork, not spawn: the ranks start without importing torch again (a few seconds each); nothing has
        # run in this process yet, so no thread pool is forked half-way
        mp.start_processes(_dcp_rank, args=(RANKS, port, root, steps, every, resume_step), nprocs=RANKS,
                           start_method="fork")  # fmt: skip
        return {"steps": steps, "ranks": RANKS}
    return _dcp_train(root, steps, every, kill_at_last, resume_step)


def _dcp_rank(rank: int, world: int, port: int, root: Path, steps: int, every: int, resume_step: int | None) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _dcp_train(root, steps, every, False, resume_step, world=world)
    finally:
        dist.destroy_process_group()


def _dcp_train(
    root: Path, steps: int, every: int, kill_at_last: bool, resume_step: int | None, world: int = 1
) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model = _mlp()
    if world > 1:  # as torchtitan's data parallelism: FSDP2 shards each Linear's parameters on dim 0
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    folder = root / "checkpoint"  # torchtitan: {job.dump_folder}/{checkpoint.folder}/step-{N}
    start = 1
    if resume_step:  # as torchtitan resumes: dcp.load the step's state into the model and optimizer
        state = _dcp_state(model, opt, 0)
        dcp.load(state, checkpoint_id=str(folder / f"step-{resume_step}"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        start = resume_step + 1
    for step in range(start, steps + 1):
        _train_step(model, opt, step)
        if step % every == 0:
            if kill_at_last and step == steps:
                FileSystemWriter.finish = lambda *a, **k: _kill_self()  # type: ignore[method-assign]
            dcp.save(_dcp_state(model, opt, step), checkpoint_id=str(folder / f"step-{step}"))
    return {"steps": steps}


def dcp_resume(ckpt: Path, out: Path, steps: int) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    torch.manual_seed(SEED + 99)  # a fresh model that is not the checkpoint's
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = _dcp_state(model, opt, 0)
    dcp.load(state, checkpoint_id=str(ckpt))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    resumed = int(state["train_state"]["step"])
    loaded = _flat("model", model.state_dict(), {})
    loaded.update(_flat("optimizer", opt.state_dict(), {}))
    _save(out / "loaded.pt", loaded)
    for step in range(resumed + 1, steps + 1):
        _train_step(model, opt, step)
    final = _flat("model", model.state_dict(), {})
    final.update(_flat("optimizer", opt.state_dict(), {}))
    _save(out / "final.pt", final)
    return {"resumed_at": resumed, "first_step": resumed + 1, "ended_at": steps}


# --- DeepSpeed (ZeRO-1, or --zero-stage 3, on CPU, one process, gloo) ------------------------------------


def _deepspeed_engine() -> tuple[Any, Any]:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    config = {
        "train_batch_size": BATCH,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": ZERO_STAGE},
        "steps_per_print": 10**6,
    }
    model = _mlp()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return deepspeed, engine


def _deepspeed_step(engine: Any, step: int) -> None:
    import torch

    x, y = _batch(step)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()


# Custom save tags (`save_checkpoint(dir, tag=...)`) without the step in them: what discovery must find
# through `latest` and order by the `global_steps` DeepSpeed records in the model states.
DEEPSPEED_TAGS = {2: "warmup-done", 4: "mid-run", 6: "final"}


def deepspeed_train(
    root: Path, steps: int, every: int, kill_at_last: bool, resume_step: int | None = None, tags: bool = False
) -> dict[str, Any]:
    _, engine = _deepspeed_engine()
    start = 1
    if resume_step:  # as a restarted job resumes: the tag of that step, by name
        engine.load_checkpoint(str(root), tag=DEEPSPEED_TAGS[resume_step] if tags else f"global_step{resume_step}")
        start = resume_step + 1
    for step in range(start, steps + 1):
        _deepspeed_step(engine, step)
        if step % every == 0:
            tag = DEEPSPEED_TAGS[step] if tags else None
            engine.save_checkpoint(str(root), tag=tag, client_state={"step": step})
    return {"steps": steps}


def _deepspeed_state(engine: Any) -> dict[str, Any]:
    state = _flat("model", engine.module.state_dict(), {})
    state.update(_flat("optimizer", engine.optimizer.state_dict()["base_optimizer_state"], {}))
    return state


def deepspeed_resume(root: Path, out: Path, steps: int) -> dict[str, Any]:
    _, engine = _deepspeed_engine()
    _, client = engine.load_checkpoint(str(root))  # the tag `latest` names
    resumed = int(client["step"])
    _save(out / "loaded.pt", _deepspeed_state(engine))
    for step in range(resumed + 1, steps + 1):
        _deepspeed_step(engine, step)
    _save(out / "final.pt", _deepspeed_state(engine))
    return {"resumed_at": resumed, "first_step": resumed + 1, "ended_at": engine.global_steps}


def deepspeed_load_module(root: Path, out: Path) -> dict[str, Any]:
    """DeepSpeed's own module-only load (warm-starting, evaluation) through `latest`: what a partial restore
    of the model (`restore --only model`) must be enough for."""
    _, engine = _deepspeed_engine()
    path, _ = engine.load_checkpoint(
        str(root), load_module_only=True, load_optimizer_states=False, load_lr_scheduler_states=False
    )
    _save(out / "module.pt", _flat("model", engine.module.state_dict(), {}))
    return {"loaded": str(path)}


# --- Megatron-Core dist_checkpointing (torch_dist, one process, gloo) -------------------------------------
# Megatron-LM's layout (megatron/training/checkpointing.py save_checkpoint): {save}/iter_{N:07d}/ written by
# megatron.core.dist_checkpointing.save, then, after a barrier, rank 0 writes
# {save}/latest_checkpointed_iteration.txt holding N. The model is the plain MLP (a GPT needs Megatron's
# model-parallel set-up); its parameters and AdamW's moments are ShardedTensors, the rest is common state.

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def _megatron_init() -> Any:
    """gloo, one rank; and CPU stand-ins for the two CUDA calls dist_checkpointing's writer makes
    (filesystem_async.py preload_tensors: torch.cuda.synchronize(); state_dict_saver.py
    save_state_dict_async_finalize: a tensor on torch.cuda.current_device()). Test fixture only."""
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_PORT", str(30500 + os.getpid() % 1000))
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import dist_checkpointing

    return dist_checkpointing


def _megatron_state(model: Any, opt: Any, step: int, empty: bool = False) -> dict[str, Any]:
    """The sharded state dict: one ShardedTensor per parameter and AdamW moment (empty ones to load into)."""
    import torch
    from megatron.core.dist_checkpointing import ShardedTensor

    def sharded(key: str, t: Any) -> Any:
        return ShardedTensor.from_rank_offsets(key, torch.empty_like(t) if empty else t.detach())

    state: dict[str, Any] = {"iteration": step, "checkpoint_version": 3.0}
    for name, p in model.named_parameters():
        state[f"model.{name}"] = sharded(f"model.{name}", p)
        st = opt.state.get(p) or {"step": torch.tensor(0.0), "exp_avg": p, "exp_avg_sq": p}
        for moment in ("exp_avg", "exp_avg_sq"):
            state[f"optimizer.{name}.{moment}"] = sharded(f"optimizer.{name}.{moment}", st[moment])
        state[f"optimizer.{name}.step"] = st["step"].clone()
    return state


def megatron_train(
    root: Path, steps: int, every: int, kill_at_last: bool, resume_step: int | None = None
) -> dict[str, Any]:
    import torch

    dist_checkpointing = _megatron_init()
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 1
    if resume_step:  # a restarted job, as Megatron-LM's --load with --ckpt-step
        _megatron_load(dist_checkpointing, model, opt, root / f"iter_{resume_step:07d}")
        start = resume_step + 1
    for step in range(start, steps + 1):
        _train_step(model, opt, step)
        if step % every == 0:
            ckpt = root / f"iter_{step:07d}"
            # exist_ok: a save killed before is written over (checkpointing.py ensure_directory_exists)
            ckpt.mkdir(parents=True, exist_ok=True)
            dist_checkpointing.save(_megatron_state(model, opt, step), str(ckpt))
            torch.distributed.barrier()
            (root / MEGATRON_TRACKER).write_text(str(step))
    return {"steps": steps}


def _megatron_flat(model: Any, opt: Any) -> dict[str, Any]:
    state = _flat("model", model.state_dict(), {})
    state.update(_flat("optimizer", opt.state_dict(), {}))
    return state


def _megatron_load(dist_checkpointing: Any, model: Any, opt: Any, ckpt: Path) -> int:
    """dist_checkpointing.load of `ckpt` into empty tensors, then into the model and optimizer; the iteration."""
    import torch

    got = dist_checkpointing.load(_megatron_state(model, opt, 0, empty=True), str(ckpt))
    names = [n for n, _ in model.named_parameters()]
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(got[f"model.{name}"])
    osd = opt.state_dict()
    osd["state"] = {
        i: {m: got[f"optimizer.{name}.{m}"] for m in ("step", "exp_avg", "exp_avg_sq")} for i, name in enumerate(names)
    }
    opt.load_state_dict(osd)
    return int(got["iteration"])


def megatron_resume(root: Path, out: Path, steps: int) -> dict[str, Any]:
    """As Megatron-LM's load_checkpoint: the iteration the tracker names, dist_checkpointing.load into
    empty tensors shaped like a fresh model's, then into the model and optimizer."""
    import torch

    dist_checkpointing = _megatron_init()
    torch.manual_seed(SEED + 99)  # a fresh model that is not the checkpoint's
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    iteration = int((root / MEGATRON_TRACKER).read_text().strip())
    resumed = _megatron_load(dist_checkpointing, model, opt, root / f"iter_{iteration:07d}")
    _save(out / "loaded.pt", _megatron_flat(model, opt))
    for step in range(resumed + 1, steps + 1):
        _train_step(model, opt, step)
    _save(out / "final.pt", _megatron_flat(model, opt))
    return {"resumed_at": resumed, "first_step": resumed + 1, "ended_at": steps}


# --- Orbax ---------------------------------------------------------------------------------------------


def _orbax_parts() -> tuple[Any, Any, Any]:
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(SEED)
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (IN, HIDDEN)) * 0.05, "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, OUT)) * 0.05, "b2": jnp.zeros(OUT),
    }  # fmt: skip

    def loss(p: Any, x: Any, y: Any) -> Any:
        return jnp.mean((jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - y) ** 2)

    grad = jax.jit(jax.value_and_grad(loss))
    state = {"params": params, "momentum": jax.tree_util.tree_map(jnp.zeros_like, params), "step": jnp.int32(0)}
    return jax, grad, state


def _orbax_step(jax: Any, grad: Any, state: dict[str, Any], step: int) -> tuple[dict[str, Any], float]:
    x, y = (v.numpy() for v in _batch(step))
    value, g = grad(state["params"], x, y)
    momentum = jax.tree_util.tree_map(lambda m, d: 0.9 * m + d, state["momentum"], g)
    params = jax.tree_util.tree_map(lambda p, m: p - 1e-2 * m, state["params"], momentum)
    return {"params": params, "momentum": momentum, "step": state["step"] + 1}, float(value)


def _orbax_manager(root: Path, every: int) -> Any:
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(
        save_interval_steps=every, max_to_keep=None, best_fn=lambda m: m["loss"], best_mode="min"
    )
    return ocp.CheckpointManager(root.absolute(), options=options)


def orbax_train(
    root: Path, steps: int, every: int, kill_at_last: bool, resume_step: int | None = None
) -> dict[str, Any]:
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.path import atomicity

    jax, grad, state = _orbax_parts()
    mngr = _orbax_manager(root, every)
    start = 1
    if resume_step:
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, state)
        state = mngr.restore(resume_step, args=ocp.args.StandardRestore(abstract))
        start = resume_step + 1
    for step in range(start, steps + 1):
        state, loss = _orbax_step(jax, grad, state, step)
        if kill_at_last and step == steps:
            mngr.wait_until_finished()

            async def finalize(self: Any) -> None:
                _kill_self()

            atomicity.AtomicRenameTemporaryPath.finalize = finalize  # type: ignore[method-assign]
        mngr.save(step, args=ocp.args.StandardSave(state), metrics={"loss": loss})
    mngr.wait_until_finished()
    mngr.close()
    return {"steps": steps, "saved": sorted(int(s) for s in mngr.all_steps())}


def _np_state(state: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    flat: dict[str, Any] = {}

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict):
            for k, w in v.items():
                walk(f"{prefix}.{k}" if prefix else k, w)
        else:
            flat[prefix] = torch.from_numpy(np.array(v))

    walk("", state)
    return flat


def orbax_resume(root: Path, out: Path, steps: int) -> dict[str, Any]:
    import orbax.checkpoint as ocp

    jax, grad, fresh = _orbax_parts()
    mngr = _orbax_manager(root, 10**6)
    step = mngr.latest_step()
    assert step is not None, f"no checkpoint under {root}"
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, fresh)
    state = mngr.restore(step, args=ocp.args.StandardRestore(abstract))
    resumed = int(state["step"])
    _save(out / "loaded.pt", _np_state(state))
    for s in range(resumed + 1, steps + 1):
        state, _ = _orbax_step(jax, grad, state, s)
    _save(out / "final.pt", _np_state(state))
    mngr.close()
    return {"resumed_at": resumed, "first_step": resumed + 1, "ended_at": int(state["step"]), "latest": step}


# --- command line --------------------------------------------------------------------------------------

TRAIN: dict[str, Callable[[Path, int, int, bool, int | None], dict[str, Any]]] = {
    "hf": hf_train,
    "hf-sharded": lambda root, steps, every, kill, resume: hf_train(root, steps, every, kill, resume, sharded=True),
    "lightning": lightning_train,
    "dcp": dcp_train,
    "orbax": orbax_train,
    "deepspeed": deepspeed_train,
    "deepspeed-tags": lambda root, steps, every, kill, resume: deepspeed_train(
        root, steps, every, kill, resume, tags=True
    ),
    "megatron": megatron_train,
}
RESUME: dict[str, Callable[[Path, Path, int], dict[str, Any]]] = {
    "hf": hf_resume,
    "hf-sharded": hf_resume,
    "lightning": lightning_resume,
    "dcp": dcp_resume,
    "orbax": orbax_resume,
    "deepspeed": deepspeed_resume,
    "deepspeed-tags": deepspeed_resume,
    "megatron": megatron_resume,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.frameworks.writers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("framework", choices=sorted(TRAIN))
    t.add_argument("root", type=Path)
    t.add_argument("--steps", type=int, default=6)
    t.add_argument("--every", type=int, default=2)
    t.add_argument("--kill-at-last", action="store_true")
    t.add_argument("--resume-step", type=int, default=None, help="resume from this step's checkpoint in ROOT")
    t.add_argument("--hidden", type=int, default=None, help="the MLP's hidden width (a wider one saves longer)")
    t.add_argument("--ckptvault-run", default=None, help="train with ckptvault's hook (hf, lightning) for this run")
    t.add_argument("--ranks", type=int, default=1, help="dcp: this many processes, each saving its own shards")
    t.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=1, help="deepspeed: the ZeRO stage")
    r = sub.add_parser("resume")
    r.add_argument("framework", choices=sorted(RESUME))
    r.add_argument("ckpt", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--steps", type=int, default=8)
    m = sub.add_parser("load-module", help="DeepSpeed: load_checkpoint(ROOT, load_module_only=True)")
    m.add_argument("root", type=Path)
    m.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "load-module":
        result = deepspeed_load_module(a.root, a.out)
    elif a.cmd == "train":
        global HIDDEN, HOOK_RUN, RANKS, ZERO_STAGE
        if a.ranks != 1 and a.framework != "dcp":
            ap.error("--ranks is for dcp only")
        if a.ranks != 1 and a.kill_at_last:
            ap.error("--kill-at-last kills the one training process: not with --ranks")
        if a.zero_stage != 1 and not a.framework.startswith("deepspeed"):
            ap.error("--zero-stage is for deepspeed only")
        HIDDEN = a.hidden or HIDDEN
        HOOK_RUN = a.ckptvault_run
        RANKS, ZERO_STAGE = a.ranks, a.zero_stage
        result = TRAIN[a.framework](a.root, a.steps, a.every, a.kill_at_last, a.resume_step)
    else:
        result = RESUME[a.framework](a.ckpt, a.out, a.steps)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
