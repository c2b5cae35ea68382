"""Benchmarks that need no server: discovery, planning, validation, structure checks, the dead-endpoint
check. Each runs as a child of bench/run.py and prints one JSON object on its last line.

    python bench/micro.py make-tree ROOT DIRS FILES_PER_DIR
    python bench/micro.py discover ROOT
    python bench/micro.py plan CHECKPOINTS REPS
    python bench/micro.py validate REPS
    python bench/micro.py plan-mixed REPS
    python bench/micro.py validate-wide REPS
    python bench/micro.py header-read REPS
    python bench/micro.py endpoint-down REPS
    python bench/micro.py hash-blocks SIZE_MIB REPS

`hash-blocks` is the CPU that block CRC32Cs add to an upload's read pass (docs/FORMAT.md, "Block
checksums"): the same file read into 32 MiB part buffers and hashed as the multipart upload hashes it,
and uploaded whole to a MemoryStore, each with and without blocks, interleaved (off, on, on, off).

The last four are the scenarios that tests once bounded by the clock (tests/unit/test_policy.py,
test_quality.py, test_structure.py, tests/integration/test_store_conformance.py): the tests keep the
behaviour, these keep the numbers, where a slow shared machine makes a number instead of a failure.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def make_tree(root: Path, dirs: int, files_per_dir: int) -> dict[str, float]:
    """`dirs` finished HF checkpoint directories (trainer_state.json present) with `files_per_dir`
    files in all, empty but for the trainer state: discovery's cost is per entry, not per byte."""
    t0 = time.perf_counter()
    run = root / "run"
    run.mkdir(parents=True, exist_ok=True)
    old = time.time() - 3600
    for d in range(dirs):
        ck = run / f"checkpoint-{(d + 1) * 10}"
        ck.mkdir()
        base = os.fspath(ck)
        for i in range(files_per_dir - 1):
            os.close(os.open(f"{base}/shard-{i:05d}.bin", os.O_WRONLY | os.O_CREAT, 0o644))
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": (d + 1) * 10, "log_history": []}))
        os.utime(ck, (old, old))
    return {"seconds": time.perf_counter() - t0, "dirs": dirs, "files": dirs * files_per_dir}


def discover_once(root: Path) -> dict[str, float]:
    from ckptvault.ingest.discovery import discover

    t0 = time.perf_counter()
    res = discover("bench", root / "run", "hf", 0, time.time())
    dt = time.perf_counter() - t0
    files = sum(len(f.files) for f in res.found)
    return {"seconds": dt, "checkpoints": len(res.found), "files": files, "ready": sum(f.ready for f in res.found)}


def plan_bench(n: int, reps: int) -> dict[str, Any]:
    from ckptvault.catalog import CheckpointState
    from ckptvault.config import PolicyConfig, TierStep
    from ckptvault.pricing import load_prices
    from ckptvault.tiering.policy import plan

    now = 2_000_000_000.0
    runs = 100
    per_run = n // runs
    t0 = time.perf_counter()
    states = []
    for r in range(runs):
        for i in range(per_run):
            created = now - (per_run - i) * 3600.0 * 4  # every 4 hours
            states.append(
                CheckpointState(
                    run=f"run-{r:03d}",
                    step=(i + 1) * 500,
                    format="hf",
                    last_event="verified",
                    bytes=50 * 10**9,
                    files=12,
                    storage_class="STANDARD",
                    created_at=created,
                    uploaded_at=created,
                    verified=True,
                    local_evicted=False,
                    last_drill_at=None,
                    last_drill_ok=None,
                    metrics={"loss": 2.0 - i / per_run},
                    updated_at=created,
                    detail="",
                    class_since=created,
                )
            )
    build = time.perf_counter() - t0
    policy = PolicyConfig(
        keep_hot=3,
        milestone_every_steps=10_000,
        tiers=[TierStep(after_days=7, tier="warm"), TierStep(after_days=30, tier="archive")],
        keep_local=2,
    )
    prices = load_prices({})
    times = []
    actions = 0
    for _ in range(reps):
        t0 = time.perf_counter()
        p = plan(states, policy, prices, "aws", now)
        times.append(time.perf_counter() - t0)
        actions = len(p.actions)
    return {
        "seconds": statistics.median(times),
        "all_seconds": times,
        "checkpoints": len(states),
        "actions": actions,
        "build_states_seconds": build,
    }


def validate_bench(reps: int) -> dict[str, Any]:
    from ckptvault.catalog import CheckpointState
    from ckptvault.config import ValidationRules
    from ckptvault.ingest.gates import GateSubject

    t0 = time.perf_counter()
    from ckptvault.ingest.quality import validate_candidate

    rules = ValidationRules(isolate=False)
    shards = [(f"model-{i + 1:05d}-of-00008.safetensors", 500_000_000) for i in range(8)]
    files = (*shards, ("optimizer.pt", 8_000_000_000), ("trainer_state.json", 4000))
    total = sum(s for _, s in files)
    history = []
    for k in range(10):
        at = 1_900_000_000.0 + k * 3600
        history.append(
            CheckpointState(
                run="r",
                step=(k + 1) * 100,
                format="hf",
                last_event="verified",
                bytes=total,
                files=len(files),
                storage_class="STANDARD",
                created_at=at,
                uploaded_at=at,
                verified=True,
                local_evicted=False,
                last_drill_at=None,
                last_drill_ok=None,
                metrics={"loss": 2.0 - k * 0.01},
                updated_at=at,
                detail="",
            )
        )
    cand = GateSubject("r", 1100, total, files, 1_900_000_000.0 + 10 * 3600, {"loss": 1.89})
    validate_candidate(cand, history, None, rules)
    cold = time.perf_counter() - t0
    times = []
    verdict = ""
    for _ in range(reps):
        t0 = time.perf_counter()
        report = validate_candidate(cand, history, None, rules)
        times.append(time.perf_counter() - t0)
        verdict = "blocked" if report.blocked else ("warned" if report.warned else "passed")
    # The default: one child process per validation (GX imported there, never here).
    isolated = []
    for _ in range(3):
        t0 = time.perf_counter()
        validate_candidate(cand, history, None, ValidationRules())
        isolated.append(time.perf_counter() - t0)
    return {
        "seconds": statistics.median(times),
        "cold_seconds": cold,
        "isolated_seconds": statistics.median(isolated),
        "reps": reps,
        "verdict": verdict,
    }


def plan_mixed_bench(reps: int) -> dict[str, Any]:
    """100,000 checkpoints in 50 runs under a policy that keeps, moves, expires, skips and evicts (every
    code path of the planner): the scenario of tests/unit/test_policy.py, formerly bound to 2 CPU s."""
    from ckptvault.catalog import CheckpointState
    from ckptvault.config import PolicyConfig, TierStep
    from ckptvault.pricing import GB, load_prices
    from ckptvault.tiering.policy import plan

    now, day = 2_000_000_000.0, 86400.0
    states = []
    for step in range(100_000):
        created = now - (100_000 - step) / 100 * day
        states.append(
            CheckpointState(
                run=f"run{step % 50}", step=step, format="hf", last_event="verified", bytes=100 * GB, files=10,
                storage_class="STANDARD", created_at=created, uploaded_at=created, verified=True,
                local_evicted=False, last_drill_at=None, last_drill_ok=None, metrics={}, updated_at=created,
                detail="", class_since=created,
            )
        )  # fmt: skip
    policy = PolicyConfig(
        keep_hot=3, milestone_every_steps=1000, expire_after_days=500, keep_local=5,
        tiers=[TierStep(after_days=30, tier="warm"), TierStep(after_days=90, tier="cold")],
    )  # fmt: skip
    prices = load_prices({"COLD": 0.002})
    cpu, wall = [], []
    kinds: list[str] = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        p = plan(states, policy, prices, "aws", now)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
        kinds = sorted({a.kind for a in p.actions})
    # Best CPU time, as the test took it: the machine is shared, and wall time measures the neighbours.
    return {"cpu_seconds": min(cpu), "seconds": statistics.median(wall), "all_cpu_seconds": cpu,
            "checkpoints": len(states), "action_kinds": kinds}  # fmt: skip


def validate_wide_bench(reps: int) -> dict[str, Any]:
    """1,000 files against a history of 10,000 checkpoints, in-process and warm (the import is
    validate's cold number): the scenario of tests/unit/test_quality.py, formerly bound to 5 s."""
    from ckptvault.catalog import CheckpointState
    from ckptvault.checkpoint.manifest import FileEntry, Manifest
    from ckptvault.config import ValidationRules
    from ckptvault.ingest.gates import GateSubject
    from ckptvault.ingest.quality import validate_candidate

    t0 = 1_764_400_000.0
    rng = random.Random(1)
    files = (*((f"__{r}_0.distcp", 2_000_000_000) for r in range(999)), (".metadata", 48_000_000))
    total = sum(size for _, size in files)

    def metrics(step: int) -> dict[str, float]:
        loss = round(1.85 + 2.6 / (1 + step / 1000) ** 0.5, 4)
        return {"loss": loss, "eval_loss": loss * 1.04}

    history = []
    for i in range(1, 10_001):
        at = t0 + i * 600.0 * (1 + rng.uniform(-0.1, 0.1) / i)
        history.append(
            CheckpointState(
                run="r", step=i * 100, format="hf", last_event="verified", bytes=total, files=len(files),
                storage_class="STANDARD", created_at=at, uploaded_at=at + 300, verified=True, local_evicted=False,
                last_drill_at=None, last_drill_ok=None, metrics=metrics(i * 100), updated_at=at + 310, detail="",
            )
        )  # fmt: skip
    prev_at = t0 + 6_000_000
    previous = Manifest(
        run="r", step=1_000_000, format="hf",
        files=tuple(FileEntry(path=p, size=size, mtime=prev_at, crc32c="AAAAAA==") for p, size in files),
        created_at=prev_at, uploaded_at=prev_at + 300, source="/scratch/r/checkpoint-1000000",
        metrics=metrics(1_000_000),
    )  # fmt: skip
    cand = GateSubject("r", 1_000_100, total, files, prev_at + 600, metrics(1_000_100))
    rules = ValidationRules(isolate=False)
    validate_candidate(cand, history[:5], previous, rules)  # warm: import + context
    times = []
    verdict = ""
    for _ in range(reps):
        start = time.perf_counter()
        report = validate_candidate(cand, history, previous, rules)
        times.append(time.perf_counter() - start)
        verdict = "blocked" if report.blocked else ("warned" if report.warned else "passed")
    return {"seconds": statistics.median(times), "all_seconds": times, "files": len(files),
            "history": len(history), "verdict": verdict}  # fmt: skip


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def header_read_bench(reps: int) -> dict[str, Any]:
    """check_structure on a sparse 4 GiB safetensors file, which it judges by the header alone: the
    scenario of tests/unit/test_structure.py, formerly bound to 0.5 s. Cold page cache is not
    attempted: the file is sparse, so there is no data on disk to be cold."""
    from ckptvault.checkpoint.local_files import LocalFile
    from ckptvault.ingest.structure import check_structure

    n = 1 << 30  # 4 GiB of F32
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    with tempfile.TemporaryDirectory(prefix="ckptvault-bench-") as d:
        root = Path(d)
        big = root / "big.safetensors"
        with open(big, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            f.truncate(8 + len(header) + 4 * n)
        st = big.stat()
        files = [LocalFile(big.name, big, st.st_size, st.st_mtime)]
        times = []
        read = 0
        for _ in range(reps):
            r0, start = _rchar(), time.perf_counter()
            problems = check_structure("hf", root, files)
            times.append(time.perf_counter() - start)
            read = _rchar() - r0
            assert problems == [], problems
    return {"seconds": statistics.median(times), "all_seconds": times, "file_bytes": st.st_size,
            "bytes_read": read}  # fmt: skip


def endpoint_down_bench(reps: int) -> dict[str, Any]:
    """S3Store.check_bucket against a loopback port nobody listens on, until its message: the scenario
    of tests/integration/test_store_conformance.py, formerly bound to 15 s."""
    from ckptvault.config import StoreConfig
    from ckptvault.store import S3Store, StoreError

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "benchkey")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret-key")
    times = []
    message = ""
    for _ in range(reps):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        store = S3Store(StoreConfig(bucket="anything", endpoint_url=f"http://127.0.0.1:{port}"))
        start = time.perf_counter()
        try:
            store.check_bucket()
        except StoreError as e:
            message = str(e)
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "all_seconds": times, "message": message}


def hash_blocks_bench(size_mib: int, reps: int) -> dict[str, Any]:
    import mmap

    from ckptvault import checksum
    from ckptvault.checksum import StreamHasher, join_pieces
    from ckptvault.store import TransferConfig
    from ckptvault.store.memory import MemoryStore

    part = 32 * 1024 * 1024
    cpu: dict[str, dict[str, list[float]]] = {n: {"off": [], "on": []} for n in ("read-pass", "memory-upload")}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.bin"
        with path.open("wb") as f:
            for _ in range(size_mib):
                f.write(os.urandom(1024 * 1024))
        size = path.stat().st_size

        def read_pass(blocks: bool) -> None:
            buf = mmap.mmap(-1, part)
            view = memoryview(buf)
            hasher = StreamHasher(blocks_at=0 if blocks else None)
            with path.open("rb", buffering=0) as f:
                while n := f.readinto(view):
                    piece = view[:n]
                    hasher.update(piece)
                    piece.release()
                    if hasher.blocks is not None:
                        join_pieces(hasher.blocks.cut())
            view.release()
            buf.close()

        def upload(blocks: bool) -> None:
            store = MemoryStore("b", transfer=TransferConfig(part_size=part, multipart_threshold=part))
            res = store.upload_file(path, "k")
            assert bool(res.blocks) == blocks

        default = checksum.BLOCKS_MIN_SIZE
        for _ in range(reps):
            for mode in ("off", "on", "on", "off"):
                checksum.BLOCKS_MIN_SIZE = default if mode == "on" else 1 << 62  # wants_blocks reads it per call
                for name, fn in (("read-pass", read_pass), ("memory-upload", upload)):
                    t0 = time.process_time()
                    fn(mode == "on")
                    cpu[name][mode].append(time.process_time() - t0)
        checksum.BLOCKS_MIN_SIZE = default
    gb = size / 1e9
    out: dict[str, Any] = {"bytes": size}
    for name, modes in cpu.items():
        off, on = statistics.median(modes["off"]), statistics.median(modes["on"])
        out[name] = {"off_cpu_s_per_gb": off / gb, "on_cpu_s_per_gb": on / gb, "added_cpu_s_per_gb": (on - off) / gb,
                     "added_percent": 100 * (on - off) / off, "all": modes}  # fmt: skip
    return out


if __name__ == "__main__":
    cmd = sys.argv[1]
    out: dict[str, Any]
    if cmd == "make-tree":
        out = make_tree(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "discover":
        out = discover_once(Path(sys.argv[2]))
    elif cmd == "plan":
        out = plan_bench(int(sys.argv[2]), int(sys.argv[3]))
    elif cmd == "validate":
        out = validate_bench(int(sys.argv[2]))
    elif cmd == "plan-mixed":
        out = plan_mixed_bench(int(sys.argv[2]))
    elif cmd == "validate-wide":
        out = validate_wide_bench(int(sys.argv[2]))
    elif cmd == "header-read":
        out = header_read_bench(int(sys.argv[2]))
    elif cmd == "endpoint-down":
        out = endpoint_down_bench(int(sys.argv[2]))
    elif cmd == "hash-blocks":
        out = hash_blocks_bench(int(sys.argv[2]), int(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
    print(json.dumps(out))
