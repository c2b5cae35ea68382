"""`ckptvault follow` as its own process on SeaweedFS: a checkpoint written into the source while it
runs is ingested and verified with no ingest started by hand, seen by inotify on a local source and by
polling where polling is asked for; Ctrl-C then stops it with exit 130, the
usual message and no traceback. The verified event records the RPO from the commit marker, and `ls --json` shows it,
and the save's model and optimizer bytes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.config import StoreConfig
from ckptvault.store import open_store
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.following import Follower
from tests.helpers import write_config

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0  # a bound, not a measurement: the step is normally verified within a few seconds


def test_follow_ingests_a_step_written_while_it_runs_and_stops_on_ctrl_c(
    seaweedfs: Any, bucket_factory: Callable[[Any], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`r`'s root is on this machine's local file system, so follow gives it inotify, and its poll interval
    (an hour) is far beyond the test's bound: only an event can start the ingest in time. (Polling, the
    fallback, follows a real Lightning run in tests/frameworks/test_hooks.py.)"""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    root.mkdir()
    # settle_seconds 600: the step is verified only because hf's commit marker stands in for it
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], settle=600)
    env = {**os.environ, **seaweedfs.env(), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    follower = Follower(cfg, env, "--poll-seconds", "3600")
    try:
        said = follower.started()
        assert said[0].startswith(f"following r at {root}: inotify (") and "is local" in said[0], said
        write_checkpoint(root, "hf", 100, 1 << 20, seed=1)  # after the watch is in place: no scan has seen it
        follower.wait_line("uploaded  r step 100 ", WAIT_S)
        code = follower.stop()
    finally:
        follower.kill()
    err = "\n".join(follower.err)
    assert code == 130, (code, err[-2000:])
    assert "interrupted; rerun the same command" in err and "Traceback" not in err, err[-2000:]
    assert sum("uploaded  r step 100 " in ln for ln in follower.out) == 1, follower.out  # one ingest, not one per event
    store = open_store(StoreConfig(bucket=bucket, endpoint_url=seaweedfs.url, region=seaweedfs.region))
    verified = [e for e in Catalog(store, "t").events("r") if e.event == "verified"]
    assert [e.step for e in verified] == [100], verified
    # the RPO: from trainer_state.json's mtime to the manifest's commit, a number (never negative)
    detail = json.loads(verified[0].detail)
    marker = next(root.glob("*/trainer_state.json")).stat().st_mtime
    assert detail["rpo_seconds"] == round(detail["uploaded_at"] - marker, 3) >= 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--run", "r", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["step"], row["state"], row["rpo_ms"]) == (100, "verified", round(detail["rpo_seconds"] * 1000))
    # the save's split, from its manifest: the Trainer's training state is the optimizer's, the rest the model's
    files = {p.name: p.stat().st_size for p in (root / "checkpoint-100").iterdir()}
    training = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin")
    optimizer = sum(files[n] for n in training if n in files)
    assert "optimizer.pt" in files and optimizer > 0
    assert (row["model_bytes"], row["optimizer_bytes"]) == (sum(files.values()) - optimizer, optimizer)
