"""The scrub flow against a real Prefect API, SeaweedFS primary and one replica (another bucket of the
session's SeaweedFS; the setup of tests/flows/test_replicate_flow.py). One ingest and one replicate,
then an object on the replica overwritten with other bytes of the same size, and three flow runs:

1. report only (`[scrub] repair` off by default): the run ends Failed; the artifact has a row per copy
   and lists the bad object; Slack gets one scrub_problem naming the replica, the save and the path
   (and no flow_failed on top); nothing is written to the replica;
2. with `[scrub] repair = true`, no sample given: the save left with a problem is rechecked (on top of
   the rotation's one), repaired
   from the primary, the run Completes, the artifact lists the repair, the replica's object is the
   primary's byte for byte;
3. an unknown copy name fails the run naming the known ones."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.flows.test_replicate_flow import _objects, _replica, _task_runs
from tests.helpers import write_config
from tests.slack_recorder import SLACK_TOKEN, SlackRecorder

MiB = 2**20


def _artifact(flow_run_id: Any) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        (found,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["scrub-report"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
            )
        )
    assert found.type == "markdown"
    return str(found.data)


def test_scrub_flow_reports_and_alerts_a_bad_replica_object_then_repairs_it_when_configured(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    slack: SlackRecorder,
) -> None:  # fmt: skip
    from ckptvault.replication.scrub_pass import ScrubReport
    from ckptvault.replication.scrub_report import ScrubIncomplete
    from ckptvault_prefect.flows.scrub import scrub

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", SLACK_TOKEN)
    primary, dr = bucket_factory(seaweedfs), bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    for step in (100, 200):
        write_checkpoint(root, "hf", step, 1 * MiB, shards=1, seed=step)
    extra = _replica("dr", seaweedfs, dr) + f'[notify]\nslack_base_url = "{slack.base_url}"\nchannel = "#ckpt-test"\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, primary, [("r", root, "hf")], extra=extra)
    assert main(["--config", str(cfg), "ingest"]) == 0
    assert main(["--config", str(cfg), "replicate"]) == 0
    s3 = seaweedfs.client()
    src = _objects(s3, primary, "t/r/")
    victim = next(k for k in src if k.startswith("step-0000000200/") and k.endswith(".safetensors"))
    rotten = random.Random(7).randbytes(len(src[victim]))
    s3.put_object(Bucket=dr, Key="dr/r/" + victim, Body=rotten)
    slack.clear()

    # 1. report only: Failed, the artifact and one alert name the replica, the save and the path
    state = scrub(sample=2, config_path=str(cfg), return_state=True)
    assert state.is_failed(), state
    err = state.result(raise_on_failure=False)
    assert isinstance(err, ScrubIncomplete), err
    first = err.report
    assert (len(first.saves), first.found, first.left, first.repairs) == (2, 1, 1, [])
    path = victim.split("/", 1)[1]
    run1 = state.state_details.flow_run_id
    tasks = _task_runs(run1)
    assert tasks["open-replica-dr"] == "COMPLETED"
    assert [v for k, v in tasks.items() if k.startswith("scrub-")] == ["COMPLETED"]  # one task run scrubs
    md = _artifact(run1)
    assert "| primary | 2 |" in md and "| dr | 2 |" in md, md
    assert f"- dr: r step 200: {path}: CRC32C mismatch" in md and "Repair: off" in md
    texts = [r.payload["text"] for r in slack.delivered()]
    assert len(texts) == 1, texts  # the failure hook stays quiet: ScrubIncomplete is AlreadyAlerted
    assert "Scrub: dr's copy of r step 200 save 1 is damaged" in texts[0] and path in texts[0]
    assert _objects(s3, dr, "dr/r/")[victim] == rotten

    # 2. [scrub] repair = true: the rechecked save is repaired from the primary
    fixing = write_config(
        tmp_path / "fix.toml", seaweedfs, primary, [("r", root, "hf")], extra=extra + "[scrub]\nrepair = true\n"
    )
    state = scrub(config_path=str(fixing), return_state=True)
    assert state.is_completed(), state
    second: ScrubReport = state.result()
    assert [(r.store, r.path, r.source) for r in second.repairs] == [("dr", path, "primary")]
    # the default sample (a seventh of 2: one) takes step 100 from the rotation, step 200 is rechecked on top
    assert second.ok and [s.step for s in second.saves] == [100, 200] and second.selection.sample == 1
    assert second.selection.rechecked == {("r", 200, 1)}
    md = _artifact(state.state_details.flow_run_id)
    assert "### Repaired" in md and f"| dr | r step 200 save 1 | {path} | primary |" in md
    assert _objects(s3, dr, "dr/r/") == src
    assert len(slack.delivered()) == 1  # nothing left: no alert

    # 3. an unknown copy fails the run, naming the known ones
    state = scrub(replica="nope", config_path=str(cfg), return_state=True)
    assert state.is_failed() and "no [[replicas]] entry is named 'nope' (copies: primary, dr)" in str(state.message)
