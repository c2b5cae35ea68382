"""A catalog object that cannot be read, on SeaweedFS through the CLI: `ls` warns, alerts once and lists
the rest; `restore` of the run whose partition is unreadable restores from its manifests, byte-identical."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.main import main
from tests.helpers import write_config
from tests.slack_recorder import SLACK_TOKEN, SlackRecorder

try:  # synthetic checkpoints are moving from the library to the CLI package (concurrent work)
    from ckptvault_cli.synthetic import write_checkpoint
except ImportError:
    from ckptvault.synthetic import write_checkpoint  # type: ignore[no-redef]

MiB = 2**20


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _unreadable_alerts(slack: SlackRecorder) -> list[str]:
    sent = [json.dumps(p.payload) for p in slack.delivered()]
    return [s for s in sent if "catalog object(s) cannot be read" in s]


def test_garbage_in_a_runs_partition_ls_warns_and_lists_the_rest_and_restore_uses_the_manifests(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], slack: SlackRecorder,
) -> None:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # direct mode: the same flow, no server to wait for
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", SLACK_TOKEN)
    bucket = bucket_factory(seaweedfs)
    hot_r, hot_q = tmp_path / "r", tmp_path / "q"
    for step in (100, 200):
        write_checkpoint(hot_r, "deepspeed", step, 1 * MiB, seed=step)
    write_checkpoint(hot_q, "deepspeed", 100, 1 * MiB, seed=7)
    notify = f'[notify]\nslack_base_url = "{slack.base_url}"\nchannel = "#ckpt"\n[validation]\nenabled = false\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", hot_r, "deepspeed"), ("q", hot_q, "deepspeed")],
                       extra=notify)  # fmt: skip
    assert main(["--config", str(cfg), "ingest"]) == 0
    client = seaweedfs.client()
    part = "t/_catalog/run=r/"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=part)["Contents"]]
    assert keys  # the ingest wrote (and compacted) run r's partition
    # bit rot of every object of r's partition, and a stray file beside them
    for k in keys:
        client.put_object(Bucket=bucket, Key=k, Body=b"garbage, not parquet")
    stray = f"{part}events/00000000000000000001-{'e' * 32}.parquet"
    client.put_object(Bucket=bucket, Key=stray, Body=b"PAR1 truncated")
    slack.clear()

    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json"]) == 0
    out = capsys.readouterr()
    assert [(r["run"], r["step"], r["state"]) for r in json.loads(out.out)] == [("q", 100, "verified")]
    assert stray in out.err and all(k in out.err for k in keys)
    assert "Traceback" not in out.err
    alerts = _unreadable_alerts(slack)
    assert len(alerts) == 1 and stray in alerts[0] and "run r" in alerts[0]
    assert main(["--config", str(cfg), "ls", "--json"]) == 0  # the same objects: deduplicated
    assert len(_unreadable_alerts(slack)) == 1  # the same objects again: deduplicated

    capsys.readouterr()
    dest = tmp_path / "dest"
    assert main(["--config", str(cfg), "restore", "r", "--dest", str(dest), "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert (doc["status"], doc["step"], doc["save"]) == ("restored", 200, 1)
    assert "the catalog of run r could not be read in full" in out.err and stray in out.err
    assert "restoring from the run's manifests" in out.err.lower()
    assert "Traceback" not in out.err
    assert _tree(dest / "global_step200") == _tree(hot_r / "global_step200")
    # a named step too
    assert main(["--config", str(cfg), "restore", "r", "--step", "100", "--dest", str(tmp_path / "d100")]) == 0
    assert _tree(tmp_path / "d100" / "global_step100") == _tree(hot_r / "global_step100")
    assert len(_unreadable_alerts(slack)) == 1  # the restore flow found the same objects: deduplicated
    # nothing of the user's was deleted on the way: the garbage is still there for a person
    left = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=part)["Contents"]}
    assert set(keys) | {stray} <= left


def test_garbage_in_the_catalog_is_alerted_by_the_watch_and_by_tier(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], slack: SlackRecorder,
) -> None:  # fmt: skip
    """The hourly watch is where a fleet hears of a damaged catalog even when nobody runs `ls`; tier
    plans from the rest and says so. Both exit 0: an unreadable object never blocks a command."""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("CKPTVAULT_SLACK_TOKEN", SLACK_TOKEN)
    bucket = bucket_factory(seaweedfs)
    hot = tmp_path / "r"
    write_checkpoint(hot, "deepspeed", 100, 1 * MiB, seed=1)
    notify = f'[notify]\nslack_base_url = "{slack.base_url}"\nchannel = "#ckpt"\n[validation]\nenabled = false\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", hot, "deepspeed")], extra=notify)
    assert main(["--config", str(cfg), "ingest"]) == 0
    client = seaweedfs.client()
    stray = f"t/_catalog/run=r/events/00000000000000000001-{'e' * 32}.parquet"
    client.put_object(Bucket=bucket, Key=stray, Body=b"PAR1 truncated")

    def forget_sent_alerts() -> None:  # so the next command's alert is not deduplicated away
        for o in client.list_objects_v2(Bucket=bucket, Prefix="t/_state/alerts").get("Contents", []):
            client.delete_object(Bucket=bucket, Key=o["Key"])
        slack.clear()

    for command in (["watch"], ["tier"]):
        forget_sent_alerts()
        capsys.readouterr()
        assert main(["--config", str(cfg), *command]) == 0, command
        out = capsys.readouterr()
        alerts = _unreadable_alerts(slack)
        assert len(alerts) == 1 and stray in alerts[0] and "run r" in alerts[0], (command, alerts)
        assert stray in out.out + out.err and "Traceback" not in out.err, command
    # nothing of the user's was deleted on the way
    assert client.get_object(Bucket=bucket, Key=stray)["Body"].read() == b"PAR1 truncated"
