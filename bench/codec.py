"""Byte-shuffle + zstd level 1, one thread: python-blosc2 against numcodecs (issue [M], step 1).

    .venv/bin/python bench/codec.py                 # 64 MiB per input, best of 3, 4 MiB frames
    .venv/bin/python bench/codec.py --mib 256 --reps 5

Inputs: BF16 and FP32 normal tensors (std 0.02, like initialised weights), a safetensors shard and a
torch-zip `optimizer.pt` from ckptvault_cli.synthetic (FP32 normals inside their real containers), and a
`torch.save` of a BF16 + FP32 state dict when torch is installed. Each input is cut into 4 MiB frames
(the frame the codec stores) and every library compresses every frame with byte-shuffle (typesize =
element size) and zstd level 1 on one thread. Ratio = original / compressed bytes; MB/s = original
bytes / 10^6 / seconds (best of --reps, the machine is shared). Every round trip is checked.

Candidates:
- blosc2: `blosc2.compress2(..., codec=ZSTD, clevel=1, filters=[SHUFFLE], typesize=T, nthreads=1)`,
  one self-describing blosc2 chunk per frame, automatic block size and with 1 MiB blocks.
- numcodecs Blosc: `numcodecs.Blosc("zstd", 1, SHUFFLE, blocksize=1 MiB, typesize=T)` (c-blosc 1 inside
  numcodecs; its automatic block size at clevel 1 gives only what zstd alone gives, 1.08x on FP32).
- numcodecs Shuffle+Zstd: `numcodecs.Shuffle(T)` then `numcodecs.Zstd(1)`: a plain zstd frame of
  shuffled bytes, two passes over the frame.
- zstd alone (numcodecs.Zstd(1), no shuffle): what shuffling adds.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

warnings.filterwarnings("ignore", category=DeprecationWarning)  # numcodecs on the crc32c package

import blosc2  # noqa: E402
import numcodecs  # noqa: E402

from ckptvault_cli import synthetic  # noqa: E402

FRAME = 4 * 1024 * 1024

Codec = tuple[Callable[[memoryview, int], bytes], Callable[[bytes, int], bytes]]


def _blosc2(blocksize: int = 0) -> Codec:
    blosc2.set_nthreads(1)

    def enc(b: memoryview, ts: int) -> bytes:
        return bytes(
            blosc2.compress2(
                b,
                codec=blosc2.Codec.ZSTD,
                clevel=1,
                filters=[blosc2.Filter.SHUFFLE],
                typesize=ts,
                nthreads=1,
                blocksize=blocksize,
            )
        )

    def dec(c: bytes, ts: int) -> bytes:
        return bytes(blosc2.decompress2(c, nthreads=1))

    return enc, dec


def _nc_blosc() -> Codec:
    numcodecs.blosc.set_nthreads(1)
    numcodecs.blosc.use_threads = False

    # c-blosc 1's automatic block at clevel 1 is small and zstd then finds little (1.08x on FP32, what
    # zstd alone gives); 1 MiB blocks are its best here, so the comparison is with its best.
    def enc(b: memoryview, ts: int) -> bytes:
        return bytes(numcodecs.Blosc("zstd", 1, numcodecs.Blosc.SHUFFLE, blocksize=1 << 20, typesize=ts).encode(b))

    def dec(c: bytes, ts: int) -> bytes:
        return bytes(numcodecs.Blosc("zstd", 1, numcodecs.Blosc.SHUFFLE).decode(c))

    return enc, dec


def _nc_shuffle_zstd() -> Codec:
    z = numcodecs.Zstd(level=1)

    # numcodecs.Shuffle refuses a length that is not a multiple of the element size (a file's last
    # frame): shuffle the whole elements, keep the leftover bytes as they are.
    def enc(b: memoryview, ts: int) -> bytes:
        cut = len(b) - len(b) % ts
        body = numcodecs.Shuffle(ts).encode(np.frombuffer(b[:cut], dtype=np.uint8))
        return bytes(z.encode(bytes(body) + bytes(b[cut:])))

    def dec(c: bytes, ts: int) -> bytes:
        raw = bytes(z.decode(c))
        cut = len(raw) - len(raw) % ts
        return bytes(numcodecs.Shuffle(ts).decode(np.frombuffer(raw[:cut], dtype=np.uint8))) + raw[cut:]

    return enc, dec


def _zstd_only() -> Codec:
    z = numcodecs.Zstd(level=1)
    return (lambda b, ts: bytes(z.encode(b))), (lambda c, ts: bytes(z.decode(c)))


CODECS: dict[str, Callable[[], Codec]] = {
    "blosc2": _blosc2,
    "blosc2 (1 MiB blocks)": lambda: _blosc2(1 << 20),
    "numcodecs-blosc": _nc_blosc,
    "numcodecs-shuffle+zstd": _nc_shuffle_zstd,
    "zstd-only": _zstd_only,
}


def inputs(mib: int, scratch: Path) -> dict[str, tuple[bytes, int]]:
    n = mib * 1024 * 1024
    rng = np.random.default_rng(0)
    f32 = (rng.standard_normal(n // 4, dtype=np.float32) * 0.02).astype(np.float32)
    # BF16 is the top half of an FP32 (round-to-nearest-even, as torch converts).
    u = f32.view(np.uint32).astype(np.uint64)
    bf16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    bf16 = np.concatenate([bf16, bf16])[: n // 2]
    out: dict[str, tuple[bytes, int]] = {"bf16-normal": (bf16.tobytes(), 2), "fp32-normal": (f32.tobytes(), 4)}
    st = scratch / "model.safetensors"
    synthetic.write_safetensors(st, synthetic._tensors("model", n), seed=1)
    out["synthetic safetensors (F32)"] = (st.read_bytes(), 4)
    zp = scratch / "optimizer.pt"
    synthetic.write_torch_zip(zp, n, seed=1)
    out["synthetic torch zip (F32)"] = (zp.read_bytes(), 4)
    try:
        import torch
    except ImportError:
        return out
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n // 8, generator=g, dtype=torch.float32).mul_(0.02)
    sd = {"weight_bf16": w.to(torch.bfloat16), "exp_avg_sq": w[: n // 16].square(), "exp_avg": w[n // 16 :] * 0.1}
    tp = scratch / "state.pt"
    torch.save(sd, tp)
    out["torch.save bf16+fp32 (ts 2)"] = (tp.read_bytes(), 2)
    out["torch.save bf16+fp32 (ts 4)"] = (tp.read_bytes(), 4)
    return out


def measure(codec: Codec, data: bytes, ts: int, reps: int) -> dict[str, float]:
    enc, dec = codec
    view = memoryview(data)
    frames = [view[i : i + FRAME] for i in range(0, len(data), FRAME)]
    best_c = best_d = float("inf")
    stored = 0
    for _ in range(reps):
        t0 = time.perf_counter()
        out = [enc(f, ts) for f in frames]
        best_c = min(best_c, time.perf_counter() - t0)
        t0 = time.perf_counter()
        back = [dec(c, ts) for c in out]
        best_d = min(best_d, time.perf_counter() - t0)
        # Kept as a result, not an exit: blosc2 with an explicit block size larger than a frame whose
        # length is not a multiple of the typesize decodes to wrong bytes (found here).
        wrong = sum(b != bytes(f) for b, f in zip(back, frames, strict=True))
        stored = sum(len(c) for c in out)
    mb = len(data) / 1e6
    return {"ratio": len(data) / stored, "comp_mb_s": mb / best_c, "decomp_mb_s": mb / best_d, "wrong_frames": wrong}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = inputs(a.mib, Path(tmp))
    rows = []
    print(f"{'input':32} {'library':24} {'ratio':>6} {'comp MB/s':>10} {'decomp MB/s':>12}")
    for name, (buf, ts) in data.items():
        for lib, make in CODECS.items():
            r = measure(make(), buf, ts, a.reps)
            rows.append({"input": name, "library": lib, "typesize": ts, **r})
            bad = f"  ROUND TRIP WRONG in {r['wrong_frames']} frames" if r["wrong_frames"] else ""
            print(f"{name:32} {lib:24} {r['ratio']:6.3f} {r['comp_mb_s']:10.0f} {r['decomp_mb_s']:12.0f}{bad}")
    meta = {
        "blosc2": blosc2.__version__,
        "numcodecs": numcodecs.__version__,
        "python": sys.version.split()[0],
        "machine": platform.processor() or platform.machine(),
        "frame": FRAME,
        "mib": a.mib,
        "reps": a.reps,
    }
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
