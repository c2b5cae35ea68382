"""Node-local checkpoints (`locality = "node"`) on a real Dask cluster (infra/local/dask.sh: a scheduler
and 2 worker processes, node-0 and node-1), a real Prefect API and SeaweedFS (the node-per-worker and
missing-node cases on Ceph RGW too), through the command line.

How node-local disks are simulated, honestly: every node sees its own disk at the same source path.
Here both "nodes" share one machine, so the path names `${CKPTVAULT_NODE}`, which each process
replaces with its own node name: worker node-i reads STATE/node-i/..., and the flow, which runs on
node 0 (CKPTVAULT_NODE=node-0 here, as on the real node 0), reads node-0's directory. Each rank file is
written to its own node's directory only. Where each task ran, and which file it read, is recorded
by the workers themselves (tests/dask_probe.py).

Checked: a checkpoint waits, naming the node, while one node's files are absent; once they are there,
each worker uploads only its own node's files, from its own directory, and the bucket holds the same
objects and manifests as a single-process ingest of the same files from one directory; a node with
no worker fails the checkpoint naming it, in bounded time, with nothing committed; a rank file lost on
node-1 makes the checkpoint invalid, naming it and node-1; without Dask the source is refused with
the fix; rank files over `split_size_mb` go up as ranges, every range read on its file's own node."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptvault.transfer.placement import Placement
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests import dask_probe
from tests.dask_cluster import DaskCluster
from tests.helpers import PIPELINE_STORES, stored_checkpoints, write_config

MiB = 2**20
RUN, STEPS, RANKS, PER_NODE = "llm", (100, 200), 4, 2  # ranks 0-1 on node-0, 2-3 on node-1
PATTERN = r"__(?P<rank>\d+)_\d+\.distcp$"
NO_GATES = "[validation]\nenabled = false\n"


@pytest.fixture
def api_env(prefect_api: None, store: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = {**store.env(), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CKPTVAULT_NODE", "node-0")  # the flow runs on node 0
    return env


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    """Every rank's files in one directory: what a single-process ingest reads."""
    root = tmp_path / "all"
    for step in STEPS:
        write_checkpoint(root, "dcp", step, 12 * MiB, shards=RANKS, seed=step)
    return root


@pytest.fixture
def node_root(dask_cluster_2: DaskCluster) -> Iterator[tuple[str, str]]:
    """(source path with the placeholder, this test's directory name under each node's directory)."""
    name = f"hot-{uuid.uuid4().hex[:8]}"
    yield f"{dask_cluster_2.state_dir}/${{CKPTVAULT_NODE}}/{name}", name
    for i in range(dask_cluster_2.workers):
        shutil.rmtree(dask_cluster_2.node_dir(i) / name, ignore_errors=True)


def _place(all_root: Path, c: DaskCluster, name: str, nodes: set[int]) -> None:
    """Copy each file (mtime kept) to the directory of the node that holds it, for `nodes` only."""
    p = Placement(c.workers, PATTERN, PER_NODE)
    for f in sorted(all_root.rglob("*")):
        if not f.is_file():
            continue
        rel = f.relative_to(all_root)
        ckpt_rel = rel.relative_to(rel.parts[0]).as_posix()  # the path inside the checkpoint
        node = p.node_of(ckpt_rel)
        if node in nodes:
            dest = c.node_dir(node) / name / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
            # directories' mtimes count in a checkpoint's newest mtime (its created_at): as written
            shutil.copystat(f.parent, dest.parent)


def _node_config(tmp_path: Path, endpoint: Any, bucket: str, path: str, address: str | None, nodes: int = 2) -> Path:
    scale = f'[scale]\ndask_address = "{address}"\nnode_timeout_seconds = 60\n' if address else ""
    cfg = write_config(tmp_path / f"nodes-{bucket}.toml", endpoint, bucket, [], extra="")
    cfg.write_text(
        cfg.read_text()
        + f'[[sources]]\nrun = "{RUN}"\npath = "{path}"\nformat = "dcp"\nsettle_seconds = 0\n'
        + f"locality = \"node\"\nnodes = {nodes}\nnode_pattern = '{PATTERN}'\nranks_per_node = {PER_NODE}\n"
        + NO_GATES
        + scale
    )
    return cfg


def _ingest(capsys: pytest.CaptureFixture[str], cfg: Path) -> tuple[int, list[dict[str, Any]], str]:
    capsys.readouterr()
    rc = main(["--config", str(cfg), "ingest", "--json"])
    out = capsys.readouterr()
    outcomes: list[dict[str, Any]] = json.loads(out.out)["outcomes"] if out.out.strip() else []
    return rc, outcomes, out.err


def _stored(client: Any, bucket: str) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    # `source` differs too: the directory read (the nodes' path, or the one directory); and `placement`,
    # which only a node-local source's manifest records (checked on its own below)
    return stored_checkpoints(client, bucket, f"t/{RUN}/", ignore=("uploaded_at", "source", "placement"))


@pytest.mark.parametrize("store", PIPELINE_STORES, indirect=True)
def test_each_node_uploads_its_own_files_once_the_last_node_has_them_and_stores_the_same(
    api_env: dict[str, str], store: Any, bucket_factory: Any, checkpoints: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], dask_cluster_2: DaskCluster, node_root: tuple[str, str],
) -> None:  # fmt: skip
    c = dask_cluster_2
    path, name = node_root
    single_bucket = bucket_factory(store)
    plain = write_config(tmp_path / "plain.toml", store, single_bucket, [(RUN, checkpoints, "dcp")], extra=NO_GATES)
    rc, outcomes, err = _ingest(capsys, plain)
    assert rc == 0 and [o["result"] for o in outcomes] == ["uploaded"] * len(STEPS), err[-2000:]
    single = _stored(store.client(), single_bucket)

    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    dask_probe.clear(dirs)
    bucket = bucket_factory(store)
    cfg = _node_config(tmp_path, store, bucket, path, c.address)

    # node-1 has not written its ranks yet: the checkpoints wait for it, by name, and nothing is sent
    _place(checkpoints, c, name, {0})
    rc, outcomes, err = _ingest(capsys, cfg)
    assert rc == 0, err[-3000:]
    assert [(o["step"], o["result"]) for o in outcomes] == [(s, "waiting") for s in STEPS]
    assert all("waiting for node-1: none of its files are there yet" in o["message"] for o in outcomes)
    assert _stored(store.client(), bucket) == ({}, {})

    _place(checkpoints, c, name, {1})
    rc, outcomes, err = _ingest(capsys, cfg)
    assert rc == 0, err[-3000:]
    assert [(o["step"], o["result"], o["files"]) for o in outcomes] == [(s, "uploaded", RANKS + 1) for s in STEPS]
    objects, manifests = _stored(store.client(), bucket)
    assert len(manifests) == len(STEPS) and manifests == single[1]
    assert objects.keys() == single[0].keys() and objects == single[0]
    # each manifest records where its files lived, for restore --node-local whatever the config says later
    placed = {"nodes": 2, "node_pattern": PATTERN, "ranks_per_node": PER_NODE}
    for key in manifests:
        assert json.loads(store.client().get_object(Bucket=bucket, Key=key)["Body"].read())["placement"] == placed
    assert all("placement" not in json.loads(store.client().get_object(Bucket=single_bucket, Key=k)["Body"].read())
               for k in single[1])  # fmt: skip

    # where each task ran: every file read by the worker of its own node, from that node's directory
    records = [r for r in dask_probe.records(dirs) if r["event"] == "memory"]
    uploads = [r for r in records if r["key"].startswith("upload_one_task")]
    p = Placement(2, PATTERN, PER_NODE)
    assert sorted(r["rel"] for r in uploads) == sorted([".metadata", *(f"__{r}_0.distcp" for r in range(RANKS))] * 2)
    for r in uploads:
        node = p.name(p.node_of(r["rel"]))
        assert r["node"] == node and r["path"].startswith(f"{c.state_dir}/{node}/{name}/"), r
    assert {r["node"] for r in uploads} == {"node-0", "node-1"}
    # a Dask key starts with the function's name: here the library's, declared a task
    lists = [r for r in records if r["key"].startswith("list_node-")]
    assert lists and all(r["node"] == f"node-{r['lists']}" for r in lists)
    pids = c.worker_pids()
    assert {(r["node"], r["pid"]) for r in uploads} == set(pids.items())

    # the job's nodes gone (here: a node-2 no worker serves): committed checkpoints stay present, named,
    # instead of failing every pass; nothing is sent or changed
    (tmp_path / "gone").mkdir()
    gone = _node_config(tmp_path / "gone", store, bucket, path, c.address, nodes=3)
    rc, outcomes, err = _ingest(capsys, gone)
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert [(o["step"], o["result"]) for o in outcomes] == [(s, "present") for s in STEPS]
    assert all("no Dask worker for node-2" in o["message"] and "committed save 1 holds" in o["message"]
               for o in outcomes), outcomes  # fmt: skip
    assert _stored(store.client(), bucket) == (objects, manifests)


@pytest.mark.parametrize("store", PIPELINE_STORES, indirect=True)
def test_a_node_without_a_worker_fails_the_checkpoint_naming_it_in_bounded_time(
    api_env: dict[str, str], store: Any, bucket_factory: Any, checkpoints: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], dask_cluster_2: DaskCluster, node_root: tuple[str, str],
) -> None:  # fmt: skip
    c = dask_cluster_2
    path, name = node_root
    _place(checkpoints, c, name, {0, 1})
    bucket = bucket_factory(store)
    cfg = _node_config(tmp_path, store, bucket, path, c.address, nodes=3)  # node-2 has no worker
    t0 = time.monotonic()
    rc, outcomes, err = _ingest(capsys, cfg)
    assert time.monotonic() - t0 < 120
    assert rc == 1 and "Traceback" not in err
    assert [(o["step"], o["result"]) for o in outcomes] == [(s, "failed") for s in STEPS]
    assert all("no Dask worker for node-2" in o["message"] and "--resources node-2=1" in o["message"]
               for o in outcomes)  # fmt: skip
    assert _stored(store.client(), bucket) == ({}, {})


def test_a_rank_file_lost_on_another_node_makes_the_checkpoint_invalid_naming_it_and_its_node(
    api_env: dict[str, str], store: Any, bucket_factory: Any, checkpoints: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], dask_cluster_2: DaskCluster, node_root: tuple[str, str],
) -> None:  # fmt: skip
    """The flow's own discovery sees node 0's files only; node-1 still has rank 3's shard, so only the
    rank rule over every node's names finds rank 2's missing."""
    c = dask_cluster_2
    path, name = node_root
    _place(checkpoints, c, name, {0, 1})
    lost = sorted((c.node_dir(1) / name).rglob("__2_0.distcp"))
    assert len(lost) == len(STEPS)
    for f in lost:
        f.unlink()
    bucket = bucket_factory(store)
    rc, outcomes, err = _ingest(capsys, _node_config(tmp_path, store, bucket, path, c.address))
    assert rc == 1 and "Traceback" not in err, err[-3000:]
    assert [(o["step"], o["result"]) for o in outcomes] == [(s, "invalid") for s in STEPS], outcomes
    assert all("__2_*.distcp: missing on node-1" in o["message"] for o in outcomes), outcomes
    assert _stored(store.client(), bucket) == ({}, {})


def test_without_dask_a_node_local_source_is_refused_with_the_fix(
    seaweedfs: Any, bucket_factory: Any, checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("CKPTVAULT_NODE", "node-0")
    node0 = tmp_path / "node-0"
    shutil.copytree(checkpoints, node0)
    bucket = bucket_factory(seaweedfs)
    cfg = _node_config(tmp_path, seaweedfs, bucket, str(tmp_path / "${CKPTVAULT_NODE}"), None)
    rc, outcomes, err = _ingest(capsys, cfg)
    assert rc == 1 and "Traceback" not in err, err[-3000:]
    assert [o["result"] for o in outcomes] == ["failed"] * len(STEPS)
    assert all('locality = "node"' in o["message"] and "[scale] dask_address" in o["message"] for o in outcomes)
    assert _stored(seaweedfs.client(), bucket) == ({}, {})


def test_a_node_local_file_over_split_size_goes_up_in_ranges_all_on_its_own_node(
    api_env: dict[str, str], store: Any, bucket_factory: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], dask_cluster_2: DaskCluster, node_root: tuple[str, str],
) -> None:  # fmt: skip
    c = dask_cluster_2
    path, name = node_root
    big = tmp_path / "big"
    write_checkpoint(big, "dcp", 300, 44 * MiB, shards=RANKS, seed=3)  # 4 rank files of ~11 MiB: 3 parts each
    single_bucket = bucket_factory(store)
    plain = write_config(tmp_path / "plain.toml", store, single_bucket, [(RUN, big, "dcp")], extra=NO_GATES)
    rc, outcomes, err = _ingest(capsys, plain)
    assert rc == 0 and [o["result"] for o in outcomes] == ["uploaded"], err[-2000:]
    single = _stored(store.client(), single_bucket)

    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    dask_probe.clear(dirs)
    bucket = bucket_factory(store)
    cfg = _node_config(tmp_path, store, bucket, path, c.address)
    cfg.write_text(cfg.read_text().replace("[scale]\n", "[scale]\nsplit_size_mb = 5\n"))
    _place(big, c, name, {0, 1})
    rc, outcomes, err = _ingest(capsys, cfg)
    assert rc == 0 and [o["result"] for o in outcomes] == ["uploaded"], err[-3000:]
    assert _stored(store.client(), bucket) == single  # the same bytes and manifest as one process, unsplit

    # every range read by its file's own node's worker, from that node's directory; each file's 3 parts
    # as 3 ranges of one part
    ranges = [r for r in dask_probe.records(dirs) if r["event"] == "memory" and r["key"].startswith("send_range_task")]
    p = Placement(2, PATTERN, PER_NODE)
    assert sorted((r["rel"], r["first"]) for r in ranges) == [(f"__{k}_0.distcp", n) for k in range(RANKS)
                                                              for n in (1, 2, 3)]  # fmt: skip
    for r in ranges:
        node = p.name(p.node_of(r["rel"]))
        assert r["node"] == node and r["path"].startswith(f"{c.state_dir}/{node}/{name}/"), r
    assert store.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
