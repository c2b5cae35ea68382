"""Benchmarks that need no server: discovery, planning, validation. Each runs as a child of
bench/run.py and prints one JSON object on its last line.

    python bench/micro.py make-tree ROOT DIRS FILES_PER_DIR
    python bench/micro.py discover ROOT
    python bench/micro.py plan CHECKPOINTS REPS
    python bench/micro.py validate REPS
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path


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
    from ckptvault.discovery import discover

    t0 = time.perf_counter()
    res = discover("bench", root / "run", "hf", 0, time.time())
    dt = time.perf_counter() - t0
    files = sum(len(f.files) for f in res.found)
    return {"seconds": dt, "checkpoints": len(res.found), "files": files, "ready": sum(f.ready for f in res.found)}


def plan_bench(n: int, reps: int) -> dict[str, float]:
    from ckptvault.catalog import CheckpointState
    from ckptvault.config import PolicyConfig, TierStep
    from ckptvault.cost import load_prices
    from ckptvault.policy import plan

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


def validate_bench(reps: int) -> dict[str, float]:
    from ckptvault.catalog import CheckpointState
    from ckptvault.config import ValidationRules
    from ckptvault.gates import Candidate

    t0 = time.perf_counter()
    from ckptvault.quality import validate_candidate

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
    cand = Candidate("r", 1100, total, files, 1_900_000_000.0 + 10 * 3600, {"loss": 1.89})
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


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make-tree":
        out = make_tree(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "discover":
        out = discover_once(Path(sys.argv[2]))
    elif cmd == "plan":
        out = plan_bench(int(sys.argv[2]), int(sys.argv[3]))
    elif cmd == "validate":
        out = validate_bench(int(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
    print(json.dumps(out))
