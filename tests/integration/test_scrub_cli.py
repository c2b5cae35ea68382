"""`ckptvault scrub` and `scrub --repair` through the CLI, SeaweedFS primary and Ceph RGW replica
(docs/FORMAT.md, "Scrub and repair"): an object overwritten on the primary with other bytes of the same
size is named (store, save, path, why) with exit 1, repaired from the replica, and a second scrub is
clean with the object's bytes the replica's; an object deleted on the replica is found and repaired
from the primary. One ingest and one replicate for all of it. And on SeaweedFS with Object Lock (the
library, no CLI): a corrupt object whose current version is locked is repaired as a new version,
locked in its turn, every older version left where it was."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog, events
from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.replication import replicate
from ckptvault.replication.scrub import PRIMARY, Copy
from ckptvault.replication.scrub_pass import run_scrub
from ckptvault.store import Retention
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import primary_env_and_dr_profile, write_config
from tests.integration.store_backends import server_store

MiB = 2**20


def _body(client: Any, bucket: str, key: str) -> bytes:
    data: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return data


@pytest.mark.ceph
def test_scrub_names_a_corrupt_object_repair_fixes_it_from_the_other_copy_and_a_rescrub_is_clean(
    seaweedfs: Any, ceph: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    primary_env_and_dr_profile(monkeypatch, seaweedfs, ceph, tmp_path)
    primary, replica = bucket_factory(seaweedfs), bucket_factory(ceph)
    root = tmp_path / "hot"
    for step in (100, 200):  # one shard over 5 MiB: a multipart object (part_size 5 MiB) on each store
        write_checkpoint(root, "deepspeed", step, 8 * MiB, shards=1, seed=step)
    extra = (
        f'[[replicas]]\nname = "ceph-dr"\nbucket = "{replica}"\nprefix = "dr"\nendpoint_url = "{ceph.url}"\n'
        f'region = "{ceph.region}"\nprofile = "dr"\npart_size_mb = 5\n'
    )
    cfg = str(write_config(tmp_path / "c.toml", seaweedfs, primary, [("r", root, "deepspeed")], extra=extra))
    assert main(["--config", cfg, "ingest"]) == 0
    assert main(["--config", cfg, "replicate"]) == 0
    capsys.readouterr()
    sw, rgw = seaweedfs.client(), ceph.client()
    keys = [o["Key"] for o in sw.list_objects_v2(Bucket=primary, Prefix="t/r/step-0000000100/")["Contents"]]
    victim = max(keys, key=lambda k: sw.head_object(Bucket=primary, Key=k)["ContentLength"])  # the multipart one
    path = victim.removeprefix("t/r/step-0000000100/")
    good = _body(sw, primary, victim)
    sw.put_object(Bucket=primary, Key=victim, Body=bytes(len(good)))  # other bytes, same size, no CRC32C kept

    assert main(["--config", cfg, "scrub", "--sample", "2"]) == 1
    out = capsys.readouterr()
    assert f"primary: r step 100: {path}: CRC32C mismatch: " in out.err
    assert "ceph-dr: r step 100: " in out.out and "ceph-dr: r step 200: " in out.out  # both copies checked
    assert "1 problem(s) found, 0 repaired, 1 left" in out.out

    # the save with a problem comes first, on top of the default sample (1 of 2 saves)
    assert main(["--config", cfg, "scrub", "--repair"]) == 0
    out = capsys.readouterr()
    assert f"primary: r step 100: {path}: CRC32C mismatch: " in out.out and "-> repaired" in out.out
    assert "(sample 1, 1 rechecked" in out.out and "1 repaired, 0 left" in out.out
    assert _body(sw, primary, victim) == good == _body(rgw, replica, "dr/" + victim.removeprefix("t/"))

    assert main(["--config", cfg, "scrub", "--sample", "2"]) == 0
    assert "0 problem(s) found, 0 repaired, 0 left" in capsys.readouterr().out

    lost = "dr/r/step-0000000200/" + path
    rgw.delete_object(Bucket=replica, Key=lost)
    assert main(["--config", cfg, "scrub", "--repair", "--sample", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["found"], doc["left"]) == (True, 1, 0)
    (fix,) = doc["repaired"]
    assert (fix["store"], fix["step"], fix["path"], fix["from"], fix["why"]) == (
        "ceph-dr",
        200,
        path,
        "primary",
        "missing",
    )
    assert _body(rgw, replica, lost) == _body(sw, primary, "t/r/step-0000000200/" + path)

    assert main(["--config", cfg, "scrub", "--replica", "nope"]) == 2
    assert "no [[replicas]] entry is named 'nope'" in capsys.readouterr().err


def test_repair_of_a_locked_object_writes_a_new_locked_version_and_leaves_the_old_ones(
    seaweedfs: Any, locked_bucket: Any, bucket_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = server_store(seaweedfs, locked_bucket(seaweedfs), monkeypatch, prefix="ck")
    replica = server_store(seaweedfs, bucket_factory(seaweedfs), monkeypatch, prefix="dr")
    lock = Retention("GOVERNANCE", datetime.now(UTC).replace(microsecond=0) + timedelta(days=1))
    src = checkpoint_prefix("ck", "r1", 10)
    rng = random.Random(1)
    files = []
    for name, size in (("model.bin", 6 * MiB), ("config.json", 3000)):
        data = rng.randbytes(size)
        primary.with_retention(lock).put_bytes(src + name, data)
        files.append(FileEntry(name, size, 1.0, to_b64(crc32c_update(data))))
    m = Manifest("r1", 10, "hf", tuple(files), 1.0, 2.0, "/hot/r1/step-10")
    primary.with_retention(lock).put_bytes(src + MANIFEST_NAME, m.to_json())
    catalog = Catalog(primary, "ck")
    catalog.append([events.verified(m)])
    dr = ReplicaConfig(name="dr", bucket=replica.bucket, prefix="dr")
    assert len(replicate(primary, "ck", replica, dr, catalog.current(), LockConfig(), catalog=catalog).copied) == 1
    client, key = seaweedfs.client(), src + "config.json"
    # other bytes as a new version, itself locked: the repair meets a locked current version
    client.put_object(Bucket=primary.bucket, Key=key, Body=bytes(3000))
    client.put_object_retention(
        Bucket=primary.bucket, Key=key, Retention={"Mode": "GOVERNANCE", "RetainUntilDate": lock.until}
    )
    before = {v["VersionId"] for v in client.list_object_versions(Bucket=primary.bucket, Prefix=key)["Versions"]}
    copies = [Copy(PRIMARY, primary, "ck"), Copy("dr", replica, "dr")]

    report = run_scrub(copies, [PRIMARY, "dr"], catalog.current(), catalog.events(), repair=True, catalog=catalog)

    assert [(r.store, r.path, r.source) for r in report.repairs] == [("primary", "config.json", "dr")]
    # a PUT over a committed object is tampering too (tests/integration/test_tamper_cli.py): named, and not
    # ok though the repair put it right, where the PUT fell in a later second than the commit (the versions'
    # resolution: within one second nothing tells the commit's version from the one over it)
    assert [[k.key for k in t.keys] for t in report.tampered] in ([], [[key]])
    assert report.ok == (not report.tampered)
    versions = client.list_object_versions(Bucket=primary.bucket, Prefix=key)["Versions"]
    assert len(before) == 2 and before < {v["VersionId"] for v in versions} and len(versions) == 3
    head = client.head_object(Bucket=primary.bucket, Key=key)
    assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == ("GOVERNANCE", lock.until)
    assert primary.get_bytes(key) == replica.get_bytes(checkpoint_prefix("dr", "r1", 10) + "config.json")
    assert run_scrub(copies, [PRIMARY, "dr"], catalog.current(), catalog.events(), sample=1).ok
