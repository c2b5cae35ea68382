"""The drill rotation with real drills on SeaweedFS, through `ckptvault drill --json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import checkpoint_prefix
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config

KiB = 2**10
STEPS = list(range(100, 1001, 100))


def _drill_json(cfg: Path, capsys: pytest.CaptureFixture[str], want_rc: int) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["--config", str(cfg), "drill", "--json"]) == want_rc
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert set(report) == {"drilled", "pending", "coverage", "lock_drift"} and report["lock_drift"] == []
    for row in report["drilled"]:
        assert set(row) == {"run", "step", "save", "ok", "seconds", "problems", "checks", "not_run", "store", "verify",
                            "loaded_with"}  # fmt: skip
        assert row["verify"] is None  # no verify_command configured: no resume check
        assert row["loaded_with"]["python"] and row["loaded_with"]["safetensors"]  # what the checks loaded with
        assert isinstance(row["seconds"], float | int) and isinstance(row["problems"], list)
    assert set(report["coverage"]) == {
        "drillable", "never_drilled", "suspect", "oldest_drill_age_days", "sample", "window", "cover_days",
        "interval_days",
    }  # fmt: skip
    return report


def test_ten_checkpoints_sample_two_are_all_drilled_in_five_drills(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.ingest import ingest

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    for step in STEPS:
        write_checkpoint(root, "hf", step, 16 * KiB, shards=1, seed=step)
    extra = f'[validation]\nenabled = false\n[drill]\nscratch = "{tmp_path / "scratch"}"\nsample = 2\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")], extra=extra)
    ingest(config_path=str(cfg))

    drilled: set[int] = set()
    for i in range(5):  # ceil(9 / 2): the newest every time, the 9 others 2 at a time
        report = _drill_json(cfg, capsys, 0)
        steps = [r["step"] for r in report["drilled"]]
        assert 1000 in steps, f"drill {i + 1} skipped the newest"
        assert len(steps) == 3 and all(r["ok"] and r["save"] == 1 for r in report["drilled"])
        assert report["pending"] == []
        drilled |= set(steps)
        cov = report["coverage"]
        assert (cov["drillable"], cov["never_drilled"]) == (10, 10 - len(drilled))
        assert (cov["sample"], cov["window"], cov["interval_days"]) == (2, 5, 7.0)
        assert cov["oldest_drill_age_days"] is not None and cov["oldest_drill_age_days"] >= 0
    assert drilled == set(STEPS)

    # a damaged newest: exit 1, and the JSON still says what was drilled and that it is now suspect
    client = seaweedfs.client()
    key = checkpoint_prefix("t", "r", 1000) + "model.safetensors"
    original = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=original[:-1] + bytes([original[-1] ^ 0xFF]))
    report = _drill_json(cfg, capsys, 1)
    bad = [r for r in report["drilled"] if not r["ok"]]
    assert [r["step"] for r in bad] == [1000] and "model.safetensors" in " ".join(bad[0]["problems"])
    assert report["coverage"]["suspect"] == 1

    # repaired, the suspect passes again; human output stays one line per drilled checkpoint
    client.put_object(Bucket=bucket, Key=key, Body=original)
    capsys.readouterr()
    assert main(["--config", str(cfg), "drill"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("ok   r step ") for line in lines), lines
