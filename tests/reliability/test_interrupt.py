"""Ctrl-C at 3 a.m.: SIGINT to the `ckptvault` process group in the middle of a 1 GiB file's multipart
upload, with no Prefect API configured (direct mode, docs/concepts.md), through the real console entry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.reliability.conftest import REPO, check_committed, cli_env, incomplete_uploads, manifest_keys

GiB = 2**30


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("mode", "compression"), [("direct", "off"), ("prefect", "off"), ("direct", "auto")])
def test_sigint_mid_upload_exits_130_with_the_message_and_a_rerun_converges(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, s3_env: Any, request: pytest.FixtureRequest, mode: str,
    compression: str,
) -> None:  # fmt: skip
    """`direct`: no Prefect API configured (direct mode, docs/concepts.md); `prefect`: PREFECT_API_URL names this
    session's running server, so the ingest is a flow run on it. `auto`: the file goes up as frames,
    its encoder threads interrupted with the upload."""
    s3_env(seaweedfs)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    ckpt = write_checkpoint(root, "deepspeed", 100, 1 * GiB, shards=1, seed=1)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")])
    text = cfg.read_text().replace("part_size_mb = 5", f'part_size_mb = 5\ncompression = "{compression}"', 1)
    cfg.write_text(text + "[validation]\nenabled = false\n")
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(seaweedfs.env(), PYTHONPATH=str(REPO))
    if mode == "prefect":
        request.getfixturevalue("prefect_api")
        env = cli_env(seaweedfs, PYTHONPATH=str(REPO))
    ckptvault = str(Path(sys.executable).parent / "ckptvault")  # this venv's console script
    cmd = [ckptvault, "--config", str(cfg), "ingest"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    client = seaweedfs.client()
    deadline = time.monotonic() + 300
    # the run's own prefix: the capability probe's one-part multipart upload (under t/_ckptvault_probe/)
    # comes and goes before any file is read, and with compression the codec's sampling comes between
    data = "t/r/"
    while not incomplete_uploads(client, bucket, data) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"ingest ended before its multipart upload was seen: {proc.communicate()}"
    assert incomplete_uploads(client, bucket, data), "no multipart upload started within 300 s"
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C: the whole process group
    try:
        _, err = proc.communicate(timeout=30)  # a watchdog against a hang, not a timing assertion
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"ingest still running 30 s after SIGINT: {proc.communicate()}")
    stopped = time.monotonic() - t0
    what = f"{mode}, compression {compression}"
    print(f"\n[interrupt {what}] SIGINT mid-upload of 1 GiB: exited {proc.returncode} after {stopped:.2f} s")
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    text = err.decode()
    assert "interrupted; rerun the same command to continue" in text, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    assert manifest_keys(client, bucket, "t/") == [], "nothing may be committed by an interrupted upload"

    rerun = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    key = checkpoint_prefix("t", "r", 100) + MANIFEST_NAME
    assert manifest_keys(client, bucket, "t/") == [key]
    check_committed(client, bucket, key, ckpt, read_bytes=False)
    states = Catalog(open_store(load_config(str(cfg)).store), "t").current("r")
    assert [(s.step, s.state) for s in states] == [(100, "verified")]
    if compression == "auto":
        m = check_committed(client, bucket, key, ckpt, read_bytes=False)
        assert {f.get("codec") for f in m["files"] if f["size"] >= 2**20} == {"shuffle-zstd"}, m["files"]
