"""Issue [M]: the element size from a file's own header against the sampled trial.

Writes real `torch.save` files of a BF16 + FP32 state dict (BF16 weights, FP32 Adam moments, 1:4 by
bytes as in a 70B checkpoint) and, for comparison, a BF16-only and an FP32-only one; then real
`torch.distributed.checkpoint` (DCP) saves of the mixed and the BF16 state dicts (`--dcp-mib`, two
data files each, as two writer threads write them), whose element size comes from `.metadata`. For
each file: the typesize ckptvault.codec.choose takes from the header and the one the sampled trial
takes (the choice before that header was read), and the whole file's stored / original bytes with
each, every frame encoded as an upload encodes it.

    .venv/bin/python bench/compression_typesize.py [--mib 160] [--dcp-mib 320] [--scratch DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ckptvault import codec

MiB = 1 << 20


def state_dicts(mib: int) -> dict[str, dict[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(0)
    w_elems = mib * MiB // 5 // 2  # a fifth of the bytes BF16 weights
    m_elems = mib * MiB * 4 // 5 // 4 // 2  # the rest FP32, two moments
    weights = {f"layer{i}.weight": (torch.randn(w_elems // 8, generator=g) * 0.02).to(torch.bfloat16) for i in range(8)}
    exp_avg = {f"layer{i}.exp_avg": torch.randn(m_elems // 8, generator=g) * 1e-3 for i in range(8)}
    exp_avg_sq = {f"layer{i}.exp_avg_sq": (torch.randn(m_elems // 8, generator=g) * 1e-3) ** 2 for i in range(8)}
    return {
        "mixed (BF16 weights + FP32 Adam, one file)": {"model": weights, "optimizer": {**exp_avg, **exp_avg_sq}},
        "BF16 weights only": {"model": weights},
        "FP32 Adam moments only": {"optimizer": {**exp_avg, **exp_avg_sq}},
    }


def stored_ratio(path: Path, typesize: int) -> float:
    got = codec.reencode(path, typesize)
    assert got is not None
    return got.stored_size / got.size


def row(name: str, path: Path) -> tuple[str, int, int, int]:
    """The table row of one file; its original bytes, its stored bytes with the header's typesize and
    with the trial's."""
    size = path.stat().st_size
    hint = codec.header_hint(path)
    assert hint is not None, path
    header = hint[0]
    trial = codec.choose(path, size, use_header=False)  # as before the header was read
    ratios = {ts: stored_ratio(path, ts) for ts in (1, 2, 4)}
    line = (f"| {name} | {hint[1]} | {size / MiB:.0f} | {header} | {trial.typesize} | {ratios[header]:.3f} | "
            f"{ratios[trial.typesize]:.3f} | {min(ratios.values()):.3f} (typesize "
            f"{min(ratios, key=lambda t: ratios[t])}) |")  # fmt: skip
    return line, size, round(ratios[header] * size), round(ratios[trial.typesize] * size)


def dcp_save(path: Path, sd: dict[str, Any]) -> list[Path]:
    import warnings

    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # one process, no process group: DCP says so
        save(sd, storage_writer=FileSystemWriter(str(path), thread_count=2))
    return sorted(path.glob("*.distcp"))


def main() -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=160)
    p.add_argument("--dcp-mib", type=int, default=320, help="the mixed DCP save's size (0: no DCP rows)")
    p.add_argument("--scratch", type=Path, default=Path(__file__).resolve().parent / ".scratch-typesize")
    args = p.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    rows = ["| file | hint from | MiB | header typesize | trial typesize | stored / original, header | trial | "
            "best of 1, 2, 4 |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    try:
        for name, sd in state_dicts(args.mib).items():
            path = args.scratch / "ckpt.pt"
            torch.save(sd, path)
            rows.append(row(f"torch.save: {name}", path)[0])
            path.unlink()
        if args.dcp_mib:
            for long_name, sd in list(state_dicts(args.dcp_mib).items())[:2]:  # mixed, then its BF16 weights alone
                name = long_name.replace(", one file", "")  # two writer threads: two files
                files = dcp_save(args.scratch / "dcp", sd)
                total = by_header = by_trial = 0
                for f in files:
                    line, n, h, t = row(f"DCP {name}: {f.name}", f)
                    rows.append(line)
                    total, by_header, by_trial = total + n, by_header + h, by_trial + t
                rows.append(f"| DCP {name}: all data files | | {total / MiB:.0f} | | | {by_header / total:.3f} | "
                            f"{by_trial / total:.3f} | |")  # fmt: skip
                shutil.rmtree(args.scratch / "dcp")
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
