"""`[scale] split_size_mb` through `ckptvault ingest` (the command line's direct mode) on a real
SeaweedFS: a file over the threshold goes up as ranges of parts of one multipart upload, each range its
own step, and stores exactly what an unsplit ingest stores; a file that changes between its listing
and one of its ranges fails the checkpoint with nothing committed and its upload aborted, and the
next pass sends it. Which ranges ran is observed on the real S3Store (a spy that calls through).
The same on a real Dask cluster, each range on a worker: tests/infra/test_dask_scale.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from ckptvault.store import S3Store, SentPart, SplitUpload
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import stored_checkpoints, write_config

MiB = 2**20


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch, seaweedfs: Any) -> Any:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # direct mode, as a user's one-shot command
    return seaweedfs


@pytest.fixture
def hot(tmp_path: Path) -> Path:
    root = tmp_path / "hot"
    write_checkpoint(root, "hf", 100, 30 * MiB, shards=2, seed=5)  # optimizer.pt ~21 MiB, shards ~5 MiB
    return root


def _config(tmp_path: Path, name: str, endpoint: Any, bucket: str, hot: Path, split_mb: int) -> Path:
    extra = f"[validation]\nenabled = false\n[scale]\nsplit_size_mb = {split_mb}\n"
    return write_config(tmp_path / f"{name}.toml", endpoint, bucket, [("r", hot, "hf")], extra=extra)


def _ingest(capsys: pytest.CaptureFixture[str], cfg: Path) -> tuple[int, list[dict[str, Any]], str]:
    capsys.readouterr()
    rc = main(["--config", str(cfg), "ingest", "--json"])
    out = capsys.readouterr()
    return rc, json.loads(out.out)["outcomes"], out.err


def _spy(monkeypatch: pytest.MonkeyPatch, before: Any = None) -> list[tuple[str, int, int]]:
    """Record every range S3Store.upload_parts sends (file name, first part, count), then send it."""
    calls: list[tuple[str, int, int]] = []
    real = S3Store.upload_parts

    def upload_parts(self: S3Store, upload: SplitUpload, first: int, count: int, **kw: Any) -> tuple[SentPart, ...]:
        calls.append((Path(upload.path).name, first, count))
        if before is not None:
            before(upload, first)
        return real(self, upload, first, count, **kw)

    monkeypatch.setattr(S3Store, "upload_parts", upload_parts)
    return calls


def test_files_over_split_size_go_up_in_ranges_and_store_what_an_unsplit_ingest_stores(
    creds: Any, bucket_factory: Any, hot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    plain = bucket_factory(creds)
    rc, outcomes, err = _ingest(capsys, _config(tmp_path, "plain", creds, plain, hot, 0))
    assert rc == 0 and [o["result"] for o in outcomes] == ["uploaded"], err
    single = stored_checkpoints(creds.client(), plain, "t/r/")

    calls = _spy(monkeypatch)
    split = bucket_factory(creds)
    cfg = _config(tmp_path, "split", creds, split, hot, 10)
    rc, outcomes, err = _ingest(capsys, cfg)
    assert rc == 0 and [o["result"] for o in outcomes] == ["uploaded"], err
    shards = sorted(p for p in (hot / "checkpoint-100").iterdir() if p.stat().st_size > 10 * MiB)
    assert [p.name for p in shards] == ["optimizer.pt"] and shards[0].stat().st_size > 20 * MiB
    # the file over 10 MiB: ranges of 2 parts of 5 MiB, the last the rest; nothing else split
    for shard in shards:
        nparts = -(-shard.stat().st_size // (5 * MiB))
        want = [(shard.name, first, min(2, nparts - first + 1)) for first in range(1, nparts + 1, 2)]
        assert sorted(c for c in calls if c[0] == shard.name) == want
    assert {c[0] for c in calls} == {s.name for s in shards}
    assert stored_checkpoints(creds.client(), split, "t/r/") == single  # the same bytes, the same manifest
    # ...the block CRCs' sidecar included: the ranges' block pieces (parts of 5 MiB across blocks of 4)
    # joined at the completion give the blocks the unsplit read pass gave
    assert b'"optimizer.pt"' in single[0]["t/r/step-0000000100/_BLOCKS.json"]
    assert creds.client().list_multipart_uploads(Bucket=split).get("Uploads", []) == []

    calls.clear()
    rc, again, err = _ingest(capsys, cfg)  # converged: nothing to send again
    assert rc == 0 and [(o["result"], o["uploaded_files"]) for o in again] == [("present", 0)], err
    assert calls == []


def test_a_file_changed_under_a_range_fails_the_checkpoint_and_commits_nothing(
    creds: Any, bucket_factory: Any, hot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    def touch_before_the_second_range(upload: SplitUpload, first: int) -> None:
        if first > 1:  # the trainer rewrote the shard after discovery listed it
            st = os.stat(upload.path)
            os.utime(upload.path, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))

    _spy(monkeypatch, touch_before_the_second_range)
    bucket = bucket_factory(creds)
    cfg = _config(tmp_path, "c", creds, bucket, hot, 10)
    rc, outcomes, err = _ingest(capsys, cfg)
    assert rc == 1 and [o["result"] for o in outcomes] == ["failed"]
    assert "changed since it was listed" in outcomes[0]["message"] and "Traceback" not in err
    client = creds.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="t/r/").get("Contents", [])]
    assert not any(k.endswith("_MANIFEST.json") for k in keys)  # nothing committed
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # every split aborted

    monkeypatch.undo()  # the writer is done: the next pass sends the file as it now is
    for k, v in creds.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    rc, outcomes, err = _ingest(capsys, cfg)
    assert rc == 0 and [o["result"] for o in outcomes] == ["uploaded"], err
