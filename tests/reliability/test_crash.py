"""Crash tests: `ckptvault ingest` killed with SIGKILL at seeded random moments, then run again
(`tier --apply`: test_crash_tier.py). What must hold after every crash and rerun:

- every checkpoint is committed exactly once: one manifest each, and in a versioned bucket exactly
  one version of the manifest and of every data object (a rerun re-sends nothing that was complete);
- the stored bytes equal the source and the manifest's CRC32C equals an independent computation;
- at every kill point, a manifest exists only for a checkpoint whose every object is there;
- the catalog's current state has one verified row per checkpoint, from one `verified` event each;
- incomplete multipart uploads left by the kill are only ever under uncommitted or re-sent keys, and
  none is left after the cleanup (the bucket's abort-incomplete-MPU rule, which ckptvault installs
  and which acts after a day; ingest itself aborts its own after STALE_UPLOAD_SECONDS).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import MANIFEST_NAME, VALIDATION_NAME, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.ingest import steps as ingest_lib
from ckptvault.ingest.discovery import discover
from ckptvault.store import open_store
from ckptvault_cli.synthetic import write_checkpoint
from tests.faultproxy import FaultProxy, FaultRates
from tests.helpers import write_config
from tests.reliability.conftest import (
    CRASH_SEED,
    MiB,
    abort_the_kills_uploads,
    all_keys,
    assert_abort_rules,
    check_committed,
    cli_cmd,
    cli_env,
    crash_config,
    go_and_kill,
    incomplete_uploads,
    manifest_keys,
    prewarmed,
    stratified_offsets,
)

# One kill point in each of 9 equal slices of the calibrated upload window (seeded): about three per
# checkpoint's upload, from before the first object to after the last manifest. Twenty uniform random
# points (until 2026-12) bunched up and could leave a stretch of the window unkilled; nine stratified ones
# spread over all of it in under half the time. CKPTVAULT_KILL_POINTS=N asks for more (or fewer) slices.
KILL_POINTS = int(os.environ.get("CKPTVAULT_KILL_POINTS", "9"))
# With compression on, fewer: the kills exercise the same protocol; what is new is the frames' upload
# and a rerun recognising the compressed objects a kill left complete.
COMPRESSED_KILL_POINTS = int(os.environ.get("CKPTVAULT_COMPRESSED_KILL_POINTS", "4"))


STEPS = (100, 200, 300)


def _versions(client: Any, bucket: str, prefix: str) -> Counter[str]:
    n: Counter[str] = Counter()
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for v in page.get("Versions", []):
            n[v["Key"]] += 1
    return n


def _upload_window(proc: Any, client: Any, bucket: str, prefix: str) -> tuple[float, float, float]:
    """Run a prewarmed ingest to the end, polling the bucket: seconds after "go" when the first data
    object or multipart upload appeared, when the last manifest appeared, and when it exited."""
    assert proc.stdout.readline() == b"ready\n"
    t0 = time.monotonic()
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    first = last = None
    while proc.poll() is None:
        now = time.monotonic() - t0
        if first is None and (incomplete_uploads(client, bucket, prefix) or all_keys(client, bucket, prefix + "r/")):
            first = now
        if last is None and len(manifest_keys(client, bucket, prefix)) == len(STEPS):
            last = now
        time.sleep(0.05)
    assert proc.returncode == 0
    end = time.monotonic() - t0
    return first or 0.0, last or end, end


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("compression", ["off", "auto"])
def test_ingest_killed_at_stratified_random_points_then_rerun(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any, compression: str
) -> None:
    from ckptvault_prefect.flows.ingest import ingest

    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    client = seaweedfs.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    root = tmp_path / "hot"
    # three checkpoints of three 6 MiB files: every file is a two-part multipart upload
    sources = {s: write_checkpoint(root, "deepspeed", s, 18 * MiB, seed=s) for s in STEPS}
    env = cli_env(seaweedfs)

    # The store is reached through the proxy with 50 ms added to every request and one request at a
    # time per file: a slow network, so that the upload phase is long enough for kills to land in it.
    proxy = FaultProxy(seaweedfs.url, FaultRates(latency=1.0, latency_s=0.05)).start()
    slow = dataclasses.replace(seaweedfs, url=proxy.url)

    # Calibrate: when, after "go", the first object appears and the last manifest is committed.
    # The quality gates (Great Expectations) are not what is tested here, and cost seconds per run.
    no_gates = "[validation]\nenabled = false\n"
    calib = crash_config(tmp_path, slow, bucket, "calib", root, no_gates, compression)
    kill_points = KILL_POINTS if compression == "off" else COMPRESSED_KILL_POINTS
    first, last, duration = _upload_window(prewarmed(cli_cmd(calib, "ingest"), env), client, bucket, "calib/")

    rng = random.Random(CRASH_SEED)
    offsets = stratified_offsets(rng, max(0.0, first - 0.5), last + 0.5, kill_points)
    seen = Counter[str]()
    leftovers = 0
    cfgs = [crash_config(tmp_path, slow, bucket, f"k{i:02d}", root, no_gates, compression) for i in range(kill_points)]
    warm = prewarmed(cli_cmd(cfgs[0], "ingest"), env)
    for i, offset in enumerate(offsets):
        prefix = f"k{i:02d}"
        killed, _ = go_and_kill(warm, offset)
        if i + 1 < kill_points:  # starts up while this kill point is checked
            warm = prewarmed(cli_cmd(cfgs[i + 1], "ingest"), env)
        seen["killed while running" if killed else "finished before the kill"] += 1

        # At the kill point: a manifest only for a whole checkpoint.
        committed = manifest_keys(client, bucket, prefix + "/")
        for key in committed:
            step = int(key.split("/")[-2].split("-")[1])
            check_committed(client, bucket, key, sources[step], read_bytes=False)
        objects = [k for k in all_keys(client, bucket, prefix + "/") if "/step-" in k]
        mpus = incomplete_uploads(client, bucket, prefix + "/")
        seen[f"{len(committed)} of 3 committed at the kill"] += 1
        if mpus:
            seen["multipart upload in flight at the kill"] += 1
        elif objects and len(committed) < 3:
            seen["between objects at the kill"] += 1

        # The rerun: the same flow the CLI runs, in this process (no start-up), straight to the store
        # (the same bucket and prefix): the slow link is there for the kills to land in, and a rerun
        # through it only re-sends the rest more slowly.
        direct = crash_config(tmp_path / "direct", seaweedfs, bucket, prefix, root, no_gates, compression)
        t1 = time.monotonic()
        rerun = ingest(config_path=str(direct))
        print(f"kill point {i}: offset {offset} s, killed={killed}, rerun {time.monotonic() - t1:.1f} s", flush=True)
        assert sorted((o.step, o.ok) for o in rerun) == [(s, True) for s in STEPS], rerun
        if compression == "auto":  # the frames were really exercised (FP32 torch zips compress)
            m = json.loads(
                client.get_object(Bucket=bucket, Key=checkpoint_prefix(prefix, "r", 100) + MANIFEST_NAME)["Body"].read()
            )
            assert {f.get("codec") for f in m["files"]} == {"shuffle-zstd"}, m["files"]

        # Every checkpoint committed exactly once, whole, bytes equal to the source.
        assert manifest_keys(client, bucket, prefix + "/") == [
            checkpoint_prefix(prefix, "r", s) + MANIFEST_NAME for s in STEPS
        ]
        for s in STEPS:
            check_committed(client, bucket, checkpoint_prefix(prefix, "r", s) + MANIFEST_NAME, sources[s])
        versions = _versions(client, bucket, prefix + "/r/")
        twice = {k: n for k, n in versions.items() if n != 1 and not k.endswith(VALIDATION_NAME)}
        assert not twice, f"kill point {i} at {offset} s: written more than once: {twice}"

        # The catalog: one verified row per checkpoint, from exactly one verified event each.
        store = open_store(load_config(str(direct)).store)
        catalog = Catalog(store, prefix)
        assert [(c.step, c.verified) for c in catalog.current("r")] == [(s, True) for s in STEPS]
        verified = Counter(e.step for e in catalog.events("r") if e.event == "verified")
        assert verified == dict.fromkeys(STEPS, 1), f"kill point {i}: verified events {dict(verified)}"

        # Multipart leftovers: only the kill's, never under a key whose object is complete and
        # committed with different bytes; the cleanup (what the lifecycle rule does) leaves none
        # and loses nothing.
        leftovers += abort_the_kills_uploads(client, store, bucket, prefix, {s: sources[s] for s in STEPS})

    proxy.stop()
    assert_abort_rules(client, bucket, [f"k{i:02d}" for i in range(kill_points)])
    print(
        f"\n[crash ingest, compression {compression}] one ingest takes {duration:.1f} s, "
        f"objects written from {first:.1f} s to {last:.1f} s; "
        f"{kill_points} SIGKILLs at offsets {offsets}; "
        f"{json.dumps(dict(seen), sort_keys=True)}; {leftovers} incomplete multipart uploads left by kills, "
        "all aborted by the cleanup"
    )


def test_ingest_aborts_its_own_stale_multipart_uploads(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan_upload aborts incomplete uploads under a checkpoint it is about to (re)send once they are
    older than STALE_UPLOAD_SECONDS, and leaves younger ones (a concurrent ingest's) alone."""
    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 7, 3 * MiB)
    cfg = load_config(str(write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])))
    store = open_store(cfg.store)
    client = seaweedfs.client()
    base = checkpoint_prefix("t", "r", 7)
    other = checkpoint_prefix("t", "r", 8)
    for key in (base + "mp_rank_00_model_states.pt", other + "x.pt"):
        client.create_multipart_upload(Bucket=bucket, Key=key)
    found = discover("r", root, "deepspeed", 0, time.time() + 10).found[0]

    ingest_lib.plan_upload(store, "t", found)  # everything younger than six hours: kept
    assert len(incomplete_uploads(client, bucket, "t/")) == 2

    monkeypatch.setattr(ingest_lib, "STALE_UPLOAD_SECONDS", -60)  # now every upload counts as stale
    jobs = ingest_lib.plan_upload(store, "t", found)
    assert all(j.upload for j in jobs)
    left = incomplete_uploads(client, bucket, "t/")
    assert [u["Key"] for u in left] == [other + "x.pt"], "only the re-sent checkpoint's uploads are aborted"


SAVE_KILLS = 4


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ingest_killed_during_the_upload_of_a_second_save_then_rerun(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any
) -> None:
    """A restart re-saved step 300; the ingest sending it as save 2 is killed. After the rerun: exactly
    one save 2, whole, committed once; save 1 of every step intact and superseded only for step 300."""
    import shutil

    from ckptvault_prefect.flows.ingest import ingest

    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    client = seaweedfs.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    old, new = tmp_path / "old", tmp_path / "new"
    old_sources = {s: write_checkpoint(old, "deepspeed", s, 18 * MiB, seed=s) for s in STEPS}
    t = time.time() - 3600  # written an hour before the restart
    for p in old.rglob("*"):
        os.utime(p, (t, t))
    shutil.copytree(old, new, copy_function=shutil.copy2)  # copy2 keeps the mtimes: the same saves
    shutil.rmtree(new / "global_step300")
    new_300 = write_checkpoint(new, "deepspeed", 300, 18 * MiB, seed=3000)
    env = cli_env(seaweedfs)
    proxy = FaultProxy(seaweedfs.url, FaultRates(latency=1.0, latency_s=0.05)).start()
    slow = dataclasses.replace(seaweedfs, url=proxy.url)
    no_gates = "[validation]\nenabled = false\n"

    def prepared(prefix: str) -> Path:
        """Save 1 of every step in `prefix`; returns the config that sends the re-saved step 300, slowly."""
        ingest(config_path=str(crash_config(tmp_path / "old-cfg", seaweedfs, bucket, prefix, old, no_gates)))
        return crash_config(tmp_path / "new-cfg", slow, bucket, prefix, new, no_gates)

    save2 = {p: checkpoint_prefix(p, "r", 300, 2) + MANIFEST_NAME for p in ["calib"] + [f"s{i}" for i in range(9)]}
    calib = prepared("calib")
    proc = prewarmed(cli_cmd(calib, "ingest"), env)
    assert proc.stdout is not None and proc.stdin is not None and proc.stdout.readline() == b"ready\n"
    t0 = time.monotonic()
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    first = last = None
    while proc.poll() is None:
        now = time.monotonic() - t0
        if first is None and (
            incomplete_uploads(client, bucket, "calib/") or all_keys(client, bucket, "calib/r/step-0000000300.save-2/")
        ):
            first = now
        if last is None and save2["calib"] in all_keys(client, bucket, "calib/r/"):
            last = now
        time.sleep(0.05)
    assert proc.returncode == 0 and first is not None and last is not None, (proc.returncode, first, last)

    rng = random.Random(CRASH_SEED + 2)
    offsets = sorted(round(rng.uniform(max(0.0, first - 0.3), last + 0.3), 2) for _ in range(SAVE_KILLS))
    at_kill = Counter[str]()
    for i, offset in enumerate(offsets):
        prefix = f"s{i}"
        cfg = prepared(prefix)
        killed, _ = go_and_kill(prewarmed(cli_cmd(cfg, "ingest"), env), offset)
        committed = save2[prefix] in all_keys(client, bucket, f"{prefix}/r/")
        at_kill[f"killed={killed} save 2 committed={committed}"] += 1
        if committed:  # a manifest only for a whole save
            check_committed(client, bucket, save2[prefix], new_300, read_bytes=False)
        direct = crash_config(tmp_path / "direct", seaweedfs, bucket, prefix, new, no_gates)
        rerun = ingest(config_path=str(direct))
        assert sorted((o.step, o.save, o.ok) for o in rerun) == [(100, 1, True), (200, 1, True), (300, 2, True)]

        # exactly one new save, whole and committed once; every save 1 intact
        assert manifest_keys(client, bucket, f"{prefix}/") == sorted(
            [checkpoint_prefix(prefix, "r", s) + MANIFEST_NAME for s in STEPS] + [save2[prefix]]
        )
        check_committed(client, bucket, save2[prefix], new_300)
        for s in STEPS:
            check_committed(client, bucket, checkpoint_prefix(prefix, "r", s) + MANIFEST_NAME, old_sources[s])
        versions = _versions(client, bucket, f"{prefix}/r/")
        twice = {k: n for k, n in versions.items() if n != 1 and not k.endswith(VALIDATION_NAME)}
        assert not twice, f"kill at {offset} s: written more than once: {twice}"
        catalog = Catalog(open_store(load_config(str(direct)).store), prefix)
        assert [(c.step, c.save, c.state) for c in catalog.current("r")] == [
            (100, 1, "verified"), (200, 1, "verified"), (300, 1, "superseded"), (300, 2, "verified"),
        ]  # fmt: skip
        verified = Counter((e.step, e.save) for e in catalog.events("r") if e.event == "verified")
        assert verified == {(100, 1): 1, (200, 1): 1, (300, 1): 1, (300, 2): 1}, dict(verified)
        assert store_abort(client, bucket, prefix) >= 0
    proxy.stop()
    print(
        f"\n[crash second save] upload window {first:.1f}-{last:.1f} s; SIGKILLs at {offsets}; "
        f"{json.dumps(dict(at_kill), sort_keys=True)}; every rerun converged"
    )


def store_abort(client: Any, bucket: str, prefix: str) -> int:
    """Abort what the kill left in flight (the bucket rule's job after a day) and check it is gone."""
    left = incomplete_uploads(client, bucket, prefix + "/")
    for u in left:
        client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
    assert incomplete_uploads(client, bucket, prefix + "/") == []
    return len(left)
