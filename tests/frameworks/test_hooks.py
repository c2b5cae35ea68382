"""The framework hooks on real training runs, with no Prefect server and no scheduled ingest: each save's
signal starts a detached `ckptvault ingest --run R --step S` (ckptvault/hooks/signal.py), and the
checkpoint turns up verified in SeaweedFS while nothing else ingests.

One Hugging Face Trainer run (its commit marker, trainer_state.json, lets the named step skip a
settle_seconds far longer than the test) and one Lightning run (no marker: the named step still waits
settle_seconds, so its ingests upload nothing and say they wait)."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.manifest import MANIFEST_NAME
from ckptvault_cli.main import main
from tests.frameworks.conftest import write_run
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
