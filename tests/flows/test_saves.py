"""Trustworthy recovery through the `ckptvault` command line on real servers: a restart that saves a
step again, and `restore latest` after a drill found the newest checkpoint broken."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog, fold
from ckptvault.catalog.saves import replay_supersedes
from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.slack_recorder import SLACK_TOKEN as TOKEN
from tests.slack_recorder import SlackRecorder

MiB = 2**20


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _age(path: Path, seconds: float) -> None:
    """Make a checkpoint look written `seconds` ago, as one saved before a crash hours earlier would."""
    t = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (t, t))


def _ls(cfg: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json", *extra]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return rows


def test_restart_resaves_a_step_as_a_new_save_and_latest_follows_the_new_branch(
    prefect_api: None, pipeline_s3: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], slack: SlackRecorder,
) -> None:  # fmt: skip
    for k, v in pipeline_s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", TOKEN)
    bucket = bucket_factory(pipeline_s3)
    root = tmp_path / "hot"
    for step in (100, 200, 300):
        _age(write_checkpoint(root, "hf", step, 2 * MiB, seed=step), 3 * 3600 - step)
    notify = f'[notify]\nslack_base_url = "{slack.base_url}"\nchannel = "#ckpt"\n'
    cfg = write_config(tmp_path / "c.toml", pipeline_s3, bucket, [("r", root, "hf")], extra=notify)
    assert main(["--config", str(cfg), "ingest"]) == 0
    old_300 = _tree(root / "checkpoint-300")

    # the job crashed after step 300, restarted from 200 and saved 300 again (other weights), then 400
    shutil.rmtree(root / "checkpoint-300")
    write_checkpoint(root, "hf", 300, 2 * MiB, seed=3000)
    _age(root / "checkpoint-300", 60)
    write_checkpoint(root, "hf", 400, 2 * MiB, seed=400)
    new_300 = _tree(root / "checkpoint-300")
    assert new_300 != old_300
    capsys.readouterr()
    assert main(["--config", str(cfg), "ingest"]) == 0
    out = capsys.readouterr().out
    assert "r step 300 save 2" in out and "new save 2 of step 300" in out, out

    rows = _ls(cfg, capsys, "--run", "r")
    by_key = {(r["step"], r["save"]): r for r in rows}
    assert set(by_key) == {(100, 1), (200, 1), (300, 1), (300, 2), (400, 1)}
    assert by_key[(300, 1)]["state"] == "superseded" and by_key[(300, 1)]["last_event"] == "superseded"
    assert "saved again as save 2" in by_key[(300, 1)]["superseded_reason"]
    assert {k: r["state"] for k, r in by_key.items() if k != (300, 1)} == dict.fromkeys(
        [(100, 1), (200, 1), (300, 2), (400, 1)], "verified"
    )
    assert [r["step"] for r in _ls(cfg, capsys, "--state", "superseded")] == [300]

    # both saves are in the bucket, each under its own prefix with its own manifest
    client = pipeline_s3.client()
    for save in (1, 2):
        key = checkpoint_prefix("t", "r", 300, save) + MANIFEST_NAME
        assert json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read()).get("save", 1) == save

    dest = tmp_path / "r300"
    assert main(["--config", str(cfg), "restore", "r", "--step", "300", "--dest", str(dest)]) == 0
    assert _tree(dest / "checkpoint-300") == new_300
    latest = tmp_path / "latest"
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(latest)]) == 0
    assert [p.name for p in latest.iterdir() if p.is_dir()] == ["checkpoint-400"]
    old = tmp_path / "old300"
    assert main(["--config", str(cfg), "restore", "r", "--step", "300", "--save", "1", "--dest", str(old)]) == 0
    assert _tree(old / "checkpoint-300") == old_300

    # a catalog rebuilt from the manifests alone knows the same saves and which one is current
    capsys.readouterr()
    assert main(["--config", str(cfg), "catalog", "rebuild"]) == 0
    assert "5 checkpoint saves found by their manifests, 1 of them superseded" in capsys.readouterr().out
    rebuilt = fold(Catalog(open_store(load_config(str(cfg)).store), "t").rebuild_from_manifests())
    assert sorted((s.step, s.save) for s in rebuilt) == sorted(by_key)
    assert [(x.state.step, x.state.save) for x in replay_supersedes(rebuilt)] == [(300, 1)]

    # an unchanged rerun is quiet: nothing new, no second alert
    assert main(["--config", str(cfg), "ingest"]) == 0
    restarts = [p.payload for p in slack.delivered() if "restarted" in json.dumps(p.payload)]
    assert len(restarts) == 1, restarts
    assert "step 300 save 1" in json.dumps(restarts[0])


def test_latest_falls_back_past_a_checkpoint_a_drill_found_broken(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    for step in (100, 200):
        write_checkpoint(root, "deepspeed", step, 2 * MiB, seed=step)
    drill = f'[drill]\nscratch = "{tmp_path / "scratch"}"\nsample = 5\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")], extra=drill)
    assert main(["--config", str(cfg), "ingest"]) == 0
    # one object of the newest checkpoint corrupted behind ckptvault's back
    client = seaweedfs.client()
    base = checkpoint_prefix("t", "r", 200)
    victim = next(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=base)["Contents"]
                  if o["Key"].endswith(".pt"))  # fmt: skip
    body = bytearray(client.get_object(Bucket=bucket, Key=victim)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=bucket, Key=victim, Body=bytes(body))
    assert main(["--config", str(cfg), "drill"]) == 1
    assert {(r["step"], r["state"]) for r in _ls(cfg, capsys)} == {(100, "verified"), (200, "suspect")}

    capsys.readouterr()
    dest = tmp_path / "restored"
    assert main(["--config", str(cfg), "restore", "r", "--step", "latest", "--dest", str(dest)]) == 0
    out = capsys.readouterr().out
    assert "skipped step 200: suspect, its last drill failed" in out and "restored r step 100" in out, out
    assert sorted(p.name for p in dest.iterdir() if p.is_dir()) == ["global_step100"]
    # the suspect itself only with --force, and the refusal says why before anything is touched
    refused = tmp_path / "refused"
    assert main(["--config", str(cfg), "restore", "r", "--step", "200", "--dest", str(refused)]) == 2
    assert "suspect" in capsys.readouterr().err and not refused.exists()
