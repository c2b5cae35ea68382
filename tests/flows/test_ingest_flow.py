"""The ingest flow end to end on a real Prefect API and real S3 servers (SeaweedFS and Ceph RGW)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import MANIFEST_NAME, Manifest, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.ingest.steps import IngestIncomplete
from ckptvault.store import open_store
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import crc32c_b64, write_config

MiB = 2**20


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch, pipeline_s3: Any) -> Any:
    for k, v in pipeline_s3.env().items():
        monkeypatch.setenv(k, v)
    return pipeline_s3


def _manifest_keys(client: Any, bucket: str) -> set[str]:
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys |= {o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(MANIFEST_NAME)}
    return keys


def test_ingest_uploads_finished_checkpoints_and_skips_in_progress(
    prefect_api: None, creds: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    from ckptvault_prefect.flows.ingest import ingest

    bucket = bucket_factory(creds)
    hf, ds, lt = tmp_path / "hf", tmp_path / "ds", tmp_path / "lt"
    for root in (hf, ds, lt):
        root.mkdir()
    write_checkpoint(hf, "hf", 100, 3 * MiB, shards=2)
    write_checkpoint(hf, "hf", 200, 3 * MiB, shards=2, complete=False)  # no trainer_state.json yet
    write_checkpoint(ds, "deepspeed", 10, 12 * MiB)  # a file above the 5 MiB part size: multipart
    write_checkpoint(lt, "lightning", 7, 2 * MiB)
    cfg_path = write_config(
        tmp_path / "c.toml", creds, bucket, [("hf", hf, "auto"), ("ds", ds, "deepspeed"), ("lt", lt, "lightning")]
    )

    outcomes = ingest(config_path=str(cfg_path))
    results = {(o.run, o.step): o.result for o in outcomes}
    assert results == {("hf", 100): "uploaded", ("hf", 200): "waiting", ("ds", 10): "uploaded", ("lt", 7): "uploaded"}

    client = creds.client()
    manifests = _manifest_keys(client, bucket)
    assert manifests == {
        checkpoint_prefix("t", "hf", 100) + MANIFEST_NAME,
        checkpoint_prefix("t", "ds", 10) + MANIFEST_NAME,
        checkpoint_prefix("t", "lt", 7) + MANIFEST_NAME,
    }
    # bytes in the bucket equal the source; each manifest CRC32C equals an independent computation
    m = Manifest.from_json(
        client.get_object(Bucket=bucket, Key=checkpoint_prefix("t", "ds", 10) + MANIFEST_NAME)["Body"].read()
    )
    src = next(p for p in ds.iterdir() if p.is_dir())
    for f in m.files:
        assert f.crc32c == crc32c_b64(src / f.path), f.path
        body = client.get_object(Bucket=bucket, Key=checkpoint_prefix("t", "ds", 10) + f.path)["Body"].read()
        assert body == (src / f.path).read_bytes(), f.path
    tags = client.get_object_tagging(Bucket=bucket, Key=checkpoint_prefix("t", "ds", 10) + m.files[0].path)["TagSet"]
    assert {t["Key"]: t["Value"] for t in tags} == {"run": "ds", "step": "10", "format": "deepspeed"}

    cfg = load_config(str(cfg_path))
    states = {(s.run, s.step): s for s in Catalog(open_store(cfg.store), "t").current()}
    assert set(states) == {("hf", 100), ("ds", 10), ("lt", 7)}
    assert all(s.state == "verified" and s.verified for s in states.values())

    # once finished, the next pass uploads the in-progress one; the others are skipped
    from ckptvault_cli.synthetic import finish_checkpoint

    finish_checkpoint(hf, "hf", 200)
    again = {(o.run, o.step): o for o in ingest(config_path=str(cfg_path))}
    assert again[("hf", 200)].result == "uploaded"
    assert {k: o.result for k, o in again.items() if k != ("hf", 200)} == dict.fromkeys(
        [("hf", 100), ("ds", 10), ("lt", 7)], "present"
    )


def test_invalid_checkpoints_are_named_recorded_and_not_uploaded(
    prefect_api: None, creds: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    from ckptvault_prefect.flows.ingest import ingest

    bucket = bucket_factory(creds)
    root = tmp_path / "run"
    root.mkdir()
    write_checkpoint(root, "hf", 100, 2 * MiB, shards=2)
    trunc = write_checkpoint(root, "hf", 200, 2 * MiB, shards=2)
    empty = write_checkpoint(root, "hf", 300, 2 * MiB, shards=2)
    missing = write_checkpoint(root, "hf", 400, 2 * MiB, shards=2)
    shard = sorted(trunc.glob("*.safetensors"))[0]
    os.truncate(shard, shard.stat().st_size - 100)
    (empty / "optimizer.pt").write_bytes(b"")
    gone = sorted(missing.glob("model-*.safetensors"))[-1]
    gone.unlink()
    cfg_path = write_config(tmp_path / "c.toml", creds, bucket, [("r", root, "hf")])

    state = ingest(config_path=str(cfg_path), return_state=True)
    assert state.is_failed()
    err = state.result(raise_on_failure=False)
    assert isinstance(err, IngestIncomplete)
    by_step = {o.step: o for o in err.outcomes}
    assert by_step[100].result == "uploaded"
    assert by_step[200].result == "invalid" and shard.name in by_step[200].message
    assert by_step[300].result == "invalid" and "optimizer.pt" in by_step[300].message
    assert by_step[400].result == "invalid" and gone.name in by_step[400].message
    client = creds.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix="t/r/")
    stored_steps = {k["Key"].split("/")[2] for k in listed.get("Contents", [])}
    assert stored_steps == {"step-0000000100"}
    cfg = load_config(str(cfg_path))
    states = {s.step: s for s in Catalog(open_store(cfg.store), "t").current("r")}
    assert {n: states[n].state for n in (200, 300, 400)} == {200: "invalid", 300: "invalid", 400: "invalid"}
    assert shard.name in states[200].detail
    # nothing on the hot tier was deleted
    assert trunc.exists() and empty.exists() and missing.exists()


@pytest.mark.slow
def test_kill9_during_multipart_then_rerun_completes(
    prefect_api: None, creds: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    from prefect.settings import PREFECT_API_URL

    bucket = bucket_factory(creds)
    root = tmp_path / "run"
    root.mkdir()
    ckpt = write_checkpoint(root, "deepspeed", 5, 160 * MiB, seed=3)
    cfg_path = write_config(tmp_path / "c.toml", creds, bucket, [("big", root, "deepspeed")], extra="")
    text = cfg_path.read_text().replace("part_size_mb = 5", "part_size_mb = 5\nmax_concurrency = 1")
    cfg_path.write_text(text)
    env = {**os.environ, **creds.env(), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    cmd = [sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg_path), "ingest"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = creds.client()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            # the checkpoint's own uploads: the store's one-part capability probe completes between the
            # two calls, and ListParts of a completed upload is NoSuchUpload
            ups = client.list_multipart_uploads(Bucket=bucket, Prefix="t/big/").get("Uploads", [])
            if ups:
                try:
                    parts = client.list_parts(Bucket=bucket, Key=ups[0]["Key"], UploadId=ups[0]["UploadId"])
                except client.exceptions.NoSuchUpload:
                    continue
                if parts.get("Parts"):
                    break
            if proc.poll() is not None:
                pytest.fail("ingest finished before it could be killed mid-upload; make the checkpoint bigger")
            time.sleep(0.05)
        else:
            pytest.fail("no multipart upload seen within 120 s")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    manifest_key = checkpoint_prefix("t", "big", 5) + MANIFEST_NAME
    assert _manifest_keys(client, bucket) == set(), "a manifest existed for an interrupted checkpoint"

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    m = Manifest.from_json(client.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    for f in m.files:
        assert f.crc32c == crc32c_b64(ckpt / f.path), f.path
        head = client.head_object(Bucket=bucket, Key=checkpoint_prefix("t", "big", 5) + f.path)
        assert head["ContentLength"] == (ckpt / f.path).stat().st_size
