"""`--as-of TIME` through the command line, after an attack (docs/object-lock.md, "After an attack"): a
run of two saves ingested with `[lock]`, then every key of the bucket deleted without a version id (the
catalog's included) after one data object and one manifest were overwritten with junk. With no other
command first, `restore --as-of T` brings each save back byte-identical and `ls --as-of T --json` equals
the listing before the attack; `catalog rebuild --as-of T` lists the saves of then and `drill --as-of T`
passes, neither writing, and `catalog rebuild --as-of T --write` makes a plain `ls` list them again; a
bucket without versioning is refused at once, nothing written."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.store import object_lock
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import primary_env_and_dr_profile, write_config
from tests.reliability.conftest import all_keys, cli_env, run_cli
from tests.servers import S3Endpoint

MiB = 2**20


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _versions(client: Any, bucket: str) -> list[tuple[str, str]]:
    found = []
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        found += [(v["Key"], v["VersionId"]) for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
    return sorted(found)


def _data_versions(client: Any, bucket: str) -> list[tuple[str, str]]:
    found = []
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        found += [(v["Key"], v["VersionId"]) for v in page.get("Versions", [])]
    return sorted(found)


def _direct(endpoint: S3Endpoint) -> dict[str, str]:
    return cli_env(endpoint, PREFECT_API_URL="")  # in this process: no flow run, no Prefect API needed


def test_after_deletes_and_overwrites_restore_and_ls_as_of_read_the_archive_as_it_was(
    any_s3: S3Endpoint, locked_bucket: Any, tmp_path: Path
) -> None:
    # compliance on moto, whose state goes with the run: a compliance version on the others stays a day
    mode = "compliance" if any_s3.kind == "moto" else "governance"
    bucket = locked_bucket(any_s3)
    root = tmp_path / "hot"
    for step in (100, 200):
        write_checkpoint(root, "deepspeed", step, 6 * MiB, shards=1, seed=step)
    extra = f'[lock]\nmode = "{mode}"\ndays = 1\n[drill]\nscratch = "{tmp_path / "drill"}"\n'
    cfg = write_config(tmp_path / "c.toml", any_s3, bucket, [("r", root, "deepspeed")], extra=extra)
    env = _direct(any_s3)
    assert (out := run_cli(cfg, "ingest", env=env)).returncode == 0, out.stderr[-3000:]
    before = run_cli(cfg, "ls", "--json", env=env)
    assert before.returncode == 0 and before.stdout.count('"run"') == 2, before.stderr[-2000:]
    time.sleep(1.1)  # the moment lies between the last write and the attack, at the servers' one second
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    time.sleep(1.1)

    # the attack: junk over a data object and over a manifest, then every key deleted without a version id
    client = any_s3.client()
    save = checkpoint_prefix("t", "r", 100)
    data_key = next(k for k in all_keys(client, bucket, save) if not k.endswith(".json"))
    for key in (data_key, save + MANIFEST_NAME):
        client.put_object(Bucket=bucket, Key=key, Body=b"junk", ContentMD5=object_lock.content_md5(b"junk"))
    keys = all_keys(client, bucket)
    assert any("_catalog/" in k for k in keys), sorted(keys)
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    assert all_keys(client, bucket) == {}
    gone = run_cli(cfg, "restore", "r", "--step", "100", "--dest", str(tmp_path / "no"), env=env)
    assert gone.returncode == 2, gone.stderr  # as a user finds it: nothing there today

    for step in (100, 200):
        dest = tmp_path / f"back-{step}"
        out = run_cli(cfg, "restore", "r", "--step", str(step), "--as-of", moment, "--dest", str(dest), env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "this restore is not recorded" in out.stderr
        assert _tree(dest / f"global_step{step}") == _tree(root / f"global_step{step}")
    latest = run_cli(cfg, "restore", "r", "--as-of", moment, "--dest", str(tmp_path / "latest"), env=env)
    assert latest.returncode == 0 and (tmp_path / "latest" / "global_step200").is_dir(), latest.stderr[-3000:]
    past = run_cli(cfg, "ls", "--as-of", moment, "--json", env=env)
    assert past.returncode == 0, past.stderr[-3000:]
    assert json.loads(past.stdout) == json.loads(before.stdout)
    assert all_keys(client, bucket) == {}, "a read of the past wrote to the bucket"

    # the plan of the undo: every delete's markers to remove, the two overwrites to put back; nothing changed
    versions_before, data_before = _versions(client, bucket), _data_versions(client, bucket)
    plan = run_cli(cfg, "recover", "--since", moment, "--json", env=env)
    assert plan.returncode == 0, plan.stderr[-3000:]
    doc = json.loads(plan.stdout)
    assert sorted(p["key"] for p in doc["put_back"]) == sorted([data_key, save + MANIFEST_NAME])
    removed = {r["key"] for r in doc["remove_markers"]}
    assert removed == set(keys) - {data_key, save + MANIFEST_NAME}, sorted(set(keys) ^ removed)
    assert doc["created"] == [] and doc["applied"] is False
    text = run_cli(cfg, "recover", "--since", moment, "--run", "r", env=env)
    assert text.returncode == 0 and "the plan, nothing changed" in text.stdout, text.stderr[-2000:]
    assert f"{data_key}  (save object; version " in text.stdout, text.stdout
    assert _versions(client, bucket) == versions_before

    # the catalog as the manifests of then give it, and a drill of then: both only read
    rebuilt = run_cli(cfg, "catalog", "rebuild", "--as-of", moment, env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert [line.split()[:3] for line in rebuilt.stdout.splitlines() if line.startswith("r ")] == [
        ["r", "100", "1"], ["r", "200", "1"]
    ], rebuilt.stdout  # fmt: skip
    assert f"2 checkpoint saves found by their manifests as they were at {moment}" in rebuilt.stdout
    if any_s3.kind == "seaweedfs":  # its reads are restore --as-of's, above on each server: one proves the wiring
        drilled = run_cli(cfg, "drill", "--as-of", moment, "--sample", "2", "--json", env=env)
        assert drilled.returncode == 0, drilled.stderr[-3000:]
        report = json.loads(drilled.stdout)
        assert sorted((d["step"], d["ok"]) for d in report["drilled"]) == [(100, True), (200, True)], report
        assert (report["as_of"], report["recorded"]) == (moment, False), report
        assert "this drill is not recorded" in drilled.stderr
    assert _versions(client, bucket) == versions_before, "a rebuild or drill of the past wrote to the bucket"

    # the undo carried out: the archive reads as it did, a plain restore works, and a second run does nothing
    applied = run_cli(cfg, "recover", "--since", moment, "--apply", env=env)
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    assert f"put back: {data_key}  (version " in applied.stdout, applied.stdout
    assert applied.stdout.count("  removed markers: ") == len(removed), applied.stdout
    again = run_cli(cfg, "recover", "--since", moment, "--apply", "--json", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    redo = json.loads(again.stdout)
    assert (redo["done"], redo["failed"], redo["remove_markers"], redo["put_back"]) == ([], [], [], []), redo
    after = run_cli(cfg, "ls", "--json", env=env)
    assert after.returncode == 0 and json.loads(after.stdout) == json.loads(before.stdout), after.stderr[-2000:]
    out = run_cli(cfg, "restore", "r", "--step", "100", "--dest", str(tmp_path / "plain"), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _tree(tmp_path / "plain" / "global_step100") == _tree(root / "global_step100")
    for key in (data_key, save + MANIFEST_NAME):  # the put-back copies are locked as what they copy was
        head = client.head_object(Bucket=bucket, Key=key)
        assert head.get("ObjectLockMode") == mode.upper(), (key, head.get("ObjectLockMode"))
    # nothing deleted but delete markers; nothing added but the two copies (and what the restore recorded:
    # its catalog event, and a compaction's deletes, which a recover since `moment` would undo too, harmlessly)
    now = set(_versions(client, bucket))
    assert set(data_before) <= now, "a data version was deleted"
    assert not (set(versions_before) - now) & set(data_before)
    new = {
        k
        for k, _ in now - set(versions_before)
        if not k.startswith(("t/_catalog/", "t/_state/", "t/_ckptvault_probe/"))
    }
    assert new == {data_key, save + MANIFEST_NAME}

    # --write: into today's catalog, so a plain `ls` lists the saves of then again
    wrote = run_cli(cfg, "catalog", "rebuild", "--as-of", moment, "--write", "--json", env=env)
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    assert json.loads(wrote.stdout) | {"key": None} == {"saves_found": 2, "superseded": 0, "written": True,
                                                        "key": None, "as_of": moment}  # fmt: skip
    listed = run_cli(cfg, "ls", "--json", env=env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    keyed = [[(s["run"], s["step"], s["save"], s["state"]) for s in json.loads(doc.stdout)] for doc in (listed, before)]
    assert keyed[0] == keyed[1], keyed


def test_a_bucket_without_versioning_is_refused_at_once_and_nothing_is_written(
    seaweedfs: S3Endpoint, bucket_factory: Any, tmp_path: Path
) -> None:
    bucket = bucket_factory(seaweedfs)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [])
    env = _direct(seaweedfs)
    refused = (("restore", "r", "--as-of", "1h", "--dest", str(tmp_path / "d")), ("ls", "--as-of", "1h"),
               ("recover", "--since", "1h"), ("catalog", "rebuild", "--as-of", "1h", "--write"),
               ("drill", "--as-of", "1h"))  # fmt: skip
    for args in refused:
        started = time.monotonic()
        out = run_cli(cfg, *args, env=env)
        took = time.monotonic() - started
        assert out.returncode == 2, out.stderr
        flag = "--since" if args[0] == "recover" else "--as-of"
        assert f"{flag}: s3://{bucket} keeps no versions (versioning never turned on)" in out.stderr
        assert "Traceback" not in out.stderr and took < 20  # the process's start included; the check is one call
    bad = run_cli(cfg, "ls", "--as-of", "2026-12-07T08:00:00", env=env)
    assert bad.returncode == 2 and "no zone; add one" in bad.stderr, bad.stderr
    assert all_keys(seaweedfs.client(), bucket) == {}
    assert not (tmp_path / "d").exists()


def test_a_replica_hit_by_the_same_key_is_brought_back_with_replica(
    seaweedfs: S3Endpoint, bucket_factory: Any, locked_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary_env_and_dr_profile(monkeypatch, seaweedfs, seaweedfs, tmp_path)
    primary, replica = bucket_factory(seaweedfs), locked_bucket(seaweedfs)  # a versioned replica bucket
    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 100, 2 * MiB, shards=2, seed=100)
    dr = (
        f'[[replicas]]\nname = "dr"\nbucket = "{replica}"\nprefix = "dr"\nendpoint_url = "{seaweedfs.url}"\n'
        f'region = "{seaweedfs.region}"\nprofile = "dr"\n'
    )
    cfg = write_config(tmp_path / "c.toml", seaweedfs, primary, [("r", root, "deepspeed")], extra=dr)
    env = _direct(seaweedfs)
    for command in ("ingest", "replicate"):
        assert (out := run_cli(cfg, command, env=env)).returncode == 0, out.stderr[-3000:]
    client = seaweedfs.client()
    copied = {k: client.get_object(Bucket=replica, Key=k)["Body"].read() for k in all_keys(client, replica)}
    time.sleep(1.1)
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    time.sleep(1.1)
    data_key = next(k for k in sorted(copied) if not k.endswith(".json"))
    client.put_object(Bucket=replica, Key=data_key, Body=b"junk")
    for key in all_keys(client, replica):
        client.delete_object(Bucket=replica, Key=key)
    stray = "dr/r/step-0000000300/model.bin"  # written since by the same key: kept, and said not to verify
    client.put_object(Bucket=replica, Key=stray, Body=b"not a save")

    unknown = run_cli(cfg, "recover", "--since", moment, "--replica", "nope", env=env)
    assert unknown.returncode == 2 and "no [[replicas]] entry is named 'nope' (copies: primary, dr)" in unknown.stderr
    plan = json.loads(run_cli(cfg, "recover", "--since", moment, "--replica", "dr", "--json", env=env).stdout)
    assert [p["key"] for p in plan["put_back"]] == [data_key]
    assert {r["key"] for r in plan["remove_markers"]} == set(copied) - {data_key}
    assert [(c["key"], c["verifies"]) for c in plan["created"]] == [(stray, False)], plan["created"]
    assert "no manifest lists it" in plan["created"][0]["why"]
    primary_before = _versions(client, primary)
    applied = run_cli(cfg, "recover", "--since", moment, "--from", "dr", "--apply", env=env)
    assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
    back = {k: client.get_object(Bucket=replica, Key=k)["Body"].read() for k in all_keys(client, replica)}
    assert back == copied | {stray: b"not a save"}
    assert _versions(client, primary) == primary_before  # the primary is not the copy it was asked to bring back
    scrub = run_cli(cfg, "scrub", "--replica", "dr", env=env)
    assert scrub.returncode == 0, scrub.stdout[-2000:] + scrub.stderr[-2000:]
