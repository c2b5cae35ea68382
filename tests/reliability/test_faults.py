"""Ingest, tier and restore through a fault-injecting proxy: every run completes, every checksum holds.

The proxy (tests/faultproxy.py) sits between boto3 and the real server and fails 5% of all requests:
500 InternalError, 503 SlowDown, a reset while the request body is being sent (the server never sees
it), a reset while the response body comes back (the server DID apply the request: the retry repeats
a conditional PUT or a CompleteMultipartUpload that already happened), and added latency. Retries are
botocore's (standard mode), the download's per-range body retries and Prefect's task retries.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault_cli.synthetic import write_checkpoint
from tests.faultproxy import FaultProxy, FaultRates
from tests.helpers import write_config
from tests.reliability.conftest import MiB, check_committed, manifest_keys, tree

FAULT_RATE = 0.05
STEPS = (100, 200, 300)

# Client-mode tiering: everything but the newest goes one tier down at once.
POLICY = {
    "ceph": ('tiers = [{ after_days = 0, tier = "cold" }]\n[policy.prices]\nCOLD = 0.004\n', "COLD"),
    "seaweedfs": ('tiers = [{ after_days = 0, tier = "warm" }]\n', "STANDARD_IA"),
}

RESULTS: dict[str, Any] = {}


def _compressing(cfg: Path, compression: str) -> Path:
    """`[store] compression` set in a config written by write_config."""
    cfg.write_text(cfg.read_text().replace("part_size_mb = 5", f'part_size_mb = 5\ncompression = "{compression}"', 1))
    return cfg


def _assert_compressed(client: Any, bucket: str, compression: str) -> None:
    """With "auto", the frames really were what went through the faults (FP32 torch zips compress)."""
    if compression == "auto":
        for key in manifest_keys(client, bucket):
            m = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
            assert {f.get("codec") for f in m["files"]} == {"shuffle-zstd"}, (key, m["files"])


@pytest.mark.slow
def test_ingest_tier_restore_complete_under_injected_faults(
    prefect_api: None, pipeline_s3: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any
) -> None:
    _ingest_tier_restore_under_faults(pipeline_s3, bucket_factory, tmp_path, s3_env, "off")


@pytest.mark.slow
def test_ingest_tier_restore_complete_under_injected_faults_with_compression(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any
) -> None:
    """The same with `compression = "auto"`: frames uploaded, tiered and decoded through the faults."""
    _ingest_tier_restore_under_faults(seaweedfs, bucket_factory, tmp_path, s3_env, "auto")


def _ingest_tier_restore_under_faults(
    pipeline_s3: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any, compression: str
) -> None:
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.flows.restore import restore
    from ckptvault_prefect.flows.tier import tier

    s3_env(pipeline_s3)
    bucket = bucket_factory(pipeline_s3)
    root = tmp_path / "hot"
    # 24 MiB each: three 8 MiB files, each a two-part multipart upload at part_size_mb = 5
    sources = {s: write_checkpoint(root, "deepspeed", s, 24 * MiB, seed=s) for s in STEPS}
    policy, cold_class = POLICY[pipeline_s3.kind]
    with FaultProxy(pipeline_s3.url, FaultRates.spread(FAULT_RATE, latency_s=0.3), seed=20261130) as proxy:
        via_proxy = dataclasses.replace(pipeline_s3, url=proxy.url)
        # the quality gates in this process, warm: a child process per checkpoint cost ~2 s each; the
        # gates send no request, so the same requests go through the faults either way
        extra = f'[validation]\nisolate = false\n[policy]\nkeep_hot = 1\napply_mode = "client"\n{policy}'
        cfg = write_config(tmp_path / "c.toml", via_proxy, bucket, [("r", root, "deepspeed")], extra=extra)
        _compressing(cfg, compression)

        outcomes = ingest(config_path=str(cfg))
        assert sorted((o.step, o.result) for o in outcomes) == [(s, "uploaded") for s in STEPS]
        after_ingest = proxy.summary()

        report = tier(apply=True, config_path=str(cfg))
        assert report.applied and report.actions.count("transition") == 2, report
        after_tier = proxy.summary()

        for s in STEPS:
            dest = tmp_path / f"restored-{s}"
            out = restore(run="r", step=str(s), dest=str(dest), config_path=str(cfg))
            assert out.status == "restored"
            assert tree(dest / sources[s].name) == tree(sources[s]), f"step {s}: restored bytes differ"
        summary = proxy.summary()
        counts = dict(proxy.counts)

    # Checked on the real server, not through the proxy or our own code.
    client = pipeline_s3.client()
    assert manifest_keys(client, bucket) == [checkpoint_prefix("t", "r", s) + "_MANIFEST.json" for s in STEPS]
    _assert_compressed(client, bucket, compression)
    for s in STEPS:
        m = check_committed(client, bucket, checkpoint_prefix("t", "r", s) + "_MANIFEST.json", sources[s])
        want = "STANDARD" if s == STEPS[-1] else cold_class
        for f in m["files"]:
            head = client.head_object(Bucket=bucket, Key=checkpoint_prefix("t", "r", s) + f["path"])
            assert head.get("StorageClass", "STANDARD") == want, f"step {s} {f['path']}"
            assert head["ContentLength"] == f.get("stored_size", f["size"]), f"step {s} {f['path']}"
    real = load_config(str(cfg)).store.model_copy(update={"endpoint_url": pipeline_s3.url})
    states = Catalog(open_store(real), "t").current("r")
    assert [(c.step, c.verified) for c in states] == [(s, True) for s in STEPS]

    what = f"{pipeline_s3.kind}, compression {compression}"
    print(f"\n[faults {what}] after ingest: {after_ingest}")
    print(f"[faults {what}] after tier:   {after_tier}")
    print(f"[faults {what}] after restore: {summary}")
    print(f"[faults {what}] by operation: {json.dumps(counts, sort_keys=True)}")
    assert proxy.injected > 0, "the proxy injected nothing: the test proved nothing"
    if compression == "off":
        RESULTS[pipeline_s3.kind] = counts


@pytest.mark.slow
@pytest.mark.parametrize("compression", ["off", "auto"])
def test_lost_responses_of_applied_writes_at_30_percent_faults(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any, compression: str
) -> None:
    """The hard case at a high rate: the server applies a conditional PUT (manifest, catalog event) or
    a CompleteMultipartUpload, the response is lost, and botocore's retry meets "already exists"
    (412) or "no such upload". Ingest and tier must still complete, nothing written twice."""
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.flows.tier import tier

    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    sources = {s: write_checkpoint(root, "deepspeed", s, 24 * MiB, seed=s) for s in STEPS}
    rates = FaultRates(reset_response=0.15, reset_request=0.05, error_500=0.05, slowdown_503=0.05)
    with FaultProxy(seaweedfs.url, rates, seed=4) as proxy:
        via_proxy = dataclasses.replace(seaweedfs, url=proxy.url)
        # the quality gates in this process, warm: a child process per checkpoint cost ~2 s each; the
        # gates send no request, so the same requests go through the faults either way
        gates = "[validation]\nisolate = false\n"
        extra = f'{gates}[policy]\nkeep_hot = 1\napply_mode = "client"\n{POLICY["seaweedfs"][0]}'
        cfg = _compressing(
            write_config(tmp_path / "c.toml", via_proxy, bucket, [("r", root, "deepspeed")], extra=extra), compression
        )
        outcomes = ingest(config_path=str(cfg))
        assert sorted((o.step, o.result) for o in outcomes) == [(s, "uploaded") for s in STEPS]
        report = tier(apply=True, config_path=str(cfg))
        assert report.applied and report.actions.count("transition") == 2, report
        summary, counts = proxy.summary(), dict(proxy.counts)
    client = seaweedfs.client()
    _assert_compressed(client, bucket, compression)
    for s in STEPS:
        check_committed(client, bucket, checkpoint_prefix("t", "r", s) + "_MANIFEST.json", sources[s])
    real = load_config(str(cfg)).store.model_copy(update={"endpoint_url": seaweedfs.url})
    states = Catalog(open_store(real), "t").current("r")
    assert [(c.step, c.verified, c.storage_class) for c in states] == [
        (100, True, "STANDARD_IA"), (200, True, "STANDARD_IA"), (300, True, "STANDARD")
    ]  # fmt: skip
    print(f"\n[faults 30%, compression {compression}] {summary}")
    print(f"[faults 30%, compression {compression}] by operation: {json.dumps(counts, sort_keys=True)}")
    assert counts.get("reset_response PutObject", 0) > 0, "no lost PUT response was injected"
