"""Restore on a real Dask cluster (a scheduler and 2 worker processes on loopback): the downloads run
on the cluster's workers, into the one shared destination, byte-identical to what was ingested."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from ckptvault.transfer.placement import Placement
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests import dask_probe
from tests.dask_cluster import DaskCluster
from tests.helpers import write_config

MiB = 2**20
RUN, STEP = "llm", 100


@pytest.fixture
def api_env(prefect_api: None, seaweedfs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's credentials and the test Prefect API in this process's environment, where the
    command line reads them."""
    from prefect.settings import PREFECT_API_URL

    for k, v in {**seaweedfs.env(), "PREFECT_API_URL": str(PREFECT_API_URL.value())}.items():
        monkeypatch.setenv(k, v)


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[str, str]:
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    assert "Traceback" not in out.err
    return out.out, out.err


def test_restore_on_the_cluster_downloads_on_its_workers_into_the_shared_destination(
    api_env: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    dask_cluster_2: DaskCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    c = dask_cluster_2
    hot = tmp_path / "hot"
    # 2 shards of ~4 MiB and optimizer.pt of ~16 MiB (multipart at part_size_mb = 5) beside the small
    # files, so the largest-first order has something to order, and split_size_mb = 5 something to split
    write_checkpoint(hot, "hf", STEP, 24 * MiB, shards=2, seed=7)
    bucket = bucket_factory(seaweedfs)
    plain = write_config(tmp_path / "plain.toml", seaweedfs, bucket, [(RUN, hot, "hf")],
                         extra="[validation]\nenabled = false\n")  # fmt: skip
    out, _ = _run(capsys, ["--config", str(plain), "ingest", "--json"])
    assert [o["result"] for o in json.loads(out)["outcomes"]] == ["uploaded"]
    source = _tree(hot / f"checkpoint-{STEP}")
    big = len(source["optimizer.pt"])
    assert 15 * MiB < big <= 20 * MiB and all(len(b) <= 5 * MiB for k, b in source.items() if k != "optimizer.pt")
    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    pids = c.worker_pids()
    scaled = write_config(tmp_path / "scaled.toml", seaweedfs, bucket, [(RUN, hot, "hf")],
                          extra=f'[scale]\ndask_address = "{c.address}"\n')  # fmt: skip
    split = write_config(tmp_path / "split.toml", seaweedfs, bucket, [(RUN, hot, "hf")],
                         extra="[scale]\nsplit_size_mb = 5\n")  # fmt: skip
    # once through the flag, once through [scale]: both put every download on the cluster; then with
    # split_size_mb = 5, optimizer.pt as 4 ranges of 5 MiB (one part each), each range a task of its own
    for name, argv in (
        ("flag", ["--config", str(plain), "restore", RUN, "--dask-address", c.address]),
        ("scale", ["--config", str(scaled), "restore", RUN]),
        ("split", ["--config", str(split), "restore", RUN, "--dask-address", c.address]),
    ):
        dask_probe.clear(dirs)
        dest = tmp_path / f"restored-{name}"
        out, err = _run(capsys, [*argv, "--dest", str(dest), "--json"])
        result = json.loads(out)
        assert result["status"] == "restored", result
        assert "restoring from this host" not in err  # loopback workers see the destination
        assert _tree(dest / f"checkpoint-{STEP}") == source, name
        done = [r for r in dask_probe.records(dirs) if "download" in r and r["event"] == "memory"]
        ranges = sorted((r["rel"], r["offset"]) for r in done if "offset" in r)
        whole = sorted(r["rel"] for r in done if "offset" not in r)
        if name == "split":
            assert ranges == [("optimizer.pt", off) for off in range(0, big, 5 * MiB)]  # every range, once
            assert {r["pid"] for r in done if "offset" in r} == set(pids.values())  # ... on both workers
            assert whole == sorted(set(source) - {"optimizer.pt"})
        else:  # split_size_mb's default (2 GiB): every file one task
            assert not ranges and whole == sorted(source), name
        assert {(r["node"], r["pid"]) for r in done} == set(pids.items()), name  # both workers downloaded
        assert os.getpid() not in {r["pid"] for r in done}
        assert not [p for p in dest.parent.iterdir() if ".ckptvault-" in p.name], name  # no marker or staging left

    # Direct mode (no Prefect API: the command line's default) splits too, on this process's threads.
    monkeypatch.delenv("PREFECT_API_URL")
    _run(capsys, ["--config", str(split), "restore", RUN, "--dest", str(tmp_path / "restored-direct")])
    assert _tree(tmp_path / "restored-direct" / f"checkpoint-{STEP}") == source
    # The same size, other bytes, behind ckptvault's back: every range reads fine, their CRC32Cs combined
    # do not match the manifest's, and nothing is renamed into place or left behind.
    listed = seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix=f"t/{RUN}/")["Contents"]
    [key] = [o["Key"] for o in listed if o["Key"].endswith("/optimizer.pt")]
    seaweedfs.client().put_object(Bucket=bucket, Key=key, Body=os.urandom(big))
    bad = tmp_path / "restored-bad"
    capsys.readouterr()
    assert main(["--config", str(split), "restore", RUN, "--dest", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "CRC32C mismatch" in err and "combined from 4 ranges" in err and key in err, err[-2000:]
    assert not bad.exists() and not [p for p in tmp_path.iterdir() if ".ckptvault-" in p.name]


def test_restore_naming_an_unreachable_scheduler_is_exit_2_and_touches_nothing(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import socket

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    hot = tmp_path / "hot"
    write_checkpoint(hot, "hf", STEP, MiB, seed=3)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [(RUN, hot, "hf")],
                       extra="[validation]\nenabled = false\n[scale]\nconnect_timeout_seconds = 2\n")  # fmt: skip
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    _run(capsys, ["--config", str(cfg), "ingest"])  # direct mode: no Prefect API
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # a cluster needs one; never reached
    with socket.socket() as s:  # bound and closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dest = tmp_path / "restored"
    capsys.readouterr()
    assert main(["--config", str(cfg), "restore", RUN, "--dest", str(dest), "--dask-address",
                 f"tcp://127.0.0.1:{port}"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"tcp://127.0.0.1:{port}" in err and "Traceback" not in err
    # --node-local for a run whose source is not node-local, and a per-node --dest without --node-local
    for argv, expect in (
        (["--dest", str(dest), "--node-local"], 'without locality = "node"'),
        (["--dest", str(tmp_path / "${CKPTVAULT_NODE}" / "x")], "add --node-local"),
    ):
        assert main(["--config", str(cfg), "restore", RUN, *argv]) == 2
        err = capsys.readouterr().err
        assert expect in err and "Traceback" not in err, err
    assert not dest.exists() and not [p for p in tmp_path.iterdir() if ".ckptvault-" in p.name or "$" in p.name]


# DeepSpeed: a pointer file (`latest`) that every node's ranks read from their own disk
PATTERN, RANKS, PER_NODE = r"zero_pp_rank_(?P<rank>\d+)_", 4, 2  # ranks 0-1 on node-0, 2-3 on node-1


def test_node_local_restore_puts_each_file_back_on_its_own_node(
    api_env: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    dask_cluster_2: DaskCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Each node's disk is simulated as in tests/infra/test_dask_nodes.py: the path names
    ${CKPTVAULT_NODE}, which each worker replaces with its own node's directory."""
    c = dask_cluster_2
    monkeypatch.setenv("CKPTVAULT_NODE", "node-0")  # the flow runs on node 0
    hot = tmp_path / "all"
    write_checkpoint(hot, "deepspeed", STEP, 12 * MiB, shards=RANKS, seed=5)
    bucket = bucket_factory(seaweedfs)
    plain = write_config(tmp_path / "plain.toml", seaweedfs, bucket, [(RUN, hot, "deepspeed")],
                         extra="[validation]\nenabled = false\n")  # fmt: skip
    out, _ = _run(capsys, ["--config", str(plain), "ingest", "--json"])
    assert [o["result"] for o in json.loads(out)["outcomes"]] == ["uploaded"]
    [ckpt] = [p for p in hot.iterdir() if p.is_dir()]
    source = _tree(ckpt)
    placement = Placement(c.workers, PATTERN, PER_NODE)
    expected = {i: {k: v for k, v in source.items() if placement.node_of(k) == i} for i in range(c.workers)}
    assert all(expected.values())  # both nodes have files to get back

    name = f"restored-{uuid.uuid4().hex[:8]}"
    cfg = write_config(tmp_path / "nodes.toml", seaweedfs, bucket, [], extra="")
    cfg.write_text(
        cfg.read_text()
        + f'[[sources]]\nrun = "{RUN}"\npath = "{c.state_dir}/${{CKPTVAULT_NODE}}/hot"\nformat = "deepspeed"\n'
        + f"locality = \"node\"\nnodes = {c.workers}\nnode_pattern = '{PATTERN}'\nranks_per_node = {PER_NODE}\n"
        + f'[scale]\ndask_address = "{c.address}"\n'
    )
    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    dask_probe.clear(dirs)
    pids = c.worker_pids()
    try:
        out, _ = _run(capsys, ["--config", str(cfg), "restore", RUN, "--node-local", "--json",
                               "--dest", f"{c.state_dir}/${{CKPTVAULT_NODE}}/{name}"])  # fmt: skip
        assert json.loads(out)["status"] == "restored"
        pointer = (hot / "latest").read_text().strip()
        for i in range(c.workers):
            node_dest = c.node_dir(i) / name
            assert _tree(node_dest / ckpt.name) == expected[i], f"node-{i}"  # its own files, nothing else
            assert (node_dest / "latest").read_text().strip() == pointer, f"node-{i}"  # every node's ranks read it
            assert not [p for p in c.node_dir(i).iterdir() if ".ckptvault-" in p.name]  # no staging left
        done = [r for r in dask_probe.records(dirs) if "download" in r and r["event"] == "memory"]
        assert sorted(r["rel"] for r in done) == sorted(source)  # every file once, on a worker
        for r in done:  # ... on the worker of the node that holds it
            assert r["node"] == f"node-{placement.node_of(r['rel'])}" and r["pid"] == pids[r["node"]], r
        # again, without --force: each node finds its destination full, says so, and nothing changes
        (c.node_dir(1) / name / "mine.txt").write_text("the operator's own file")
        capsys.readouterr()
        assert main(["--config", str(cfg), "restore", RUN, "--node-local",
                     "--dest", f"{c.state_dir}/${{CKPTVAULT_NODE}}/{name}"]) == 1  # fmt: skip
        err = capsys.readouterr().err
        assert "not usable on every node" in err and "node-0:" in err and "node-1:" in err, err[-2000:]
        assert _tree(c.node_dir(0) / name / ckpt.name) == expected[0]
        assert (c.node_dir(1) / name / "mine.txt").read_text() == "the operator's own file"
        assert not [p for d in dirs for p in d.iterdir() if ".ckptvault-" in p.name]
        # a destination the nodes share (here: one machine): refused before any download, nothing left
        shared = tmp_path / "shared-restore"
        capsys.readouterr()
        assert main(["--config", str(cfg), "restore", RUN, "--node-local", "--dest", str(shared)]) == 1
        err = capsys.readouterr().err
        assert "the nodes share" in err and "single quotes" in err and "Traceback" not in err, err[-2000:]
        assert not shared.exists() and not [p for p in tmp_path.iterdir() if ".ckptvault-" in p.name]
    finally:
        for d in dirs:
            shutil.rmtree(d / name, ignore_errors=True)


def test_restore_dask_workers_flag_downloads_in_two_local_worker_processes(
    api_env: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import dask.config

    hot = tmp_path / "hot"
    write_checkpoint(hot, "hf", STEP, 12 * MiB, shards=2, seed=9)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [(RUN, hot, "hf")],
                       extra="[validation]\nenabled = false\n")  # fmt: skip
    _run(capsys, ["--config", str(cfg), "ingest"])
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    # the LocalCluster's spawned workers inherit this environment and get the probe as a preload
    monkeypatch.setenv("CKPTVAULT_NODE_DIR", str(probe_dir))
    dest = tmp_path / "restored"
    with dask.config.set({"distributed.worker.preload": ["tests.dask_probe"]}):
        out, _ = _run(capsys, ["--config", str(cfg), "restore", RUN, "--dest", str(dest), "--dask-workers", "2",
                                "--json"])  # fmt: skip
    assert json.loads(out)["status"] == "restored"
    source = _tree(hot / f"checkpoint-{STEP}")
    assert _tree(dest / f"checkpoint-{STEP}") == source
    done = [r for r in dask_probe.records([probe_dir]) if "download" in r and r["event"] == "memory"]
    assert sorted(r["rel"] for r in done) == sorted(source)
    pids = {r["pid"] for r in done}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes, neither this one
