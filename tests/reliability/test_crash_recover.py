"""Crash test of `ckptvault recover --since T --apply` (docs/object-lock.md, "After an attack"): after the
attack (junk over a data object and a manifest, then every key deleted without a version id), the undo
is SIGKILLed at five points, each a number of steps it has printed (each line is flushed as its step is
done: the kill lands while the next step runs), then run to its end. What must hold:

- the archive lists as it did before the attack, and a plain restore of each save is byte-identical;
- every put-back copy is locked as the version it copies was, including a copy made before a kill
  stopped its lock: here made by hand (a copy of the version current at T, unlocked), which the undo
  must find and lock;
- a last `--apply` does nothing, and no data version was deleted by any of it.

SeaweedFS only, in governance mode: the three servers' undo is tested once each in
tests/integration/test_point_in_time_cli.py; what a kill leaves is the client's doing, not the server's.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.store import object_lock
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.reliability.conftest import REPO, all_keys, cli_cmd, cli_env, run_cli
from tests.servers import S3Endpoint

MiB = 2**20
# steps printed before each kill: 0 kills it in its first step (or before it)
KILL_AFTER = (0, 1, 2, 1, 3)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _data_versions(client: Any, bucket: str) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket):
        found |= {(v["Key"], v["VersionId"]) for v in page.get("Versions", [])}
    return found


def _kill_after(cmd: list[str], env: dict[str, str], steps: int) -> list[str]:
    """Run the undo and SIGKILL it once it has printed `steps` steps; the steps it printed by then."""
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        for line in proc.stdout:
            if line.startswith("undoing the changes") and steps == 0:
                break
            if line.startswith("  ") and ": " in line and not line.startswith("  failed"):
                seen.append(line)
                if len(seen) >= steps > 0:
                    break
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return seen


def test_the_undo_killed_at_five_points_converges_when_run_again(
    seaweedfs: S3Endpoint, locked_bucket: Any, tmp_path: Path
) -> None:
    bucket = locked_bucket(seaweedfs)
    root = tmp_path / "hot"
    for step in (100, 200):
        write_checkpoint(root, "deepspeed", step, 2 * MiB, shards=2, seed=step)
    lock = '[lock]\nmode = "governance"\ndays = 1\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")], extra=lock)
    env = cli_env(seaweedfs, PREFECT_API_URL="")
    assert (out := run_cli(cfg, "ingest", env=env)).returncode == 0, out.stderr[-3000:]
    before = run_cli(cfg, "ls", "--json", env=env)
    assert before.returncode == 0, before.stderr[-2000:]
    time.sleep(1.1)
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    time.sleep(1.1)

    client = seaweedfs.client()
    first, second = checkpoint_prefix("t", "r", 100), checkpoint_prefix("t", "r", 200)
    data = sorted(k for k in all_keys(client, bucket, first) if not k.endswith(".json"))
    for key in (data[0], first + MANIFEST_NAME):
        client.put_object(Bucket=bucket, Key=key, Body=b"junk", ContentMD5=object_lock.content_md5(b"junk"))
    for key in all_keys(client, bucket):
        client.delete_object(Bucket=bucket, Key=key)
    # a copy killed before its lock: the version current at the moment, written back by hand, unlocked
    relock = sorted(k for k in _keys_ever(client, bucket, second) if not k.endswith(".json"))[0]
    then = _newest_data_version(client, bucket, relock)
    body = client.get_object(Bucket=bucket, Key=relock, VersionId=then)["Body"].read()
    time.sleep(1.1)  # a second after its delete marker: within one second the listing puts the marker on top
    client.put_object(Bucket=bucket, Key=relock, Body=body, ContentMD5=object_lock.content_md5(body))
    assert "ObjectLockMode" not in client.head_object(Bucket=bucket, Key=relock)
    data_before = _data_versions(client, bucket)

    plan = json.loads(run_cli(cfg, "recover", "--since", moment, "--json", env=env).stdout)
    assert len(plan["remove_markers"]) + len(plan["put_back"]) > sum(KILL_AFTER), "too few steps to kill between"
    apply = cli_cmd(cfg, "recover", "--since", moment, "--apply")
    printed = [_kill_after(apply, env, n) for n in KILL_AFTER]
    assert [len(p) for p in printed[1:]] == list(KILL_AFTER[1:]), printed  # each got as far as it was meant to

    last = run_cli(cfg, "recover", "--since", moment, "--apply", env=env)
    assert last.returncode == 0, last.stdout[-3000:] + last.stderr[-3000:]
    said = "".join(line for run in printed for line in run) + last.stdout
    assert f"relocked: {relock}" in said, said  # by the last run, or by a killed one that got that far
    again = json.loads(run_cli(cfg, "recover", "--since", moment, "--apply", "--json", env=env).stdout)
    assert (again["done"], again["failed"], again["remove_markers"], again["put_back"]) == ([], [], [], []), again

    after = run_cli(cfg, "ls", "--json", env=env)
    assert after.returncode == 0 and json.loads(after.stdout) == json.loads(before.stdout), after.stderr[-2000:]
    for step in (100, 200):
        dest = tmp_path / f"plain-{step}"
        out = run_cli(cfg, "restore", "r", "--step", str(step), "--dest", str(dest), env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert _tree(dest / f"global_step{step}") == _tree(root / f"global_step{step}")
    for key in (data[0], first + MANIFEST_NAME, relock):
        assert client.head_object(Bucket=bucket, Key=key).get("ObjectLockMode") == "GOVERNANCE", key
    assert data_before <= _data_versions(client, bucket), "a data version was deleted"


def _keys_ever(client: Any, bucket: str, prefix: str) -> set[str]:
    keys: set[str] = set()
    for page in client.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        keys |= {v["Key"] for v in page.get("Versions", [])}
    return keys


def _newest_data_version(client: Any, bucket: str, key: str) -> str:
    page = client.list_object_versions(Bucket=bucket, Prefix=key)
    versions = [v for v in page.get("Versions", []) if v["Key"] == key]
    return str(max(versions, key=lambda v: v["LastModified"])["VersionId"])
