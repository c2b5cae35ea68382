"""Crash test: `ckptvault tier --apply` killed with SIGKILL at seeded random moments in a row, each
run continuing from where the last one died, then run to the end (docs/reliability.md). What must
hold: every object of every checkpoint present, the right size and listed by its manifest at every
kill point; the rerun converges (every checkpoint but the newest in the cold class, the catalog
saying so). Its own file so that `--dist loadfile` runs it beside the ingest crash tests
(test_crash.py), not after them on the same worker.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault_cli.synthetic import write_checkpoint
from tests.faultproxy import FaultProxy, FaultRates
from tests.reliability.conftest import (
    CRASH_SEED,
    MiB,
    check_committed,
    cli_cmd,
    cli_env,
    crash_config,
    go_and_kill,
    prewarmed,
    run_cli,
    stratified_offsets,
)

TIER_STEPS = tuple(range(10, 130, 10))  # 12 checkpoints, 11 to move
# One kill in each of 3 equal slices of the 8 s after the plan is made (seeded), on each server. Six
# uniform random kills (until 2026-12) often hit the same slice twice; three stratified ones kill the
# start, the middle and the late part of the moves in half the time. CKPTVAULT_TIER_KILL_POINTS=N
# asks for more (or fewer) slices.
TIER_KILLS = int(os.environ.get("CKPTVAULT_TIER_KILL_POINTS", "3"))
TIER_KILL_WINDOW_S = 8.0


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_tier_apply_killed_mid_way_then_rerun_converges(
    prefect_api: None, pipeline_s3: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any
) -> None:
    from ckptvault_prefect.flows.ingest import ingest

    s3_env(pipeline_s3)
    bucket = bucket_factory(pipeline_s3)
    client = pipeline_s3.client()
    root = tmp_path / "hot"
    sources = {s: write_checkpoint(root, "deepspeed", s, 3 * MiB, seed=s) for s in TIER_STEPS}
    if pipeline_s3.kind == "ceph":
        policy, cold = 'tiers = [{ after_days = 0, tier = "cold" }]\n[policy.prices]\nCOLD = 0.004\n', "COLD"
    else:
        policy, cold = 'tiers = [{ after_days = 0, tier = "warm" }]\n', "STANDARD_IA"
    # The setup ingest's quality gates in this process, warm: a child process per checkpoint cost ~2 s
    # each (24 s of the 12); the bucket holds the same objects, validation reports included.
    extra = f'[validation]\nisolate = false\n[policy]\nkeep_hot = 1\napply_mode = "client"\n{policy}'
    direct = crash_config(tmp_path, pipeline_s3, bucket, "t", root, extra)
    ingest(config_path=str(direct))
    # tier runs reach the store with 50 ms added per request, so its work spans seconds to kill into
    proxy = FaultProxy(pipeline_s3.url, FaultRates(latency=1.0, latency_s=0.05)).start()
    cfg = crash_config(tmp_path / "slow", dataclasses.replace(pipeline_s3, url=proxy.url), bucket, "t", root, extra)
    env = cli_env(pipeline_s3)
    rng = random.Random(CRASH_SEED)
    dry_run = prewarmed(cli_cmd(cfg, "tier"), env)
    warm = prewarmed(cli_cmd(cfg, "tier", "--apply"), env)  # its imports run beside the dry run
    _, dry = go_and_kill(dry_run, None)  # a dry run: the plan, no moves

    def classes() -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for s in TIER_STEPS:
            m = json.loads(
                client.get_object(Bucket=bucket, Key=checkpoint_prefix("t", "r", s) + MANIFEST_NAME)["Body"].read()
            )
            for f in m["files"]:
                head = client.head_object(Bucket=bucket, Key=checkpoint_prefix("t", "r", s) + f["path"])
                out.setdefault(s, set()).add(head.get("StorageClass", "STANDARD"))
        return out

    offsets = stratified_offsets(rng, 0.9 * dry, 0.9 * dry + TIER_KILL_WINDOW_S, TIER_KILLS)
    progress = []
    for k, offset in enumerate(offsets):
        # the next run starts up while this one works (its moves wait on the slow link, not the CPU)
        following = prewarmed(cli_cmd(cfg, "tier", "--apply"), env) if k + 1 < TIER_KILLS else None
        go_and_kill(warm, offset)
        if following is not None:
            warm = following
        now = classes()
        moved = sum(1 for c in now.values() if c == {cold})
        mixed = sum(1 for c in now.values() if len(c) > 1)
        progress.append(f"{moved} moved" + (f" + {mixed} part-moved" if mixed else ""))
        for s in TIER_STEPS:  # nothing lost at any kill point
            check_committed(
                client, bucket, checkpoint_prefix("t", "r", s) + MANIFEST_NAME, sources[s], read_bytes=False
            )
    # the rerun straight to the store: the slow link is there for the kills to land in
    rerun = run_cli(direct, "tier", "--apply", env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    proxy.stop()

    final = classes()
    assert final == {s: ({"STANDARD"} if s == TIER_STEPS[-1] else {cold}) for s in TIER_STEPS}, final
    for s in TIER_STEPS:
        check_committed(client, bucket, checkpoint_prefix("t", "r", s) + MANIFEST_NAME, sources[s])
    store = open_store(load_config(str(direct)).store)
    states = Catalog(store, "t").current("r")
    assert [(c.step, c.verified) for c in states] == [(s, True) for s in TIER_STEPS]
    assert {c.step: c.storage_class for c in states if c.step != TIER_STEPS[-1]} == dict.fromkeys(TIER_STEPS[:-1], cold)
    print(
        f"\n[crash tier {pipeline_s3.kind}] dry run {dry:.1f} s; "
        f"\n[crash tier {pipeline_s3.kind}] {TIER_KILLS} SIGKILLs of `tier --apply` at {offsets} s; "
        f"after each kill: {progress}; rerun converged, every object intact"
    )
