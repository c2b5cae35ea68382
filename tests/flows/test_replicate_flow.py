"""The replicate flow against a real Prefect API, SeaweedFS primary and two replicas (two more buckets
of the session's SeaweedFS: the flow's wiring is under test here; a replica on another server, Ceph RGW,
is tests/integration/test_replicate_cli.py's). One ingest, then three flow runs:

1. one primary object of step 200 has rotted (same size, other bytes): each replica is its own task run,
   step 100 reaches both, step 200 neither; the run ends Failed, the artifact says so per replica, and
   Slack gets one replicate_failed alert per replica naming it and the save (and no flow_failed on top);
2. the object repaired: the rerun copies step 200 only, and every object on each replica is the
   primary's, key for key;
3. nothing new: the run copies nothing and its artifact says so;
then one replica by name, an unknown name (Failed, naming it) and a config without replicas (nothing to do)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.slack_recorder import SLACK_TOKEN, SlackRecorder

MiB = 2**20


def _objects(client: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) :]] = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


def _replica(name: str, endpoint: Any, bucket: str) -> str:
    return (
        f'[[replicas]]\nname = "{name}"\nbucket = "{bucket}"\nprefix = "dr"\nendpoint_url = "{endpoint.url}"\n'
        f'region = "{endpoint.region}"\n'
    )


def _artifact(flow_run_id: Any) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        (found,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["replicate-report"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]),
            )
        )
    assert found.type == "markdown"
    return str(found.data)


def _task_runs(flow_run_id: Any) -> dict[str, str]:
    """This flow run's task runs: name -> state type."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name: str(r.state_type.value) if r.state_type else "" for r in runs}


def test_replicate_flow_one_task_run_per_replica_artifact_alerts_then_a_rerun_copies_nothing(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    slack: SlackRecorder,
) -> None:  # fmt: skip
    from ckptvault.replication import ReplicateIncomplete, ReplicateResult
    from ckptvault_prefect.flows.replicate import replicate

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", SLACK_TOKEN)
    primary, dr, dr2 = bucket_factory(seaweedfs), bucket_factory(seaweedfs), bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    for step in (100, 200):
        write_checkpoint(root, "hf", step, 1 * MiB, shards=1, seed=step)
    extra = (
        _replica("dr", seaweedfs, dr)
        + _replica("dr2", seaweedfs, dr2)
        + f'[notify]\nslack_base_url = "{slack.base_url}"\nchannel = "#ckpt-test"\n'
    )
    cfg = write_config(tmp_path / "c.toml", seaweedfs, primary, [("r", root, "hf")], extra=extra)
    assert main(["--config", str(cfg), "ingest"]) == 0
    s3 = seaweedfs.client()
    src = _objects(s3, primary, "t/r/")
    victim = next(k for k in src if k.startswith("step-0000000200/") and k.endswith(".safetensors"))
    s3.put_object(Bucket=primary, Key="t/r/" + victim, Body=random.Random(7).randbytes(len(src[victim])))
    # the hot file touched since its ingest: the pass reads the primary's (rotten) object instead
    hot = root / "checkpoint-200" / victim.split("/", 1)[1]
    os.utime(hot, (hot.stat().st_atime, hot.stat().st_mtime + 5))
    slack.clear()

    # 1. a rotten object on the primary: that save reaches neither replica, the run ends Failed
    state = replicate(config_path=str(cfg), return_state=True)
    assert state.is_failed(), state
    err = state.result(raise_on_failure=False)
    assert isinstance(err, ReplicateIncomplete), err
    first = err.result
    assert [p.replica for p in first.passes] == ["dr", "dr2"] and first.stopped == {}
    for p in first.passes:
        assert [(s.step, s.save) for s in p.copied] == [(100, 1)] and p.present == 0
        assert [f.label for f in p.failures] == ["r step 200 save 1"] and "CRC32C" in p.failures[0].error
    run1 = state.state_details.flow_run_id
    tasks = _task_runs(run1)
    assert tasks["replicate-dr"] == tasks["replicate-dr2"] == "COMPLETED"  # a save's failure is in its result
    assert {"open-replica-dr", "open-replica-dr2", "wanted-dr", "wanted-dr2"} <= set(tasks)
    md = _artifact(run1)
    for name in ("dr", "dr2"):
        (copied,) = [s for p in first.passes if p.replica == name for s in p.copied]
        assert f"| {name} | 1 | 0 | {copied.copied} | 0 | {copied.bytes} (" in md
        assert f"| {name} | r | 100 | 1 | {copied.copied} | 0 | {copied.bytes} |" in md
        assert f"- {name}: r step 200 save 1: " in md
    texts = [r.payload["text"] for r in slack.delivered()]
    # one per replica, and nothing else: the failure hook stays quiet (ReplicateIncomplete is AlreadyAlerted)
    assert len(texts) == 2 and all("Copy of r step 200 save 1 to replica" in t for t in texts), texts
    assert any("replica dr FAILED" in t for t in texts) and any("replica dr2 FAILED" in t for t in texts)
    for bucket in (dr, dr2):
        assert "step-0000000200/_MANIFEST.json" not in _objects(s3, bucket, "dr/r/")

    # 2. repaired: the rerun copies step 200 only, and each replica is the primary, byte for byte
    s3.put_object(Bucket=primary, Key="t/r/" + victim, Body=src[victim])
    state = replicate(config_path=str(cfg), return_state=True)
    assert state.is_completed(), state
    second: ReplicateResult = state.result()
    assert second.ok and [[(s.step, s.save) for s in p.copied] for p in second.passes] == [[(200, 1)], [(200, 1)]]
    assert [p.present for p in second.passes] == [1, 1]
    for bucket in (dr, dr2):
        assert _objects(s3, bucket, "dr/r/") == src

    # 3. nothing new: nothing copied, and the artifact says so
    state = replicate(config_path=str(cfg), return_state=True)
    assert state.is_completed(), state
    third: ReplicateResult = state.result()
    assert [(p.copied, p.present, p.failures) for p in third.passes] == [([], 2, []), ([], 2, [])]
    md = _artifact(state.state_details.flow_run_id)
    assert "| dr | 0 | 2 | 0 | 0 | 0 (0 B) | 0.0 | 0 |" in md and "| dr2 | 0 | 2 | 0 | 0 | 0 (0 B) | 0.0 | 0 |" in md
    assert "### Saves copied" not in md
    assert len(slack.delivered()) == 2  # no alert from a run that copied everything it had to

    # one replica by name; an unknown name fails the run naming it; a config without replicas does nothing
    state = replicate(replica="dr2", config_path=str(cfg), return_state=True)
    assert state.is_completed() and [p.replica for p in state.result().passes] == ["dr2"]
    state = replicate(replica="nope", config_path=str(cfg), return_state=True)
    assert state.is_failed() and "no [[replicas]] entry is named 'nope' (configured: dr, dr2)" in str(state.message)
    bare = write_config(tmp_path / "bare.toml", seaweedfs, primary, [("r", root, "hf")])
    state = replicate(config_path=str(bare), return_state=True)
    assert state.is_completed() and state.result() == ReplicateResult()
