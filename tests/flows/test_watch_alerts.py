"""Alerts from real flow runs over HTTP to a local Slack-speaking server (tests/slack_recorder.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.slack_recorder import SLACK_TOKEN as TOKEN
from tests.slack_recorder import SlackRecorder

MiB = 2**20
HOUR = 3600.0


def _posts(rec: SlackRecorder) -> list[dict[str, Any]]:
    return [r.payload for r in rec.delivered()]


def _notify(rec: SlackRecorder) -> str:
    return f'[notify]\nslack_base_url = "{rec.base_url}"\nchannel = "#ckpt-test"\n'


def test_stale_run_alerts_once_then_recovers_once(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    slack: SlackRecorder,
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.flows.watch import watch

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", TOKEN)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    write_checkpoint(root, "deepspeed", 100, 1 * MiB)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")], extra=_notify(slack))
    cfg.write_text(cfg.read_text().replace("settle_seconds = 0", "settle_seconds = 0\nstale_after_hours = 2"))
    ingest(config_path=str(cfg))
    t = time.time()
    assert watch(config_path=str(cfg), now=t + 0.5 * HOUR).alerts == ()
    first = watch(config_path=str(cfg), now=t + 3 * HOUR)
    assert first.alerts == ("run_stale",)
    for h in (4, 5, 6):
        assert watch(config_path=str(cfg), now=t + h * HOUR).alerts == ()
    stale_posts = [p for p in _posts(slack) if "stale" in json.dumps(p).lower()]
    assert len(stale_posts) == 1
    assert stale_posts[0]["channel"] == "#ckpt-test" and "r" in stale_posts[0]["text"]
    # checkpoints resume
    write_checkpoint(root, "deepspeed", 200, 1 * MiB)
    ingest(config_path=str(cfg))
    recovered = watch(config_path=str(cfg), now=time.time() + 60)
    assert recovered.alerts == ("run_recovered",)
    assert watch(config_path=str(cfg), now=time.time() + 120).alerts == ()
    kinds = [p["text"] for p in _posts(slack)]
    assert sum("checkpointing again" in k for k in kinds) == 1


def test_invalid_checkpoint_alerts_and_slack_outage_leaves_flow_green(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    slack: SlackRecorder,
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.ingest import ingest

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", TOKEN)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    bad = write_checkpoint(root, "hf", 100, 1 * MiB, shards=2)
    (bad / "optimizer.pt").write_bytes(b"")
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], extra=_notify(slack))
    state = ingest(config_path=str(cfg), return_state=True)
    assert state.is_failed()
    posts = _posts(slack)
    assert len(posts) == 1 and "optimizer.pt" in json.dumps(posts[0]) and "100" in posts[0]["text"]
    # Slack down: a good checkpoint still ingests, the flow stays green
    slack.down()
    (bad / "optimizer.pt").unlink()
    write_checkpoint(root, "hf", 200, 1 * MiB, shards=2)
    good_root = tmp_path / "hot2"
    good_root.mkdir()
    write_checkpoint(good_root, "hf", 5, 1 * MiB)
    cfg2 = write_config(tmp_path / "c2.toml", seaweedfs, bucket, [("g", good_root, "hf")], extra=_notify(slack))
    outcomes = ingest(config_path=str(cfg2))
    assert [o.result for o in outcomes] == ["uploaded"]


def test_failing_run_with_a_token_never_prints_it(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, slack: SlackRecorder
) -> None:
    from prefect.settings import PREFECT_API_URL

    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    ck = write_checkpoint(root, "hf", 100, 1 * MiB, shards=2)
    next(ck.glob("*.safetensors")).write_bytes(b"\x00" * 10)  # truncated: the run fails
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], extra=_notify(slack))
    env = {
        **os.environ,
        **seaweedfs.env(),
        "CKPTVAULT_SLACK_TOKEN": TOKEN,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_LOGGING_LEVEL": "DEBUG",
    }
    proc = subprocess.run([sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), "ingest"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    everything = proc.stdout + proc.stderr
    assert "safetensors" in everything  # it did fail, and said why
    assert TOKEN not in everything and TOKEN[10:] not in everything
    assert len(slack.delivered()) >= 1  # and the alert went out, authenticated by that token
