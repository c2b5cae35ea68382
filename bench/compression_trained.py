"""Issue [M]: stored / original bytes on checkpoints of a small model trained here.

Trains a small decoder-only transformer LM in torch on CPU (AdamW, a few hundred steps on tokens from
a fixed random Markov chain, so the loss falls and the optimizer state is a trained one, not an
initial one), then saves
  (a) the weights as BF16 safetensors (`safetensors.torch.save_file`),
  (b) a mixed checkpoint: one `torch.save` of the BF16 weights and the FP32 AdamW state dict,
  (c) the same state as a DCP save (`torch.distributed.checkpoint`, one process, its default writer),
and runs every file through the library's own choice and encoder: files under ingest's
MIN_COMPRESS_SIZE stay raw, as ingest leaves them; otherwise `codec.choose` (the header's element
size, or the sampled trial) and `codec.encode_file`, which encodes every frame and decodes it again to
check it, as an upload does. It reports stored / original per file and per checkpoint against the
issue's targets (<= 0.75 for the BF16 safetensors model, <= 0.87 for the mixed checkpoint), and the
process CPU seconds per GB of that choice and encoding.

    nice -n 10 .venv/bin/python bench/compression_trained.py [--steps 300] [--d-model 256] [--layers 4]
        [--json PATH] [--scratch DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ckptvault import codec
from ckptvault.ingest.steps import MIN_COMPRESS_SIZE

TARGETS = {"bf16-safetensors": 0.75, "mixed-torch-save": 0.87, "mixed-dcp": 0.87}


def build_model(vocab: int, d: int, layers: int, heads: int, ctx: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            out: torch.Tensor = x + self.down(nn.functional.gelu(self.up(self.ln2(x))))
            return out

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)  # untied: safetensors refuses shared
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)  # GPT-2's initialisation

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            logits: torch.Tensor = self.head(self.ln(x))
            return logits

    return LM()


def markov_batches(vocab: int, batch: int, seq: int, seed: int = 0) -> Any:
    """Token sequences of a fixed random chain: each token has 8 successors with Zipf-like weights, so
    there is something to learn (the loss falls from ln(vocab) towards the chain's entropy)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 8), generator=g)
    probs = 1.0 / torch.arange(1, 9, dtype=torch.float32)
    while True:
        cur = torch.randint(0, vocab, (batch,), generator=g)
        out = [cur]
        for _ in range(seq):
            cur = succ[cur, torch.multinomial(probs, batch, replacement=True, generator=g)]
            out.append(cur)
        yield torch.stack(out, 1)


def train(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    model = build_model(args.vocab, args.d_model, args.layers, args.heads, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    data = markov_batches(args.vocab, args.batch, args.seq)
    t0, losses = time.monotonic(), []
    for step in range(args.steps):
        tokens = next(data)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {losses[-1]:.3f}", file=sys.stderr, flush=True)
    info = {
        "params": sum(p.numel() for p in model.parameters()),
        "steps": args.steps,
        "first_loss": losses[0],
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "uniform_loss": math.log(args.vocab),
        "train_s": time.monotonic() - t0,
    }
    return model, opt, info


def save_all(model: Any, opt: Any, root: Path) -> dict[str, list[Path]]:
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    bf16 = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    (root / "a").mkdir(parents=True)
    save_file(bf16, str(root / "a" / "model.safetensors"))
    (root / "b").mkdir()
    torch.save({"model": bf16, "optimizer": opt.state_dict()}, root / "b" / "checkpoint.pt")
    _, osd = get_state_dict(model, opt)  # the optimizer state by parameter name, as DCP users save it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # one process, no process group: DCP says so
        dcp_save({"model": bf16, "optimizer": osd}, storage_writer=FileSystemWriter(str(root / "c" / "step-1")))
    return {
        "bf16-safetensors": [root / "a" / "model.safetensors"],
        "mixed-torch-save": [root / "b" / "checkpoint.pt"],
        "mixed-dcp": sorted((root / "c" / "step-1").iterdir()),
    }


def encode(path: Path) -> dict[str, Any]:
    """What ingest would store for `path` (ckptvault.ingest.steps `_typesize`, then the framed upload's
    encoder), with the process CPU seconds it took."""
    size = path.stat().st_size
    t0 = time.process_time()
    choice = codec.choose(path, size) if size >= MIN_COMPRESS_SIZE else codec.Choice(codec.NONE, 1, 1.0, "small")
    stored = size
    if choice.codec == codec.SHUFFLE_ZSTD:
        enc, frames = codec.encode_file(path, choice.typesize)
        for _ in frames:
            pass
        stored = enc.stored_size
    return {"file": path.name, "size": size, "stored": stored, "codec": choice.codec, "typesize": choice.typesize,
            "why": choice.why, "cpu_s": time.process_time() - t0}  # fmt: skip


def render(info: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["| checkpoint | file | MB | codec | typesize (from) | stored / original | target |",
             "| --- | --- | ---: | --- | --- | ---: | ---: |"]  # fmt: skip
    for ck, rows in results.items():
        for r in rows:
            src = r["why"].split("(")[-1].rstrip(")") if r["codec"] != codec.NONE else r["why"]
            ts = f"{r['typesize']} ({src})" if r["codec"] != codec.NONE else f"- ({src})"
            lines.append(f"| {ck} | {r['file']} | {r['size'] / 1e6:.2f} | {r['codec']} | {ts} | "
                         f"{r['stored'] / r['size']:.3f} | |")  # fmt: skip
        size, stored = sum(r["size"] for r in rows), sum(r["stored"] for r in rows)
        cpu = sum(r["cpu_s"] for r in rows)
        ok = "met" if stored / size <= TARGETS[ck] else "NOT met"
        lines.append(f"| **{ck}** | all {len(rows)} files | {size / 1e6:.2f} | | {cpu / (size / 1e9):.1f} CPU s/GB | "
                     f"**{stored / size:.3f}** | <= {TARGETS[ck]} ({ok}) |")  # fmt: skip
    head = (f"model: {info['params'] / 1e6:.2f} M parameters, {info['steps']} AdamW steps, loss "
            f"{info['first_loss']:.2f} -> {info['final_loss']:.2f} (uniform {info['uniform_loss']:.2f}), trained in "
            f"{info['train_s']:.0f} s; load average {info['load_before']} before, {info['load_after']} after; "
            f"{info['date']}")  # fmt: skip
    return head + "\n\n" + "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--json", type=Path)
    p.add_argument("--scratch", type=Path, default=Path(__file__).resolve().parent / ".scratch-trained")
    p.add_argument("--keep", action="store_true", help="keep the checkpoints in --scratch")
    args = p.parse_args()
    t0 = time.monotonic()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    shutil.rmtree(args.scratch, ignore_errors=True)
    try:
        model, opt, info = train(args)
        files = save_all(model, opt, args.scratch)
        results = {ck: [encode(f) for f in paths] for ck, paths in files.items()}
    finally:
        if not args.keep:
            shutil.rmtree(args.scratch, ignore_errors=True)
    info |= {"load_before": load_before, "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "wall_s": time.monotonic() - t0}  # fmt: skip
    print(render(info, results))
    print(f"\n(whole run {info['wall_s']:.0f} s wall)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": info, "files": results}, indent=2))
    return 0  # a missed target is a measurement, printed in the table, not a failed bench run


if __name__ == "__main__":
    sys.exit(main())
