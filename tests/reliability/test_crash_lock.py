"""Crash test of a locked save (docs/object-lock.md, "A crash mid-upload"): `ckptvault ingest` with
`[lock] mode = "governance"` SIGKILLed at stratified moments of its upload, then run again. What must
hold after every rerun:

- exactly one committed save of each step, whole, and one verified catalog row from one event;
- every object of it and its manifest locked (HEAD each) until at least its commit + `days`;
- no version under the save's prefix that the manifest does not reference (an orphan): every object
  the killed pass completed is reused by the rerun, its CRC32C recorded (the server's checksum or, on
  Ceph RGW, ckptvault's `crc32c` tag, set before the lock) or, where a kill came before the tag, read
  back. Before the tag went first, a kill between the lock and the tag left a locked orphan, billed
  until its date; before the read-back, a kill before the tag left an unlocked one, billed for ever;
- the multipart uploads left open are only the killed pass's, and the ingest role's abort (the call
  ingest and the cleanup make, without the governance bypass) removes every one.

Governance, not compliance: the mode is one header value, the code path is the same, and governance
lets the fixture's teardown delete the test's versions with the bypass; compliance versions could not
be deleted by anyone for up to `days + 2` days, on a server other tests share.

And the measurement under it, on every server: an abandoned multipart upload started with a lock is
listed, holds no object version (nothing is locked until CompleteMultipartUpload) and is aborted by
the ingest role without the bypass.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault.store.object_lock import content_md5
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
from tests.servers import S3Endpoint

STEPS = (100, 200)
# One kill in each third of the upload window: CI time is tight (docs/reliability.md, "Cost").
# CKPTVAULT_LOCK_KILL_POINTS=N asks for more (or fewer) slices.
KILLS = int(os.environ.get("CKPTVAULT_LOCK_KILL_POINTS", "3"))
DAYS = 1
LOCK = f'[validation]\nenabled = false\n[lock]\nmode = "governance"\ndays = {DAYS}\n'


def _versions(client: Any, bucket: str, prefix: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for v in page.get("Versions", []):
            out.setdefault(v["Key"], []).append(v)
    return out


def _lock_of(client: Any, bucket: str, key: str, version: str | None = None) -> tuple[str | None, datetime | None]:
    args = {"VersionId": version} if version else {}
    h = client.head_object(Bucket=bucket, Key=key, **args)
    return h.get("ObjectLockMode"), h.get("ObjectLockRetainUntilDate")


def _drained(proxy: FaultProxy, timeout: float = 30) -> None:
    """Wait until the proxy is quiet: no request in flight, and none arrived over 0.1 s (a request a
    dead client had written is counted only once the proxy has read its headers)."""
    deadline = time.monotonic() + timeout
    seen = -1
    while True:
        idle = sum(proxy.in_flight.values()) == 0
        total = sum(proxy.requests.values())
        if idle and total == seen:
            return
        assert time.monotonic() < deadline, f"requests still in flight: {dict(proxy.in_flight)}"
        seen = total if idle else -1
        time.sleep(0.1)


def _crc_recorded(client: Any, bucket: str, key: str, version: str) -> bool:
    """Whether the version carries a whole-object CRC32C a rerun can compare with the local file's
    (metadata of a single PUT, the server's full-object checksum, or ckptvault's `crc32c` tag that
    an upload adds to a multipart object where the server keeps none), read straight from the server."""
    h = client.head_object(Bucket=bucket, Key=key, VersionId=version, ChecksumMode="ENABLED")
    if h.get("Metadata", {}).get("crc32c") or "-" not in str(h.get("ChecksumCRC32C") or "-"):
        return True
    # Ceph RGW answers an object without tags (one a kill stopped before any) with no TagSet at all
    tags = client.get_object_tagging(Bucket=bucket, Key=key, VersionId=version).get("TagSet", [])
    return any(t["Key"] == "crc32c" for t in tags)


def _upload_window(proc: Any, client: Any, bucket: str, prefix: str) -> tuple[float, float]:
    """Run a prewarmed ingest to the end, polling the bucket: seconds after "go" when the first data
    object or multipart upload appeared, and when the last manifest did."""
    assert proc.stdout.readline() == b"ready\n", "the prewarmed CLI did not start"
    t0 = time.monotonic()
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    first = last = None
    while proc.poll() is None:
        now = time.monotonic() - t0
        if first is None and (
            incomplete_uploads(client, bucket, prefix + "/") or all_keys(client, bucket, prefix + "/r/")
        ):
            first = now
        if last is None and len(manifest_keys(client, bucket, prefix + "/")) == len(STEPS):
            last = now
        time.sleep(0.05)
    assert proc.returncode == 0 and first is not None, (proc.returncode, first)
    return first, last or time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_locked_ingest_killed_mid_upload_then_rerun(
    prefect_api: None, pipeline_s3: S3Endpoint, locked_bucket: Any, tmp_path: Path, s3_env: Any
) -> None:
    from ckptvault_prefect.flows.ingest import ingest

    t_start = time.monotonic()
    s3_env(pipeline_s3)
    bucket = locked_bucket(pipeline_s3)
    client = pipeline_s3.client()
    root = tmp_path / "hot"
    # two checkpoints of three 6 MiB files: every file a two-part multipart upload (5 MiB parts), so a
    # kill can land between CreateMultipartUpload and CompleteMultipartUpload
    sources = {s: write_checkpoint(root, "deepspeed", s, 18 * MiB, seed=s) for s in STEPS}
    env = cli_env(pipeline_s3)
    proxy = FaultProxy(pipeline_s3.url, FaultRates(latency=1.0, latency_s=0.05)).start()
    slow = dataclasses.replace(pipeline_s3, url=proxy.url)

    # Calibrate: when, after "go", the first object or upload appears and the last manifest commits.
    # Twice: a bucket's first ingest is slower on Ceph RGW (its index made at the first write), and
    # kills timed by it would all land after the later, faster runs had ended.
    windows = [_upload_window(prewarmed(cli_cmd(crash_config(tmp_path, slow, bucket, c, root, LOCK), "ingest"), env),
                              client, bucket, c) for c in ("calib0", "calib")]  # fmt: skip
    first, last = windows[-1]
    offsets = stratified_offsets(random.Random(CRASH_SEED + 31), first, last, KILLS)

    seen = Counter[str]()
    orphans: list[str] = []
    cfgs = [crash_config(tmp_path, slow, bucket, f"k{i}", root, LOCK) for i in range(KILLS)]
    warm = prewarmed(cli_cmd(cfgs[0], "ingest"), env)
    for i, offset in enumerate(offsets):
        prefix = f"k{i}"
        killed, _ = go_and_kill(warm, offset)
        if i + 1 < KILLS:  # starts up while this kill point is checked
            warm = prewarmed(cli_cmd(cfgs[i + 1], "ingest"), env)

        # At the kill: what the killed pass left, version by version, and its open uploads. First the
        # requests it had sent that the proxy still holds reach the server (a dead client's request in
        # flight is applied all the same): what is read then is what the rerun finds.
        _drained(proxy)
        at_kill = {k: vs[0]["VersionId"] for k, vs in _versions(client, bucket, prefix + "/r/").items()}
        locked_at_kill = {k for k, v in at_kill.items() if _lock_of(client, bucket, k, v)[0] == "GOVERNANCE"}
        recorded = {k for k, v in at_kill.items() if _crc_recorded(client, bucket, k, v)}
        open_at_kill = {(u["Key"], u["UploadId"]) for u in incomplete_uploads(client, bucket, prefix + "/")}
        committed = manifest_keys(client, bucket, prefix + "/")
        for key in committed:  # a manifest only for a whole save
            check_committed(client, bucket, key, sources[int(key.split("/")[-2].split("-")[1])], read_bytes=False)
        seen[f"killed={killed}, {len(committed)} of {len(STEPS)} committed"] += 1
        seen["uploads open at the kill"] += len(open_at_kill)
        seen["objects unlocked at the kill"] += len(set(at_kill) - locked_at_kill)

        direct = crash_config(tmp_path / "direct", pipeline_s3, bucket, prefix, root, LOCK)
        rerun = ingest(config_path=str(direct))
        assert sorted((o.step, o.ok) for o in rerun) == [(s, True) for s in STEPS], rerun

        # Exactly one committed save of each step, whole.
        assert manifest_keys(client, bucket, prefix + "/") == [
            checkpoint_prefix(prefix, "r", s) + MANIFEST_NAME for s in STEPS
        ]
        catalog = Catalog(open_store(load_config(str(direct)).store), prefix)
        assert [(c.step, c.save, c.verified) for c in catalog.current("r")] == [(s, 1, True) for s in STEPS]
        assert Counter(e.step for e in catalog.events("r") if e.event == "verified") == dict.fromkeys(STEPS, 1)

        versions = _versions(client, bucket, prefix + "/r/")
        for s in STEPS:
            save = checkpoint_prefix(prefix, "r", s)
            m = check_committed(client, bucket, save + MANIFEST_NAME, sources[s])
            locked_until = m["uploaded_at"] + DAYS * 86_400
            referenced = {save + f["path"] for f in m["files"]} | {save + MANIFEST_NAME}
            for key in sorted(referenced):  # every object and the manifest locked past commit + days
                mode, until = _lock_of(client, bucket, key)
                assert mode == "GOVERNANCE", f"kill {i} at {offset} s: {key} is not locked ({mode})"
                assert until is not None and until.timestamp() >= locked_until, (key, until)
            current = {k: next(v["VersionId"] for v in versions[k] if v["IsLatest"]) for k in referenced}
            for key in sorted(k for k in at_kill if k in referenced):
                # The rerun reuses every object the killed pass completed: its CRC32C recorded (the
                # server's checksum, or ckptvault's tag) or, a multipart object killed before its tag
                # (Ceph RGW), read back (ckptvault.ingest.steps._stored_crc32c). Nothing is sent twice.
                how = "its CRC32C recorded" if key in recorded else "read back"
                assert current.get(key) == at_kill[key], f"kill {i}: {key} was sent again ({how} at the kill)"
                lock = "locked" if key in locked_at_kill else "unlocked"
                seen[f"{lock} at the kill, reused, {how}"] += 1
            for key, vs in versions.items():
                if not key.startswith(save):
                    continue
                for v in vs:
                    if key in referenced and v["VersionId"] == current[key]:
                        continue
                    # an orphan: a version the manifest does not reference, billed (the bucket is
                    # versioned) and, if locked, undeletable until its date. Every completed object is
                    # reused, so none is left, locked or not.
                    mode, _ = _lock_of(client, bucket, key, v["VersionId"])
                    written = "the killed pass" if at_kill.get(key) == v["VersionId"] else "the rerun"
                    orphans.append(f"{key} by {written} ({mode or 'unlocked'})")
        assert not orphans, f"kill {i}: versions no manifest references: {orphans}"

        # Open uploads after the rerun: only the killed pass's; the ingest role's abort (no bypass) ends them.
        left = {(u["Key"], u["UploadId"]) for u in incomplete_uploads(client, bucket, prefix + "/")}
        assert left <= open_at_kill, f"kill {i}: the rerun left uploads open: {left - open_at_kill}"
        seen["uploads open after the rerun"] += len(left)
        store = open_store(load_config(str(direct)).store)
        abort_the_kills_uploads(client, store, bucket, prefix, {s: sources[s] for s in STEPS})

    proxy.stop()
    assert_abort_rules(client, bucket, [f"k{i}" for i in range(KILLS)])
    print(
        f"\n[crash locked ingest, {pipeline_s3.kind}] objects written from {first:.1f} s to {last:.1f} s after go "
        f"(first calibration: {windows[0][0]:.1f}-{windows[0][1]:.1f} s); "
        f"SIGKILLs at {offsets}; {json.dumps(dict(seen), sort_keys=True)}; orphans: {orphans or 'none'}; "
        f"{time.monotonic() - t_start:.0f} s in all"
    )


def test_an_abandoned_locked_multipart_upload_is_aborted_without_the_bypass(
    any_s3: S3Endpoint, locked_bucket: Any, tmp_path: Path, s3_env: Any
) -> None:
    """What a kill between CreateMultipartUpload (with the lock) and its completion leaves: an upload
    that is listed, whose parts are listed, that holds no object version (there is nothing to lock
    yet) and that the ingest role's abort (S3Store.abort_multipart_uploads, as ingest and the cleanup
    call it: no bypass header) removes, parts and all."""
    s3_env(any_s3)
    bucket = locked_bucket(any_s3)
    client = any_s3.client()
    key = checkpoint_prefix("t", "r", 100) + "mp_rank_00_model_states.pt"
    until = datetime.now(UTC) + timedelta(days=DAYS)
    upload = client.create_multipart_upload(
        Bucket=bucket, Key=key, ObjectLockMode="GOVERNANCE", ObjectLockRetainUntilDate=until
    )["UploadId"]
    part = b"\x5a" * (5 * MiB)
    client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=part, ContentMD5=content_md5(part))

    assert [(u["Key"], u["UploadId"]) for u in incomplete_uploads(client, bucket, "t/")] == [(key, upload)]
    parts = client.list_parts(Bucket=bucket, Key=key, UploadId=upload).get("Parts", [])
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, len(part))]
    assert _versions(client, bucket, "t/") == {}, "an incomplete upload made an object version"
    with pytest.raises(ClientError) as absent:
        client.head_object(Bucket=bucket, Key=key)
    assert absent.value.response["Error"]["Code"] in ("404", "NoSuchKey")

    cfg = write_config(tmp_path / "c.toml", any_s3, bucket, [])
    assert open_store(load_config(str(cfg)).store).abort_multipart_uploads("t/") == 1
    assert incomplete_uploads(client, bucket, "t/") == []
    assert _versions(client, bucket, "t/") == {}
    with pytest.raises(ClientError) as gone:
        client.list_parts(Bucket=bucket, Key=key, UploadId=upload)
    assert gone.value.response["Error"]["Code"] in ("NoSuchUpload", "NoSuchKey")
