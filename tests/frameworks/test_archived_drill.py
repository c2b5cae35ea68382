"""A drill of an archived checkpoint the real framework wrote, against moto (which honours the GLACIER
storage class and RestoreObject): the HF Trainer run of this session (tests/frameworks/conftest.py) is
ingested, its objects are moved to GLACIER behind ckptvault's back (CopyObject in place, as a lifecycle
rule would), and `ckptvault drill` requests the thaw, restores into scratch and load-checks every file
as it does for a checkpoint in STANDARD."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, VALIDATION_NAME, checkpoint_prefix
from ckptvault_cli.main import main
from tests.frameworks.test_frameworks import NEWEST, SPECS, _config, _env, _ls

FW = "hf"


def _data_keys(client: Any, bucket: str, step: int) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=checkpoint_prefix("t", "r", step))["Contents"]
    return [o["Key"] for o in listed if not o["Key"].endswith((MANIFEST_NAME, VALIDATION_NAME))]


def test_drill_thaws_an_archived_framework_checkpoint_on_moto_and_load_checks_it(
    prefect_api: None, moto_server: Any, bucket_factory: Any, framework_run: Callable[[str], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    spec = SPECS[FW]
    root = framework_run(FW)
    _env(monkeypatch, moto_server)
    bucket = bucket_factory(moto_server)
    cfg = _config(tmp_path, moto_server, bucket, root, "auto")
    assert main(["--config", str(cfg), "ingest"]) == 0
    assert {s: r["state"] for s, r in _ls(cfg, capsys).items()} == dict.fromkeys(spec.steps, "verified")

    # archive every file the manifests name, of every step (manifest and validation report stay readable)
    client = moto_server.client()
    archived = {s: _data_keys(client, bucket, s) for s in spec.steps}
    for keys in archived.values():
        assert len(keys) >= len(spec.checks)
        for k in keys:
            client.copy_object(
                Bucket=bucket, Key=k, CopySource={"Bucket": bucket, "Key": k}, StorageClass="GLACIER",
                MetadataDirective="COPY",
            )  # fmt: skip
    for keys in archived.values():
        assert {client.head_object(Bucket=bucket, Key=k).get("StorageClass") for k in keys} == {"GLACIER"}
    with pytest.raises(client.exceptions.InvalidObjectState):
        client.get_object(Bucket=bucket, Key=archived[NEWEST][0])

    # the drill requests the thaw; moto completes it at once or by the next drill, which then drills the rest
    drilled: dict[int, dict[str, Any]] = {}
    drills = 0
    for drills in range(1, 4):  # noqa: B007 (reported below)
        capsys.readouterr()
        assert main(["--config", str(cfg), "drill", "--json"]) == 0, capsys.readouterr()
        report = json.loads(capsys.readouterr().out)
        drilled.update({r["step"]: r for r in report["drilled"]})
        if not report["pending"] and set(drilled) == set(spec.steps):
            break
    else:
        pytest.fail(f"after {drills} drills: drilled {sorted(drilled)}, pending {report['pending']}")
    assert sorted((s, r["ok"], r["problems"], r["not_run"]) for s, r in drilled.items()) == [
        (s, True, [], []) for s in spec.steps
    ]
    checks = drilled[NEWEST]["checks"]
    for expected in spec.checks:
        assert any(c.startswith(expected) for c in checks), f"{expected!r} not among\n" + "\n".join(checks)
    # the drill thawed them through S3 RestoreObject (the x-amz-restore header), they stay GLACIER, scratch is empty
    for k in (k for keys in archived.values() for k in keys):
        head = client.head_object(Bucket=bucket, Key=k)
        assert head.get("StorageClass") == "GLACIER" and 'ongoing-request="false"' in head.get("Restore", ""), head
    assert not list((tmp_path / "scratch").glob("*")), "the drill left scratch data"
