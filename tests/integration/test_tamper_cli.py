"""The tamper check through `ckptvault scrub` on a real versioned bucket (SeaweedFS, with `[lock]`;
docs/object-lock.md, "Noticed: the tamper check"): an untouched archive reports no tampering; after an
attack made with the bucket's own key (a data object overwritten, a manifest overwritten, an object and
every catalog object deleted without a version id) the scrub exits 1 naming the two saves, each key and
what was done to it, with no catalog left to say which saves exist, and the `tamper` alert reaches
Slack once per save over two scrubs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.store import object_lock
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.integration.test_point_in_time_cli import _direct
from tests.reliability.conftest import all_keys, run_cli
from tests.servers import S3Endpoint
from tests.slack_recorder import SLACK_TOKEN, SlackRecorder

MiB = 2**20


def _tamper_alerts(slack: SlackRecorder) -> list[str]:
    return [t for p in slack.delivered() if "TAMPERED" in (t := json.dumps(p.payload))]


def test_scrub_names_the_tampered_saves_after_an_attack_and_alerts_once(
    seaweedfs: S3Endpoint, locked_bucket: Any, tmp_path: Path, slack: SlackRecorder
) -> None:
    bucket = locked_bucket(seaweedfs)
    root = tmp_path / "hot"
    for step in (100, 200):
        write_checkpoint(root, "deepspeed", step, 1 * MiB, shards=1, seed=step)
    notify = f'[notify]\nslack_base_url = "{slack.base_url}"\nchannel = "#ckpt"\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")],
                       extra='[lock]\nmode = "governance"\ndays = 1\n' + notify)  # fmt: skip
    env = {**_direct(seaweedfs), "CKPTVAULT_SLACK_TOKEN": SLACK_TOKEN}
    assert (out := run_cli(cfg, "ingest", env=env)).returncode == 0, out.stderr[-3000:]

    clean = run_cli(cfg, "scrub", env=env)
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert "tamper check (primary): 2 committed saves, none tampered" in clean.stdout
    assert "TAMPERED" not in clean.stdout + clean.stderr and _tamper_alerts(slack) == []
    time.sleep(1.1)  # the attack's versions a second after the commits: LastModified keeps whole seconds

    client = seaweedfs.client()
    first, second = checkpoint_prefix("t", "r", 100), checkpoint_prefix("t", "r", 200)
    overwritten = next(k for k in all_keys(client, bucket, first) if not k.endswith(".json"))
    deleted = next(k for k in all_keys(client, bucket, second) if not k.endswith(".json"))
    for key, body in ((overwritten, b"junk"), (second + MANIFEST_NAME, b'{"not": "the manifest"}')):
        client.put_object(Bucket=bucket, Key=key, Body=body, ContentMD5=object_lock.content_md5(body))
    # a drill names what it restores as tampered too, not only as damaged (its own reads fail on the junk)
    drilled = run_cli(cfg, "drill", "--sample", "2", "--json", env=env)
    assert drilled.returncode == 1, drilled.stderr[-3000:]
    problems = {d["step"]: d["problems"] for d in json.loads(drilled.stdout)["drilled"]}
    assert any(p.startswith(f"tampered: {overwritten}: overwritten at ") for p in problems[100]), problems
    assert any(p.startswith(f"tampered: {second + MANIFEST_NAME}: overwritten at ") for p in problems[200]), problems
    catalog = list(all_keys(client, bucket, "t/_catalog/"))
    assert catalog
    for key in [deleted, *catalog]:
        client.delete_object(Bucket=bucket, Key=key)

    found = run_cli(cfg, "scrub", "--json", env=env)
    assert found.returncode == 1, found.stderr[-3000:]
    doc = json.loads(found.stdout)
    assert doc["ok"] is False and doc["tamper_check"]["primary"]["checked"] == 2
    changes = {(t["step"], k["key"], k["change"]) for t in doc["tampered"] for k in t["keys"]}
    assert changes == {
        (100, overwritten, "overwritten"),
        (200, second + MANIFEST_NAME, "overwritten"),
        (200, deleted, "deleted"),
    }, doc["tampered"]
    assert len(_tamper_alerts(slack)) == 2  # one per save

    again = run_cli(cfg, "scrub", env=env)
    assert again.returncode == 1
    assert f"primary: r step 100: TAMPERED: {overwritten}: overwritten at " in again.stderr, again.stderr[-3000:]
    assert f"primary: r step 200: TAMPERED: {deleted}: deleted at " in again.stderr
    assert "TAMPERED: 2 of 2 committed saves (primary: r step 100, primary: r step 200)" in again.stdout
    assert "ckptvault recover --since " in again.stdout
    sent = _tamper_alerts(slack)
    assert len(sent) == 2, sent  # the second scrub found the same: nothing sent again
    assert any("r step 100 save 1" in s and overwritten in s for s in sent), sent
