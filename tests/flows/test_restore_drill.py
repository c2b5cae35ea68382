"""Restore and drill flows on a real Prefect API and real S3 servers (SeaweedFS, Ceph RGW, moto for Glacier)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.restore.drill import DrillFailed
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.prefect_events import ckptvault_events

MiB = 2**20


def _env(monkeypatch: pytest.MonkeyPatch, endpoint: Any) -> None:
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)


def _ingested(
    endpoint: Any, bucket: str, tmp_path: Path, fmt: str, steps: list[int], size: int = 3 * MiB
) -> tuple[Path, Path]:
    from ckptvault_prefect.flows.ingest import ingest

    root = tmp_path / "hot"
    root.mkdir()
    for s in steps:
        write_checkpoint(root, fmt, s, size, seed=s)
    cfg = write_config(
        tmp_path / "c.toml",
        endpoint,
        bucket,
        [("r", root, fmt)],
        extra=f'[drill]\nscratch = "{tmp_path / "scratch"}"\nsample = 5\n',
    )
    ingest(config_path=str(cfg))
    return root, cfg


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt,pointer", [("deepspeed", "latest"), ("megatron", "latest_checkpointed_iteration.txt")])
def test_restore_latest_recreates_pointer_and_bytes(
    prefect_api: None,
    seaweedfs: Any,
    bucket_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
    pointer: str,
) -> None:
    from ckptvault_prefect.flows.restore import restore

    _env(monkeypatch, seaweedfs)
    root, cfg = _ingested(seaweedfs, bucket_factory(seaweedfs), tmp_path, fmt, [100, 200])
    dest = tmp_path / "restored"
    since = datetime.now(UTC)
    report = restore(run="r", dest=str(dest), config_path=str(cfg))
    assert report.status == "restored" and report.step == 200
    [event] = ckptvault_events(since, 1)  # for Prefect automations (ckptvault_prefect/runtime/events.py)
    assert (event.event, event.resource.id, event.payload["dest"]) == (
        "ckptvault.checkpoint.restored",
        "ckptvault.checkpoint.r.200.1",
        str(dest.resolve()),
    )
    newest = max((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name)
    assert _tree(dest / newest.name) == _tree(newest)
    assert (dest / pointer).read_text().strip() == (root / pointer).read_text().strip()
    assert not [p for p in tmp_path.iterdir() if "ckptvault-partial" in p.name], "staging dir left behind"


def test_restore_refuses_non_empty_destination_and_force_keeps_old(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_cli.main import main

    _env(monkeypatch, seaweedfs)
    _, cfg = _ingested(seaweedfs, bucket_factory(seaweedfs), tmp_path, "hf", [10])
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "precious.txt").write_text("do not lose me")
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(dest)]) == 2
    assert (dest / "precious.txt").read_text() == "do not lose me"
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(dest), "--force"]) == 0
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("busy.replaced-")]
    assert len(kept) == 1 and (kept[0] / "precious.txt").read_text() == "do not lose me"
    assert (dest / "checkpoint-10" / "trainer_state.json").exists()


def test_restore_detects_corruption_and_leaves_destination_untouched(
    prefect_api: None, pipeline_s3: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_prefect.flows.restore import restore

    _env(monkeypatch, pipeline_s3)
    bucket = bucket_factory(pipeline_s3)
    _, cfg = _ingested(pipeline_s3, bucket, tmp_path, "hf", [10])
    client = pipeline_s3.client()
    key = checkpoint_prefix("t", "r", 10) + "optimizer.pt"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x01  # one flipped bit
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    dest = tmp_path / "out"
    state = restore(run="r", dest=str(dest), config_path=str(cfg), return_state=True)
    assert state.is_failed()
    assert "optimizer.pt" in str(state.result(raise_on_failure=False))
    assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if "ckptvault-partial" in p.name]


@pytest.mark.parametrize("archive_class", ["GLACIER", "DEEP_ARCHIVE"])
def test_restore_thaws_glacier_objects_on_moto(
    prefect_api: None, moto_server: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    archive_class: str,
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.restore import restore

    _env(monkeypatch, moto_server)
    bucket = bucket_factory(moto_server)
    root, cfg = _ingested(moto_server, bucket, tmp_path, "deepspeed", [100], size=1 * MiB)
    client = moto_server.client()
    base = checkpoint_prefix("t", "r", 100)
    data_keys = [
        o["Key"]
        for o in client.list_objects_v2(Bucket=bucket, Prefix=base)["Contents"]
        if not o["Key"].endswith(MANIFEST_NAME)
    ]
    for k in data_keys:
        client.copy_object(
            Bucket=bucket,
            Key=k,
            CopySource={"Bucket": bucket, "Key": k},
            StorageClass=archive_class,
            MetadataDirective="COPY",
        )
    with pytest.raises(client.exceptions.InvalidObjectState):
        client.get_object(Bucket=bucket, Key=data_keys[0])
    report = restore(run="r", dest=str(tmp_path / "out"), tier="Bulk", config_path=str(cfg))
    assert report.status == "restored"
    assert archive_class in report.estimate
    src = next(p for p in root.iterdir() if p.is_dir())
    assert _tree(tmp_path / "out" / src.name) == _tree(src)


def test_drill_passes_then_catches_a_bit_flip(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_prefect.flows.drill import drill

    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    since = datetime.now(UTC)
    _, cfg = _ingested(seaweedfs, bucket, tmp_path, "hf", [10, 20])
    rows = drill(config_path=str(cfg)).drilled
    assert sorted((r.step, r.ok) for r in rows) == [(10, True), (20, True)]
    # the ingest flow's events, each save its resource, and the drill's: each save passed
    first = ckptvault_events(since, 4)
    ingested = [e for e in first if e.event == "ckptvault.checkpoint.verified"]
    assert sorted((e.event, e.resource.id, e.resource["ckptvault.run"]) for e in ingested) == [
        ("ckptvault.checkpoint.verified", f"ckptvault.checkpoint.r.{step}.1", "r") for step in (10, 20)
    ]
    assert sorted(e.resource.id for e in first if e.event == "ckptvault.checkpoint.drill.passed") == [
        f"ckptvault.checkpoint.r.{step}.1" for step in (10, 20)
    ]
    client = seaweedfs.client()
    key = next(
        o["Key"]
        for o in client.list_objects_v2(Bucket=bucket, Prefix=checkpoint_prefix("t", "r", 20))["Contents"]
        if o["Key"].endswith(".safetensors")
    )
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    state = drill(config_path=str(cfg), return_state=True)
    err = state.result(raise_on_failure=False)
    assert isinstance(err, DrillFailed)
    assert os.path.basename(key) in str(err)
    failed = [e for e in ckptvault_events(since, 5) if e.event == "ckptvault.checkpoint.drill.failed"]
    assert [(e.event, e.resource.id) for e in failed] == [
        ("ckptvault.checkpoint.drill.failed", "ckptvault.checkpoint.r.20.1")
    ]
    assert os.path.basename(key) in " ".join(failed[0].payload["problems"])
    assert not list((tmp_path / "scratch").glob("*ckptvault-partial*")), "drill left scratch data behind"


def _resume_deepspeed(run_root: Path) -> dict[str, int]:
    """A checkpoint loader as DeepSpeed's resume does it: read `latest`, open that tag's files."""
    import zipfile

    tag = (run_root / "latest").read_text().strip()
    ckpt = run_root / tag
    opened = {}
    for pt in sorted(ckpt.glob("*.pt")):
        with zipfile.ZipFile(pt) as z:
            assert z.testzip() is None
            opened[pt.name] = len(z.namelist())
    assert opened, f"no model/optimizer states under {ckpt}"
    return opened


def test_restored_run_root_resumes_through_its_pointer_file(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptvault_prefect.flows.restore import restore

    _env(monkeypatch, seaweedfs)
    root, cfg = _ingested(seaweedfs, bucket_factory(seaweedfs), tmp_path, "deepspeed", [100, 200, 300])
    dest = tmp_path / "resume-here"
    restore(run="r", step="200", dest=str(dest), config_path=str(cfg))
    assert (dest / "latest").read_text().strip() == "global_step200"
    assert _resume_deepspeed(dest) == _resume_deepspeed_from(root, "global_step200")


def _resume_deepspeed_from(root: Path, tag: str) -> dict[str, int]:
    import zipfile

    return {pt.name: len(zipfile.ZipFile(pt).namelist()) for pt in sorted((root / tag).glob("*.pt"))}


def test_manifest_escaping_the_destination_is_refused(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from ckptvault_prefect.flows.restore import restore

    _env(monkeypatch, seaweedfs)
    bucket = bucket_factory(seaweedfs)
    _, cfg = _ingested(seaweedfs, bucket, tmp_path, "hf", [10])
    client = seaweedfs.client()
    key = checkpoint_prefix("t", "r", 10) + MANIFEST_NAME
    doc = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    doc["files"][0]["path"] = "../../escaped.txt"
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(doc).encode())
    dest = tmp_path / "deep" / "out"
    state = restore(run="r", dest=str(dest), config_path=str(cfg), return_state=True)
    assert state.is_failed()
    assert "escapes" in str(state.result(raise_on_failure=False))
    assert not list(tmp_path.rglob("escaped.txt")) and not dest.exists()


def test_restored_files_keep_their_mode(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 0600 file comes back 0600 (it used to come back 0644), and an executable stays executable."""
    import json
    import stat

    from ckptvault_prefect.flows.restore import restore

    _env(monkeypatch, seaweedfs)
    root = tmp_path / "hot"
    ckpt = write_checkpoint(root, "deepspeed", 100, 1 * MiB, seed=1)
    files = sorted(p for p in ckpt.rglob("*") if p.is_file())
    files[0].chmod(0o600)
    files[1].chmod(0o750)
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])
    from ckptvault_prefect.flows.ingest import ingest

    ingest(config_path=str(cfg))
    key = checkpoint_prefix("t", "r", 100) + MANIFEST_NAME
    manifest = json.loads(seaweedfs.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    assert {f["path"]: f["mode"] for f in manifest["files"]}[files[0].relative_to(ckpt).as_posix()] == 0o600
    dest = tmp_path / "restored"
    assert restore(run="r", dest=str(dest), config_path=str(cfg)).status == "restored"
    for p in files:
        back = dest / ckpt.name / p.relative_to(ckpt)
        assert stat.S_IMODE(back.stat().st_mode) == stat.S_IMODE(p.stat().st_mode), p.name
