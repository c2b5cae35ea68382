"""The framework hooks on real training runs, with no Prefect server and no scheduled ingest: each save's
signal starts a detached `ckptvault ingest --run R --step S` (ckptvault/hooks/signal.py), and the
checkpoint turns up verified in SeaweedFS while nothing else ingests.

One Hugging Face Trainer run (its commit marker, trainer_state.json, lets the named step skip a
settle_seconds far longer than the test) and one Lightning run (no marker: the named step still waits
settle_seconds, so its ingests upload nothing and say they wait).

And [T]'s other Done-when runs: a Hugging Face and a Lightning run archived by `ckptvault follow` with no
Prefect and no hook (inotify for one, polling for the other); a Lightning run whose hook cannot reach its
Prefect API (training goes on, one warning, a plain ingest after archives every save); a step named
before its commit marker is there (above: it waits, then is archived once the marker is written). The
Lightning and Hugging Face runs with the hook on a real Prefect server are in
tests/deployments/test_serve.py (its server and served deployments are there)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME
from ckptvault_cli.main import main
from tests.following import Follower
from tests.frameworks import need
from tests.frameworks.conftest import REPO, write_run
from tests.frameworks.test_frameworks import _stored
from tests.helpers import write_config

SETTLE = 600  # longer than the test: a checkpoint archived within it skipped settle_seconds
WAIT = 120.0  # the bound on polling for the detached ingests, never an expectation of speed


def _hook_env(endpoint: Any, cfg: Path, logs: Path) -> dict[str, str]:
    env = {
        **endpoint.env(),
        "CKPTVAULT_CONFIG": str(cfg),
        "CKPTVAULT_HOOK_SIGNAL": "auto",  # with no PREFECT_API_URL: the subprocess ingest
        "CKPTVAULT_HOOK_LOG_DIR": str(logs),
    }
    return env


def _without_prefect(monkeypatch: pytest.MonkeyPatch) -> None:
    # the writer and its ingests inherit this process's environment: no Prefect API for them to find
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


def _config(tmp_path: Path, endpoint: Any, bucket: str, root: Path, fmt: str) -> Path:
    extra = "[validation]\nenabled = false\n"  # the gates are the scheduled ingest's business here
    return write_config(tmp_path / "c.toml", endpoint, bucket, [("r", root, fmt)], settle=SETTLE, extra=extra)


def _until(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got, f"not within {WAIT:g} s: {what}"
            return got
        time.sleep(0.5)


def test_each_hugging_face_save_is_verified_in_the_store_by_the_hooks_ingest(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    _without_prefect(monkeypatch)
    bucket = bucket_factory(seaweedfs)
    root, logs = tmp_path / "root", tmp_path / "logs"
    cfg = _config(tmp_path, seaweedfs, bucket, root, "hf")
    write_run("hf", root, "--steps", "4", "--every", "2", "--ckptvault-run", "r", env=_hook_env(seaweedfs, cfg, logs))
    # the writer has exited; its detached ingests go on. Nothing else ingests: poll the store, then the catalog
    _until(lambda: all(MANIFEST_NAME in _stored(seaweedfs, bucket, s) for s in (2, 4)), "both manifests committed")
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)

    def verified() -> dict[int, str]:
        capsys.readouterr()
        assert main(["--config", str(cfg), "ls", "--run", "r", "--json"]) == 0
        rows = {r["step"]: r["state"] for r in json.loads(capsys.readouterr().out)}
        return rows if rows == {2: "verified", 4: "verified"} else {}

    _until(verified, "steps 2 and 4 verified in the catalog")
    log = (logs / "r.log").read_text()
    assert [s for s in (2, 4) if re.search(rf"^uploaded +r step {s} ", log, re.M)] == [2, 4], log
    assert "waits" not in log, log

    # By hand, on the same store: a step whose commit marker is missing (the Trainer's files of step 4
    # without its trainer_state.json, as a save cut short leaves them) uploads nothing and says it waits;
    # a run that is not configured is exit 2 naming the configured one.
    shutil.copytree(root / "checkpoint-4", root / "checkpoint-6", ignore=shutil.ignore_patterns("trainer_state.json"))
    capsys.readouterr()
    assert main(["--config", str(cfg), "ingest", "--run", "r", "--step", "6"]) == 3
    err = capsys.readouterr().err
    assert "step 6 waits, nothing uploaded" in err and "trainer_state.json" in err, err
    assert _stored(seaweedfs, bucket, 6) == []
    # ... and once the marker is there, the same command archives it (the marker, not a settle time)
    shutil.copy(root / "checkpoint-4" / "trainer_state.json", root / "checkpoint-6" / "trainer_state.json")
    assert main(["--config", str(cfg), "ingest", "--run", "r", "--step", "6"]) == 0
    assert MANIFEST_NAME in _stored(seaweedfs, bucket, 6)
    # Two steps named in one command (a hook's drained queue): each judged alone in one pass; the one
    # whose marker is missing waits (exit 3, named), the other is archived
    shutil.copytree(root / "checkpoint-4", root / "checkpoint-8")
    shutil.copytree(root / "checkpoint-4", root / "checkpoint-10", ignore=shutil.ignore_patterns("trainer_state.json"))
    capsys.readouterr()
    assert main(["--config", str(cfg), "ingest", "--run", "r", "--step", "8", "--step", "10"]) == 3
    out, err = capsys.readouterr()
    assert re.search(r"^uploaded +r step 8 ", out, re.M) and "step 10 waits" in err and "step 8 " not in err, err
    assert MANIFEST_NAME in _stored(seaweedfs, bucket, 8) and _stored(seaweedfs, bucket, 10) == []
    assert main(["--config", str(cfg), "ingest", "--run", "nope", "--step", "6"]) == 2
    assert "configured runs: r" in capsys.readouterr().err


def test_a_lightning_save_without_a_commit_marker_still_waits_settle_seconds(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_prefect(monkeypatch)
    bucket = bucket_factory(seaweedfs)
    root, logs = tmp_path / "root", tmp_path / "logs"
    cfg = _config(tmp_path, seaweedfs, bucket, root, "lightning")
    write_run(
        "lightning", root, "--steps", "4", "--every", "2", "--ckptvault-run", "r", env=_hook_env(seaweedfs, cfg, logs)
    )
    # each save's ingest says its step waits (exit 3) once it has run; both ran once the log names both
    log_file = logs / "r.log"
    text = _until(
        lambda: (
            (t := log_file.read_text() if log_file.exists() else "")
            and all(f"step {s} waits" in t for s in (2, 4))
            and t
        ),
        "both steps' ingests ran and said they wait",
    )
    assert "settle_seconds" in text, text
    assert _stored(seaweedfs, bucket, 2) == [] and _stored(seaweedfs, bucket, 4) == []


def _verified(cfg: Path, run: str, capsys: pytest.CaptureFixture[str]) -> dict[int, float | None]:
    """run's verified saves in the catalog: step -> rpo_ms (the save's commit to its manifest's)."""
    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--run", run, "--json"]) == 0
    return {r["step"]: r["rpo_ms"] for r in json.loads(capsys.readouterr().out) if r["state"] == "verified"}


def test_follow_archives_real_hugging_face_and_lightning_runs_with_no_prefect_and_no_hook(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Two follow processes, started before training: `hf` on inotify (this machine's local file system),
    `lt` forced to polling (as on a network file system). Both runs train with no hook and no Prefect;
    every save ends verified in the catalog with no ingest started by anything else. Lightning has no
    commit marker: its settle_seconds (2 s here) still applies, and follow looks again once it passed."""
    _without_prefect(monkeypatch)
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    hf_root, lt_root = tmp_path / "hf", tmp_path / "lt"
    hf_root.mkdir()
    lt_root.mkdir()
    cfg = write_config(
        tmp_path / "c.toml", seaweedfs, bucket, [("hf", hf_root, "hf"), ("lt", lt_root, "lightning")], settle=2,
        extra="[validation]\nenabled = false\n",
    )  # fmt: skip
    env = {**os.environ, **seaweedfs.env(), "PYTHONPATH": str(REPO)}
    followers = [
        Follower(cfg, env, "--run", "hf", "--poll-seconds", "3600"),
        Follower(cfg, env, "--run", "lt", "--watch", "poll", "--poll-seconds", "1"),
    ]
    try:
        said = [f.started() for f in followers]
        assert said[0][0].startswith(f"following hf at {hf_root}: inotify"), said
        assert said[1][0].startswith(f"following lt at {lt_root}: polling every 1 s"), said
        write_run("hf", hf_root, "--steps", "4", "--every", "2")
        write_run("lightning", lt_root, "--steps", "4", "--every", "2")
        for f, run in zip(followers, ("hf", "lt"), strict=True):
            for step in (2, 4):
                f.wait_line(f"uploaded  {run} step {step} ", WAIT)
        codes = [f.stop() for f in followers]
    finally:
        for f in followers:
            f.kill()
    assert codes == [130, 130], [f.err[-10:] for f in followers]
    rpo = {run: _verified(cfg, run, capsys) for run in ("hf", "lt")}
    assert {run: sorted(v) for run, v in rpo.items()} == {"hf": [2, 4], "lt": [2, 4]}, rpo
    print(f"\nfollow: save -> verified manifest (rpo_ms) per step: {rpo}")


def test_a_hook_that_cannot_reach_its_prefect_api_warns_once_and_training_goes_on(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A real Lightning run whose hook sends its events to a Prefect API nobody listens on: training ends
    normally with every save on disk and exactly one warning for its two saves; the next scheduled ingest
    (a plain `ckptvault ingest`) archives both."""
    need("lightning")
    _without_prefect(monkeypatch)
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "root"
    cfg = write_config(
        tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "lightning")], extra="[validation]\nenabled = false\n"
    )
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/api"
    env = {**os.environ, "PREFECT_API_URL": dead, "CKPTVAULT_HOOK_SIGNAL": "auto"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.frameworks.writers", "train", "lightning", str(root), "--steps", "4",
         "--every", "2", "--ckptvault-run", "r"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT " in proc.stdout
    warnings = [ln for ln in proc.stderr.splitlines() if "ckptvault hook: could not signal" in ln]
    assert len(warnings) == 1 and "by event" in warnings[0] and "scheduled ingest" in warnings[0], proc.stderr[-3000:]
    assert len(list(root.rglob("*step=*.ckpt"))) == 2
    assert _verified(cfg, "r", capsys) == {}  # nothing was archived by the lost signals
    assert main(["--config", str(cfg), "ingest"]) == 0
    assert sorted(_verified(cfg, "r", capsys)) == [2, 4]
