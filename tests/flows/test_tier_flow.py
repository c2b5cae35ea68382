"""The tier flow on real stores: Ceph's COLD class (client copies and its own lifecycle engine), AWS
archival classes on moto, and local eviction re-checked against the disk and the store on SeaweedFS."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog, CheckpointState
from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.slack_recorder import SlackRecorder

MiB = 2**20
DAY = 86400.0
TOKEN = "xoxb-ckptvault-test-tier-0123456789"


def _env(monkeypatch: pytest.MonkeyPatch, endpoint: Any) -> None:
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)


def _classes(client: Any, bucket: str, prefix: str) -> dict[str, str]:
    out = {}
    for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        out[o["Key"]] = client.head_object(Bucket=bucket, Key=o["Key"]).get("StorageClass", "STANDARD")
    return out


def _ingest(endpoint: Any, bucket: str, tmp_path: Path, steps: list[int], policy: str) -> Path:
    from ckptvault_prefect.flows.ingest import ingest

    root = tmp_path / "hot"
    root.mkdir()
    for s in steps:
        write_checkpoint(root, "hf", s, 1 * MiB, shards=1, seed=s)
    cfg = write_config(tmp_path / "c.toml", endpoint, bucket, [("r", root, "hf")], extra=policy)
    ingest(config_path=str(cfg))
    return cfg


@pytest.mark.ceph
def test_client_mode_moves_all_but_the_newest_to_cold_on_ceph(
    prefect_api: None, ceph: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_prefect.flows.restore import restore
    from ckptvault_prefect.flows.tier import tier

    _env(monkeypatch, ceph)
    bucket = bucket_factory(ceph)
    policy = (
        '[policy]\nkeep_hot = 1\ntiers = [{ after_days = 7, tier = "cold" }]\n'
        '[policy.classes]\ncold = "COLD"\n[policy.prices]\nCOLD = 0.004\n'
    )
    cfg = _ingest(ceph, bucket, tmp_path, [10, 20, 30], policy)
    dry = tier(config_path=str(cfg), now=time.time() + 30 * DAY)
    assert dry.applied is False
    client = ceph.client()
    assert set(_classes(client, bucket, "t/").values()) == {"STANDARD"}, "a dry run changed something"

    report = tier(apply=True, config_path=str(cfg), now=time.time() + 30 * DAY)
    assert report.applied is True
    for step, want in ((10, "COLD"), (20, "COLD"), (30, "STANDARD")):
        classes = _classes(client, bucket, checkpoint_prefix("t", "r", step))
        data = {k: c for k, c in classes.items() if not k.endswith(MANIFEST_NAME) and "_VALIDATION" not in k}
        assert data and set(data.values()) == {want}, (step, classes)
        assert classes[checkpoint_prefix("t", "r", step) + MANIFEST_NAME] == "STANDARD"  # readable without a thaw
    states = {s.step: s for s in Catalog(open_store(load_config(str(cfg)).store), "t").current("r")}
    assert (states[10].last_event, states[10].storage_class) == ("transitioned", "COLD")
    assert states[30].storage_class == "STANDARD"
    # a second apply converges: nothing more to move
    again = tier(apply=True, config_path=str(cfg), now=time.time() + 30 * DAY)
    assert "transition" not in again.actions
    # what sits in COLD restores intact
    out = restore(run="r", step="10", dest=str(tmp_path / "out"), config_path=str(cfg))
    assert out.status == "restored"
    assert (tmp_path / "out" / "checkpoint-10" / "trainer_state.json").exists()


@pytest.mark.ceph
def test_server_mode_records_the_schedule_then_the_move_cephs_lifecycle_engine_made(
    prefect_api: None, ceph: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_prefect.flows.tier import tier

    _env(monkeypatch, ceph)
    bucket = bucket_factory(ceph)
    policy = (
        '[policy]\nkeep_hot = 1\napply_mode = "server"\ntiers = [{ after_days = 7, tier = "cold" }]\n'
        '[policy.classes]\ncold = "COLD"\n[policy.prices]\nCOLD = 0.004\n'
    )
    cfg = _ingest(ceph, bucket, tmp_path, [10, 20], policy)
    before = time.time()
    first = tier(apply=True, config_path=str(cfg), now=time.time() + 30 * DAY)
    client = ceph.client()
    rules = client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    ids = {r["ID"] for r in rules}
    assert "ckptvault-tier-cold-t" in ids and "ckptvault-abort-incomplete-mpu-t" in ids
    old = checkpoint_prefix("t", "r", 10)
    key = next(k for k in _classes(client, bucket, old) if k.endswith(".safetensors"))
    tags = {t["Key"]: t["Value"] for t in client.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}
    assert tags["ckptvault-tier"] == "cold"
    # the catalog says what is true: still STANDARD, COLD scheduled by that rule from the next midnight
    # UTC (the objects are older than the rule's 1 day in the plan's clock, but S3 counts real days)
    s10 = _states(cfg)[10]
    assert (s10.storage_class, s10.last_event, s10.scheduled_class) == ("STANDARD", "transition_scheduled", "COLD")
    assert s10.scheduled_at is not None and s10.scheduled_at % DAY == 0
    assert before + DAY <= s10.scheduled_at <= before + 2 * DAY
    (sched,) = first.scheduled
    assert (sched.step, sched.rule, sched.takes_effect) == (10, "ckptvault-tier-cold-t", s10.scheduled_at)
    # rgw_lc_debug_interval makes a lifecycle "day" a few seconds: wait for Ceph itself to move it
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        if _data_classes(client, bucket, old) == {"COLD"}:
            break
        time.sleep(3)
    else:
        pytest.fail(f"Ceph's lifecycle engine did not move {old} to COLD within 150 s")
    newest = checkpoint_prefix("t", "r", 20)
    assert {c for k, c in _classes(client, bucket, newest).items()} == {"STANDARD"}
    # the next tier run sees the move in the listing and records it; nothing is scheduled again
    second = tier(apply=True, config_path=str(cfg), now=time.time() + 30 * DAY)
    assert [(o.step, o.scheduled_class) for o in second.observed] == [(10, "COLD")]
    assert second.scheduled == () and "transition" not in second.actions
    s10 = _states(cfg)[10]
    assert (s10.storage_class, s10.last_event, s10.scheduled_class, s10.scheduled_at) == (
        "COLD", "transitioned", "", None,
    )  # fmt: skip
    assert _states(cfg)[20].storage_class == "STANDARD"


def test_archive_on_moto_only_when_it_pays_and_restores_with_a_thaw(
    prefect_api: None, moto_server: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_prefect.flows.restore import restore
    from ckptvault_prefect.flows.tier import tier

    _env(monkeypatch, moto_server)
    bucket = bucket_factory(moto_server)
    base_policy = (
        "[policy]\nkeep_hot = 1\nmilestone_every_steps = 20\n"
        'tiers = [{ after_days = 30, tier = "cold" }, { after_days = 90, tier = "archive" }]\n'
    )
    cfg = _ingest(moto_server, bucket, tmp_path, [10, 20, 30, 40], base_policy)
    client = moto_server.client()
    # 1 MiB checkpoints at list prices: request fees and per-object overhead outweigh the saving
    small = tier(apply=True, config_path=str(cfg), now=time.time() + 40 * DAY)
    assert "transition" not in small.actions and small.actions.count("skip") == 3
    assert set(_classes(client, bucket, "t/").values()) == {"STANDARD"}
    # at prices where the moves pay, they happen: the planner judges money, not size
    cfg.write_text(cfg.read_text() + "[policy.prices]\nSTANDARD = 40.0\nGLACIER = 20.0\n")

    def data_classes(step: int) -> set[str]:
        classes = _classes(client, bucket, checkpoint_prefix("t", "r", step))
        return {c for k, c in classes.items() if not k.endswith(".json")}

    tier(apply=True, config_path=str(cfg), now=time.time() + 40 * DAY)
    assert [data_classes(s) for s in (10, 20, 30, 40)] == [{"GLACIER"}] * 3 + [{"STANDARD"}]
    key = next(k for k in _classes(client, bucket, checkpoint_prefix("t", "r", 10)) if k.endswith(".safetensors"))
    with pytest.raises(client.exceptions.InvalidObjectState):
        client.get_object(Bucket=bucket, Key=key)
    # newer checkpoints arrive; 100 days on, STANDARD ones go straight to DEEP_ARCHIVE, while the
    # GLACIER ones are left for the lifecycle engine (S3 copies an archived object only once restored)
    from ckptvault_prefect.flows.ingest import ingest

    for step in (50, 60):
        write_checkpoint(tmp_path / "hot", "hf", step, 1 * MiB, shards=1, seed=step)
    ingest(config_path=str(cfg))
    later = tier(apply=True, config_path=str(cfg), now=time.time() + 100 * DAY)
    assert later.actions.count("transition") == 2
    assert [data_classes(s) for s in (10, 20, 30, 40, 50, 60)] == [{"GLACIER"}] * 3 + [{"DEEP_ARCHIVE"}] * 2 + [
        {"STANDARD"}
    ]
    states = {s.step: s for s in Catalog(open_store(load_config(str(cfg)).store), "t").current("r")}
    assert all(states[s].verified for s in (10, 20, 30, 40, 50, 60)), "a checkpoint was lost"
    for step, cls in ((10, "GLACIER"), (40, "DEEP_ARCHIVE")):
        out = restore(run="r", step=str(step), dest=str(tmp_path / f"out{step}"), tier="Bulk", config_path=str(cfg))
        assert out.status == "restored" and cls in out.estimate
        src = tmp_path / "hot" / f"checkpoint-{step}"
        got = tmp_path / f"out{step}" / f"checkpoint-{step}"
        assert {p.name: p.read_bytes() for p in src.iterdir()} == {p.name: p.read_bytes() for p in got.iterdir()}


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackRecorder]:
    rec = SlackRecorder(token=TOKEN)
    rec.start()
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", TOKEN)
    try:
        yield rec
    finally:
        rec.down()


def _notify(rec: SlackRecorder) -> str:
    return f'[notify]\nslack_base_url = "{rec.base_url}"\nchannel = "#ckpt-test"\n'


def _states(cfg: Path) -> dict[int, CheckpointState]:
    return {s.step: s for s in Catalog(open_store(load_config(str(cfg)).store), "t").current("r")}


def _data_classes(client: Any, bucket: str, prefix: str) -> set[str]:
    classes = _classes(client, bucket, prefix)
    return {c for k, c in classes.items() if not k.endswith(MANIFEST_NAME) and "_VALIDATION" not in k}


def _local_files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()} if d.exists() else set()


def _artifact(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    newest = max(found, key=lambda a: a.created or 0)
    return str(newest.data)


def test_eviction_skips_a_local_copy_rewritten_after_upload_and_evicts_the_others(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    slack: SlackRecorder,
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.tier import tier

    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    cfg = _ingest(
        seaweedfs, bucket, tmp_path, [10, 20, 30], "[policy]\nkeep_hot = 1\nkeep_local = 1\n" + _notify(slack)
    )
    hot = tmp_path / "hot"
    before = {s: _local_files(hot / f"checkpoint-{s}") for s in (10, 20, 30)}
    # the training job writes step 10 again in place: same size, other bytes, a later mtime
    victim = hot / "checkpoint-10" / "model.safetensors"
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    st = victim.stat()
    os.utime(victim, (st.st_atime, st.st_mtime + 60))

    state = tier(apply=True, config_path=str(cfg), return_state=True)
    assert state.is_completed(), state
    report = state.result()
    assert [s.key for s in report.evict_skipped] == [("r", 10, 1)]
    (skip,) = report.evict_skipped
    assert skip.store == () and len(skip.local) == 1 and str(victim) in str(skip.local[0])
    # nothing of step 10 was deleted; step 20 was evicted; the newest stays
    assert _local_files(hot / "checkpoint-10") == before[10] and victim.read_bytes() == bytes(data)
    assert _local_files(hot / "checkpoint-20") == set()
    assert _local_files(hot / "checkpoint-30") == before[30]

    states = _states(cfg)
    assert (states[10].last_event, states[10].local_evicted) == ("evict_skipped", False)
    assert states[10].state == "verified"  # the stored copy is still good: only the local one changed
    detail = json.loads(states[10].detail)
    assert detail["local"] == [str(m) for m in skip.local] and "local files differ" in detail["skipped"]
    assert states[20].local_evicted and not states[30].local_evicted
    posts = [p["text"] for p in (r.payload for r in slack.delivered()) if "NOT evicted" in p["text"]]
    assert len(posts) == 1 and "r step 10 save 1" in posts[0]
    assert "| r | 10 | 1 |" in _artifact("tier-applied")

    # every tier run checks again, and still deletes nothing of the rewritten copy
    again = tier(apply=True, config_path=str(cfg), return_state=True)
    assert again.is_completed() and [s.step for s in again.result().evict_skipped] == [10]
    assert _local_files(hot / "checkpoint-10") == before[10]

    # the metrics' ledger (docs/FORMAT.md): the flows' successes and the alert delivered, folded by tier
    from ckptvault.config import load_config
    from ckptvault.observe import ledger
    from ckptvault.store import open_store

    c = load_config(str(cfg))
    led = ledger.load(open_store(c.store), c.store.prefix)
    assert {"ingest", "tier"} <= led.last_success.keys() and led.totals()["alerts_sent|evict_skipped"] >= 1
    assert len(ledger.read_parts(open_store(c.store), c.store.prefix)) == 1


def test_eviction_skips_a_checkpoint_whose_object_vanished_from_the_store_and_the_run_goes_on(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    slack: SlackRecorder,
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.tier import tier

    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    # prices at which a move to STANDARD_IA pays for 1 MiB, so the checkpoints also have transitions due
    policy = (
        '[policy]\nkeep_hot = 1\nkeep_local = 1\ntiers = [{ after_days = 7, tier = "warm" }]\n'
        "[policy.prices]\nSTANDARD = 40.0\nSTANDARD_IA = 20.0\n" + _notify(slack)
    )
    cfg = _ingest(seaweedfs, bucket, tmp_path, [10, 20, 30], policy)
    hot = tmp_path / "hot"
    before = {s: _local_files(hot / f"checkpoint-{s}") for s in (10, 20, 30)}
    client = seaweedfs.client()
    base20 = checkpoint_prefix("t", "r", 20)
    gone = next(k for k in _classes(client, bucket, base20) if k.endswith(".safetensors"))
    client.delete_object(Bucket=bucket, Key=gone)  # behind ckptvault's back

    state = tier(apply=True, config_path=str(cfg), now=time.time() + 40 * DAY, return_state=True)
    assert state.is_completed(), state
    (skip,) = state.result().evict_skipped
    assert (skip.step, skip.local) == (20, ()) and [str(m) for m in skip.store] == [f"{gone}: missing from the store"]
    assert _local_files(hot / "checkpoint-20") == before[20], "the only complete copy was deleted"
    assert _local_files(hot / "checkpoint-10") == set()
    # the rest of the plan was carried out: step 10 moved; step 20, incomplete in the store, was left alone
    assert _data_classes(client, bucket, checkpoint_prefix("t", "r", 10)) == {"STANDARD_IA"}
    assert set(_classes(client, bucket, base20).values()) == {"STANDARD"}
    states = _states(cfg)
    assert (states[10].storage_class, states[10].local_evicted) == ("STANDARD_IA", True)
    assert (states[20].last_event, states[20].storage_class, states[20].local_evicted) == (
        "evict_skipped", "STANDARD", False,
    )  # fmt: skip
    assert gone in json.loads(states[20].detail)["store"][0]
    posts = [p["text"] for p in (r.payload for r in slack.delivered()) if "NOT evicted" in p["text"]]
    assert len(posts) == 1 and "r step 20 save 1" in posts[0] and "stored copy" in posts[0]


def test_server_mode_on_moto_dates_the_move_by_the_rule_and_records_it_once_the_listing_shows_it(
    prefect_api: None, moto_server: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.flows.tier import tier

    _env(monkeypatch, moto_server)
    bucket = bucket_factory(moto_server)
    # warm after 7 days, at prices where it pays: the STANDARD_IA rule itself needs 30 days (AWS's minimum)
    policy = (
        '[policy]\nkeep_hot = 1\napply_mode = "server"\ntiers = [{ after_days = 7, tier = "warm" }]\n'
        "[policy.prices]\nSTANDARD = 40.0\nSTANDARD_IA = 20.0\n"
    )
    cfg = _ingest(moto_server, bucket, tmp_path, [10, 20], policy)
    client = moto_server.client()
    old = checkpoint_prefix("t", "r", 10)
    first = tier(apply=True, config_path=str(cfg), now=time.time() + 10 * DAY)
    assert first.actions.count("transition") == 1
    assert _data_classes(client, bucket, old) == {"STANDARD"}  # nothing was copied
    listed = client.list_objects_v2(Bucket=bucket, Prefix=old)["Contents"]
    data = [o for o in listed if not o["Key"].endswith(("_MANIFEST.json", "_VALIDATION.json"))]
    created = max(o["LastModified"].timestamp() for o in data)
    s10 = _states(cfg)[10]
    assert (s10.storage_class, s10.scheduled_class) == ("STANDARD", "STANDARD_IA")
    assert s10.scheduled_at == math.ceil((created + 30 * DAY) / DAY) * DAY  # S3: creation + 30 days, next midnight

    # the engine has not moved it: a later run observes nothing and schedules nothing again
    waiting = tier(apply=True, config_path=str(cfg), now=time.time() + 11 * DAY)
    assert (waiting.observed, waiting.scheduled) == ((), ())
    assert "transition" not in waiting.actions
    assert _states(cfg)[10].scheduled_class == "STANDARD_IA"

    # play the lifecycle engine: moto has none. CopyObject in place into the scheduled class
    for o in data:
        client.copy_object(
            Bucket=bucket, Key=o["Key"], CopySource={"Bucket": bucket, "Key": o["Key"]},
            StorageClass="STANDARD_IA", MetadataDirective="COPY",
        )  # fmt: skip
    seen = tier(apply=True, config_path=str(cfg), now=time.time() + 12 * DAY)
    assert [(o.step, o.scheduled_class) for o in seen.observed] == [(10, "STANDARD_IA")]
    s10 = _states(cfg)[10]
    assert (s10.storage_class, s10.last_event, s10.scheduled_class) == ("STANDARD_IA", "transitioned", "")

    # `both` copies at once and records `transitioned` at once, as client mode does
    bucket2 = bucket_factory(moto_server)
    both = tmp_path / "both"
    both.mkdir()
    cfg2 = write_config(both / "c.toml", moto_server, bucket2, [("r", tmp_path / "hot", "hf")],
                        extra=policy.replace('"server"', '"both"'))  # fmt: skip
    ingest(config_path=str(cfg2))
    out = tier(apply=True, config_path=str(cfg2), now=time.time() + 10 * DAY)
    assert out.scheduled == () and out.actions.count("transition") == 1
    assert _data_classes(client, bucket2, old) == {"STANDARD_IA"}
    s10 = _states(cfg2)[10]
    assert (s10.storage_class, s10.last_event, s10.scheduled_class) == ("STANDARD_IA", "transitioned", "")
