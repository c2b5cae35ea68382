"""`ckptvault restore` over two copies through the CLI (docs/replicas.md, "Restore from a copy"): a
SeaweedFS primary and a Ceph RGW replica, two saves ingested and replicated once for the whole module.
One object corrupted on the primary (its bytes overwritten on the server, same size) is read from the
replica and reported; with the primary's server stopped (a SeaweedFS of that test's own, started and
stopped with the infra script: its save ingested and replicated to the module's replica first) the whole
save comes from the replica, found from its manifests; `--from ceph-dr` reads the replica first, `--from nosuch`
is exit 2 naming the known stores. Every restore is byte-identical to what training wrote. Two drills
restore each save from the primary, then from the replica (the rotation over copies)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import checkpoint_prefix
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests import servers
from tests.helpers import primary_env_and_dr_profile, write_config

MiB = 2**20


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@dataclass(frozen=True)
class World:
    cfg: Path  # the primary and the replica
    replica_entry: str  # the config's [[replicas]] entry
    primary: str  # bucket names
    replica: str
    saves: dict[int, Path]  # step -> the checkpoint directory training wrote
    client: Any  # the primary's boto3 client


@pytest.fixture(scope="module")
def world(seaweedfs: Any, ceph: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("copies")
    created: list[tuple[Any, str]] = []
    with pytest.MonkeyPatch.context() as mp:
        primary_env_and_dr_profile(mp, seaweedfs, ceph, tmp)
        for endpoint in (seaweedfs, ceph):
            name = servers.unique_bucket_name()
            endpoint.client().create_bucket(Bucket=name)
            created.append((endpoint, name))
        (_, primary), (_, replica) = created
        root = tmp / "hot"
        saves = {step: write_checkpoint(root, "deepspeed", step, 8 * MiB, shards=1, seed=step) for step in (100, 200)}
        extra = (
            f'[[replicas]]\nname = "ceph-dr"\nbucket = "{replica}"\nprefix = "dr"\nendpoint_url = "{ceph.url}"\n'
            f'region = "{ceph.region}"\nprofile = "dr"\npart_size_mb = 5\n'
        )
        sources = [("r", root, "deepspeed")]
        cfg = write_config(tmp / "c.toml", seaweedfs, primary, sources, extra=extra)
        assert main(["--config", str(cfg), "ingest"]) == 0
        assert main(["--config", str(cfg), "replicate"]) == 0
        yield World(cfg, extra, primary, replica, saves, seaweedfs.client())
    servers.cleanup_buckets(created)


@pytest.mark.ceph
def test_an_object_corrupted_on_the_primary_is_read_from_the_replica_and_reported(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = world.saves[100]
    victim = max((p for p in src.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    rel = victim.relative_to(src).as_posix()
    key = checkpoint_prefix("t", "r", 100) + rel
    world.client.put_object(Bucket=world.primary, Key=key, Body=b"\x00" * victim.stat().st_size)  # same size
    capsys.readouterr()
    dest = tmp_path / "a"
    try:
        assert main(["--config", str(world.cfg), "restore", "r", "--step", "100", "--dest", str(dest), "--json"]) == 0
    finally:  # the primary as it was, for the other tests of the module
        world.client.put_object(Bucket=world.primary, Key=key, Body=victim.read_bytes())
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["status"] == "restored" and doc["source"] == "primary"
    assert doc["fallbacks"] == [{"path": rel, "from": "ceph-dr", "because": "crc32c mismatch on primary"}]
    assert f"fallback: {rel} read from ceph-dr (crc32c mismatch on primary)" in err
    assert _tree(dest / src.name) == _tree(src)
    assert [c["store"] for c in doc["copies"]] == ["primary", "ceph-dr"]


@pytest.mark.ceph
def test_the_primary_server_stopped_restores_the_whole_save_from_the_replica(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real stop: a SeaweedFS of this test's own (the session's serves the other tests) is the primary of
    run `s`, whose save is ingested and replicated to the module's replica; then that server is stopped
    with the infra script, and the restore finds the save from the replica's manifests."""
    root = tmp_path / "hot"
    src = write_checkpoint(root, "deepspeed", 300, 2 * MiB, shards=1, seed=300)
    with servers.private_server("seaweedfs") as own:
        bucket = servers.unique_bucket_name()
        own.endpoint.client().create_bucket(Bucket=bucket)
        cfg = write_config(
            tmp_path / "own.toml", own.endpoint, bucket, [("s", root, "deepspeed")], extra=world.replica_entry
        )
        assert main(["--config", str(cfg), "ingest"]) == 0
        assert main(["--config", str(cfg), "replicate"]) == 0
        # the primary's server stopped (SIGKILL a second after SIGTERM, which SeaweedFS may ignore for
        # seconds): nothing listens there now
        servers.stop("seaweedfs", own.state_dir, sigterm_seconds=1)
        capsys.readouterr()
        dest = tmp_path / "b"
        assert main(["--config", str(cfg), "restore", "s", "--dest", str(dest)]) == 0
    out, err = capsys.readouterr()
    assert "the primary store is unreachable" in err and "replicas' manifests" in err
    assert "copy: ceph-dr:" in out and "<- read from" in out and "copy: primary: unreachable" in out
    assert f"restored s step 300 to {dest} from replica ceph-dr (every CRC32C verified)" in out
    assert _tree(dest / src.name) == _tree(src)
    assert (dest / "latest").read_text().strip() == src.name  # the framework's pointer, as from the primary


@pytest.mark.ceph
def test_from_forces_a_copy_and_an_unknown_one_is_exit_2(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    dest = tmp_path / "c"
    argv = ["--config", str(world.cfg), "restore", "r", "--step", "200", "--dest", str(dest)]
    assert main([*argv, "--from", "ceph-dr", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["source"], doc["fallbacks"]) == ("ceph-dr", [])
    assert _tree(dest / world.saves[200].name) == _tree(world.saves[200])
    assert main([*argv[:-1], str(tmp_path / "d"), "--from", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--from nosuch: no such store (known: primary, ceph-dr)" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


@pytest.mark.ceph
def test_drills_rotate_from_the_primary_to_the_replica(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    stores = []
    for _ in range(2):
        capsys.readouterr()
        assert main(["--config", str(world.cfg), "drill", "--sample", "1", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["drilled"]
        assert sorted(r["step"] for r in rows) == [100, 200] and all(r["ok"] for r in rows)
        stores.append({r["step"]: r["store"] for r in rows})
    assert stores == [{100: "primary", 200: "primary"}, {100: "ceph-dr", 200: "ceph-dr"}]
