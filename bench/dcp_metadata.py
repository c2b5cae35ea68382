"""How long a tensor-level restore takes to read a DCP `.metadata` (ckptvault/formats/dcp_tensors.py):
the opcode reader (`_pickle.read`, used up to MAX_OPCODES) against the C unpickler with stand-ins in a
child process (`_pickle.read_fast`, above it), on `.metadata` files pickled from torch's own classes as
FileSystemWriter.finish writes them: TENSORS tensors, each in RANKS chunks on RANKS files.

    python bench/dcp_metadata.py --tensors 700 --ranks 16 64 --json bench/results/dcp-metadata.json

Not part of `make test`. CPU seconds of this process (opcodes) and of the child (fast), best of --reps.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptvault.formats import dcp_tensors


def write_metadata(path: Path, tensors: int, ranks: int) -> None:
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    sdm: dict[str, Any] = {}
    storage: dict[Any, Any] = {}
    offsets = [0] * ranks
    for t in range(tensors):
        fqn = f"{'optimizer.state.' if t % 3 else ''}layers.{t // 3}.w{t % 3}"
        rows = 64 * ranks
        chunks = [ChunkStorageMetadata(torch.Size([r * 64, 0]), torch.Size([64, 4096])) for r in range(ranks)]
        sdm[fqn] = TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), torch.Size([rows, 4096]), chunks)
        for r in range(ranks):
            n = 64 * 4096 * 2
            storage[MetadataIndex(fqn, torch.Size([r * 64, 0]), r)] = _StorageInfo(f"__{r}_0.distcp", offsets[r], n)
            offsets[r] += n
    with path.open("wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, storage_data=storage), f)


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=700)
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in a.ranks:
            meta = Path(tmp) / f"{ranks}.metadata"
            write_metadata(meta, a.tensors, ranks)
            size = os.path.getsize(meta)
            opcodes, fast = [], []
            for _ in range(a.reps):
                t0 = time.process_time()
                slow = dcp_tensors._chunks(dcp_tensors._pickle.read(meta.read_bytes()), meta.name)
                opcodes.append(time.process_time() - t0)
                c0 = child_cpu()
                got = dcp_tensors._in_child(meta)
                fast.append(child_cpu() - c0)
                assert got == slow
            row = {"tensors": a.tensors, "ranks": ranks, "chunks": len(slow), "bytes": size,
                   "opcodes_cpu_s": round(min(opcodes), 3), "child_fast_cpu_s": round(min(fast), 3)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
