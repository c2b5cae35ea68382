"""`ckptvault follow` as its own process on SeaweedFS: a checkpoint written into the source while it
runs is ingested and verified with no ingest started by hand; Ctrl-C then stops it with exit 130, the
usual message and no traceback. The verified event records the RPO from the commit marker, and `ls --json` shows it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog, Event
from ckptvault.config import StoreConfig
from ckptvault.store import open_store
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0  # a bound, not a measurement: the step is normally verified within a few seconds


def test_follow_ingests_a_step_written_while_it_runs_and_stops_on_ctrl_c(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    # settle_seconds 600: the step is verified only because hf's commit marker stands in for it
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], settle=600)
    env = {**os.environ, **seaweedfs.env(), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    cmd = [sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), "follow", "--poll-seconds", "0.5"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        write_checkpoint(root, "hf", 100, 1 << 20, seed=1)
        store = open_store(StoreConfig(bucket=bucket, endpoint_url=seaweedfs.url, region=seaweedfs.region))
        deadline = time.monotonic() + WAIT_S
        verified: list[Event] = []
        while proc.poll() is None and not verified and time.monotonic() < deadline:
            time.sleep(0.3)
            verified = [e for e in Catalog(store, "t").events("r") if e.step == 100 and e.event == "verified"]
        assert verified, proc.poll()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "interrupted; rerun the same command" in err and "Traceback" not in err, err[-2000:]
    assert "following r: a scan every 0.5 s" in err
    assert out.count("uploaded  r step 100 ") == 1, out  # one ingest for the step, not one per poll
    # the RPO: from trainer_state.json's mtime to the manifest's commit, a number (never negative)
    detail = json.loads(verified[0].detail)
    marker = next(root.glob("*/trainer_state.json")).stat().st_mtime
    assert detail["rpo_seconds"] == round(detail["uploaded_at"] - marker, 3) >= 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["step"], row["state"], row["rpo_ms"]) == (100, "verified", round(detail["rpo_seconds"] * 1000))
