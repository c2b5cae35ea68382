"""The simulated trainer `make up` runs beside its stack (infra/local/trainer.sh): two training runs that
save a checkpoint every few minutes on the demo's hot tier, so that each of the stack's flows has real
work to do while a newcomer watches the UI.

- `live-hf` saves Hugging Face checkpoints and, after each save, says so the way a training script with
  the hook does (`ckptvault.hooks.notify_saved`: a Prefect event the ingest deployment's trigger turns
  into an ingest of that step within seconds);
- `live-ds` saves DeepSpeed checkpoints and says nothing: the scheduled ingest finds them.

Each save is written unfinished first, then committed by its format's own rule, as the framework would.
Like a trainer with `save_total_limit`, each run keeps its newest KEEP checkpoints on the hot tier and
deletes older ones (they are archived by then, or by the next ingest at the latest). Steps go on from
the newest checkpoint on disk, so a restarted trainer continues its runs. SIGTERM or SIGINT stops it
between two saves (or mid-save: the unfinished checkpoint is left as a crashed save would be).

    python -m ckptvault_cli.trainer --hot DIR [--every SECONDS] [--keep N] [--size-mib N]
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MiB = 2**20
# What the shared config gives the trainer's runs (ckptvault_cli/demo.py write_config): a saved checkpoint
# counts as finished once it has been quiet this long
SETTLE_SECONDS = 3
STEP_EVERY = 100  # training steps between two saves


@dataclass(frozen=True)
class LiveRun:
    run: str
    fmt: str
    hooked: bool  # the training script calls the hook after each save


# Formats whose synthetic checkpoints a drill loads (ckptvault_cli/synthetic.py writes real safetensors and
# torch zips for these; its DCP metadata is not torch's own pickle)
RUNS = (LiveRun("live-hf", "hf", hooked=True), LiveRun("live-ds", "deepspeed", hooked=False))
# the directory of one save, per format
_STEP_DIRS = {"hf": "checkpoint-{}", "deepspeed": "global_step{}"}


def saved_steps(root: Path, fmt: str) -> list[int]:
    """The steps whose checkpoint directory is on the hot tier, oldest first."""
    pattern = re.compile("^" + _STEP_DIRS[fmt].format(r"(\d+)") + "$")
    found = [pattern.match(p.name) for p in root.iterdir()] if root.is_dir() else []
    return sorted(int(m[1]) for m in found if m)


def save(hot: Path, live: LiveRun, size: int, keep: int) -> int:
    """One save of `live`: written, committed, signalled when the run is hooked, older ones pruned."""
    from ckptvault.hooks import notify_saved
    from ckptvault_cli.synthetic import finish_checkpoint, write_checkpoint

    root = hot / live.run
    steps = saved_steps(root, live.fmt)
    step = (steps[-1] if steps else 0) + STEP_EVERY
    loss = 3.0 / (1 + step / 1000)
    path = write_checkpoint(root, live.fmt, step, size, shards=2, seed=step, complete=False, loss=loss)
    finish_checkpoint(root, live.fmt, step, loss=loss)
    if live.hooked:
        notify_saved(live.run, step, str(path))
    for old in saved_steps(root, live.fmt)[:-keep]:
        shutil.rmtree(root / _STEP_DIRS[live.fmt].format(old), ignore_errors=True)
    return step


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptvault_cli.trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--hot", type=Path, required=True, help="the hot tier: one directory per run under it")
    parser.add_argument("--every", type=float, default=180.0, help="seconds between two saves of a run (180)")
    # 12 saves: at the default interval, 36 minutes on the hot tier, over three scheduled ingests (every 10
    # minutes) for a save no hook signalled; a pruned save the archive missed would be a save lost
    parser.add_argument("--keep", type=int, default=12, help="checkpoints each run keeps on the hot tier (12)")
    parser.add_argument("--size-mib", type=int, default=8, help="MiB per checkpoint (8)")
    args = parser.parse_args(argv)
    if args.every <= 0 or args.keep < 1 or args.size_mib < 1:
        parser.error("--every must be > 0, --keep and --size-mib >= 1")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    print(f"trainer: a save of {', '.join(r.run for r in RUNS)} every {args.every:g} s under {args.hot}", flush=True)
    while not stop.is_set():
        t0 = time.monotonic()
        for live in RUNS:
            if stop.is_set():
                break
            step = save(args.hot, live, args.size_mib * MiB, args.keep)
            print(f"trainer: {live.run} saved step {step}{' (hook signalled)' if live.hooked else ''}", flush=True)
        stop.wait(max(0.0, args.every - (time.monotonic() - t0)))
    print("trainer: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
