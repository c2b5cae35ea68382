"""`ckptvault replicate` through the CLI, SeaweedFS primary and Ceph RGW replica (docs/FORMAT.md,
"Replicas"): after one ingest, every object of every save is on the replica byte for byte with its
manifest, the replica's retention rule is on its own bucket, a rerun copies nothing, and a replica that
cannot be reached as configured (a profile that does not exist, a bucket that does not) is exit 2 naming
it. The replica's credentials come from its `profile`, the primary's from the environment: two servers
with two sets of keys, as in production."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import primary_env_and_dr_profile, write_config

MiB = 2**20


def _objects(client: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) :]] = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
    return out


def _replica(name: str, ceph: Any, bucket: str, profile: str) -> str:
    return (
        f'[[replicas]]\nname = "{name}"\nbucket = "{bucket}"\nprefix = "dr"\nendpoint_url = "{ceph.url}"\n'
        f'region = "{ceph.region}"\nprofile = "{profile}"\npart_size_mb = 5\n'
    )


@pytest.mark.ceph
def test_replicate_copies_every_save_byte_for_byte_and_a_rerun_copies_nothing(
    seaweedfs: Any, ceph: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    primary_env_and_dr_profile(monkeypatch, seaweedfs, ceph, tmp_path)
    primary, replica = bucket_factory(seaweedfs), bucket_factory(ceph)
    root = tmp_path / "hot"
    for step in (100, 200):  # one shard: files over 5 MiB, multipart objects at part_size 5 MiB
        write_checkpoint(root, "deepspeed", step, 12 * MiB, shards=1, seed=step)
    sources = [("r", root, "deepspeed")]
    dr = _replica("ceph-dr", ceph, replica, "dr") + "expire_after_days = 400\n"  # its own retention, on its bucket
    cfg = write_config(tmp_path / "c.toml", seaweedfs, primary, sources, extra=dr)
    assert main(["--config", str(cfg), "ingest"]) == 0
    capsys.readouterr()
    # the hot copy is read where unchanged: touch step 200's big file, which is then read from the primary
    touched = max((p for p in root.rglob("*") if p.is_file() and "200" in str(p)), key=lambda p: p.stat().st_size)
    os.utime(touched, (1.0, 1.0))

    assert main(["--config", str(cfg), "replicate"]) == 0
    out, err = capsys.readouterr()
    assert "ceph-dr: r step 100 save 1:" in out and "ceph-dr: r step 200 save 1:" in out
    assert "ceph-dr: 2 saves copied, 0 already there, 0 failed" in out
    # step 100 unchanged on disk: its data from the hot copy, only the manifest (KiB) from the primary;
    # step 200's touched file from the primary (MiB), named on stderr
    assert re.search(r"r step 100 save 1: .*\(\S+ MiB from the hot copy, [\d.]+ (B|KiB) from the primary\)", out)
    assert re.search(r"r step 200 save 1: .*, [\d.]+ MiB from the primary\)", out)
    assert f"r step 200 save 1: read from the primary instead: {touched}: modified since it was ingested" in err
    assert "ceph-dr: retention rule installed (objects expire 400 days after their copy)" in out
    rules = ceph.client().get_bucket_lifecycle_configuration(Bucket=replica)["Rules"]
    [rule] = [r for r in rules if r["ID"] == "ckptvault-replica-expire-dr"]
    assert rule["Expiration"]["Days"] == 400 and rule["NoncurrentVersionExpiration"]["NoncurrentDays"] == 1
    src = _objects(seaweedfs.client(), primary, "t/r/")
    dst = _objects(ceph.client(), replica, "dr/r/")
    # a replica keeps no block-checksum sidecar (docs/FORMAT.md, "Block checksums": what the manifest names)
    src = {k: v for k, v in src.items() if not k.endswith("/_BLOCKS.json")}
    assert dst == src  # every object and both manifests, byte for byte, key for key
    assert {k for k in dst if k.endswith("_MANIFEST.json")} == {
        "step-0000000100/_MANIFEST.json", "step-0000000200/_MANIFEST.json",
    }  # fmt: skip
    sizes = [len(b) for k, b in src.items() if not k.endswith(".json")]
    assert max(sizes) > 5 * MiB  # at least one object went as a multipart copy

    assert main(["--config", str(cfg), "replicate", "--json"]) == 0
    (again,) = json.loads(capsys.readouterr().out)["replicas"]
    assert (again["replica"], again["copied"], again["present"], again["failed"]) == ("ceph-dr", [], 2, {})
    assert main(["--config", str(cfg), "replicate"]) == 0
    out = capsys.readouterr().out
    assert "ceph-dr: nothing to copy (2 saves already there)" in out
    assert "retention rule" not in out  # the rule as Ceph returns it is ours: not written again

    for extra, needle in (
        (_replica("bad-profile", ceph, replica, "nope"), "the credentials profile 'nope' does not exist"),
        (_replica("no-bucket", ceph, "ckptvault-no-such-bucket", "dr"), "ckptvault-no-such-bucket does not exist"),
    ):
        name = extra.split('"')[1]
        bad = write_config(tmp_path / "bad.toml", seaweedfs, primary, sources, extra=extra)
        assert main(["--config", str(bad), "replicate"]) == 2
        err = capsys.readouterr().err
        assert f"replica {name}" in err and needle in err and "Traceback" not in err
