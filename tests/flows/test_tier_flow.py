"""The tier flow on real stores: Ceph's COLD class (client copies and its own lifecycle engine) and
AWS archival classes on moto."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.config import load_config
from ckptvault.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.store import open_store
from ckptvault.synthetic import write_checkpoint
from tests.helpers import write_config

MiB = 2**20
DAY = 86400.0


def _env(monkeypatch: pytest.MonkeyPatch, endpoint: Any) -> None:
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)


def _classes(client: Any, bucket: str, prefix: str) -> dict[str, str]:
    out = {}
    for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        out[o["Key"]] = client.head_object(Bucket=bucket, Key=o["Key"]).get("StorageClass", "STANDARD")
    return out


def _ingest(endpoint: Any, bucket: str, tmp_path: Path, steps: list[int], policy: str) -> Path:
    from flows.ingest import ingest

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
    from flows.restore import restore
    from flows.tier import tier

    _env(monkeypatch, ceph)
    bucket = bucket_factory(ceph)
    policy = (
        '[policy]\nkeep_hot = 1\ntiers = [{ after_days = 7, tier = "cold" }]\n'
        '[policy.classes]\ncold = "COLD"\n[policy.prices]\nCOLD = 0.004\n'
    )
    cfg = _ingest(ceph, bucket, tmp_path, [10, 20, 30], policy)
    dry = tier(config_path=str(cfg), now=time.time() + 30 * DAY)
    assert dry["applied"] is False
    client = ceph.client()
    assert set(_classes(client, bucket, "t/").values()) == {"STANDARD"}, "a dry run changed something"

    report = tier(apply=True, config_path=str(cfg), now=time.time() + 30 * DAY)
    assert report["applied"] is True
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
    assert "transition" not in again["actions"]
    # what sits in COLD restores intact
    out = restore(run="r", step="10", dest=str(tmp_path / "out"), config_path=str(cfg))
    assert out["status"] == "restored"
    assert (tmp_path / "out" / "checkpoint-10" / "trainer_state.json").exists()


@pytest.mark.ceph
def test_server_mode_lets_cephs_lifecycle_engine_move_tagged_objects(
    prefect_api: None, ceph: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.tier import tier

    _env(monkeypatch, ceph)
    bucket = bucket_factory(ceph)
    policy = (
        '[policy]\nkeep_hot = 1\napply_mode = "server"\ntiers = [{ after_days = 7, tier = "cold" }]\n'
        '[policy.classes]\ncold = "COLD"\n[policy.prices]\nCOLD = 0.004\n'
    )
    cfg = _ingest(ceph, bucket, tmp_path, [10, 20], policy)
    tier(apply=True, config_path=str(cfg), now=time.time() + 30 * DAY)
    client = ceph.client()
    rules = client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    ids = {r["ID"] for r in rules}
    assert "ckptvault-tier-cold-t" in ids and "ckptvault-abort-incomplete-mpu-t" in ids
    old = checkpoint_prefix("t", "r", 10)
    key = next(k for k in _classes(client, bucket, old) if k.endswith(".safetensors"))
    tags = {t["Key"]: t["Value"] for t in client.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]}
    assert tags["ckptvault-tier"] == "cold"
    # rgw_lc_debug_interval makes a lifecycle "day" a few seconds: wait for Ceph itself to move it
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        if client.head_object(Bucket=bucket, Key=key).get("StorageClass") == "COLD":
            break
        time.sleep(3)
    else:
        pytest.fail(f"Ceph's lifecycle engine did not move {key} to COLD within 150 s")
    newest = checkpoint_prefix("t", "r", 20)
    assert {c for k, c in _classes(client, bucket, newest).items()} == {"STANDARD"}


def test_archive_on_moto_only_when_it_pays_and_restores_with_a_thaw(
    prefect_api: None, moto_server: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.restore import restore
    from flows.tier import tier

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
    assert "transition" not in small["actions"] and small["actions"].count("skip") == 3
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
    from flows.ingest import ingest

    for step in (50, 60):
        write_checkpoint(tmp_path / "hot", "hf", step, 1 * MiB, shards=1, seed=step)
    ingest(config_path=str(cfg))
    later = tier(apply=True, config_path=str(cfg), now=time.time() + 100 * DAY)
    assert later["actions"].count("transition") == 2
    assert [data_classes(s) for s in (10, 20, 30, 40, 50, 60)] == [{"GLACIER"}] * 3 + [{"DEEP_ARCHIVE"}] * 2 + [
        {"STANDARD"}
    ]
    states = {s.step: s for s in Catalog(open_store(load_config(str(cfg)).store), "t").current("r")}
    assert all(states[s].verified for s in (10, 20, 30, 40, 50, 60)), "a checkpoint was lost"
    for step, cls in ((10, "GLACIER"), (40, "DEEP_ARCHIVE")):
        out = restore(run="r", step=str(step), dest=str(tmp_path / f"out{step}"), tier="Bulk", config_path=str(cfg))
        assert out["status"] == "restored" and cls in out["estimate"]
        src = tmp_path / "hot" / f"checkpoint-{step}"
        got = tmp_path / f"out{step}" / f"checkpoint-{step}"
        assert {p.name: p.read_bytes() for p in src.iterdir()} == {p.name: p.read_bytes() for p in got.iterdir()}
