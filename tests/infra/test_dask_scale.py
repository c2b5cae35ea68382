"""`ckptvault ingest` on Dask ([scale], --dask-address, --dask-workers), through the command line,
against a real S3 server (SeaweedFS; the dask_address and killed-worker cases on Ceph RGW too) and a
real Prefect API: what is refused before any work, and with what message; that a multi-checkpoint
source ingested on 2 Dask worker processes (a LocalCluster of --dask-workers, or the
infra/local/dask.sh cluster of dask_address) gives the same objects and manifests as a single-process
ingest, with the uploads run by the workers (recorded by each worker: tests/dask_probe.py); and that a
worker SIGKILLed in the middle of an upload costs a retry, not the checkpoint: the pass completes,
nothing is committed twice, the restore is byte-identical. A file over `split_size_mb` goes up as range
tasks on both workers and stores the same as an unsplit ingest; a worker killed inside a range costs
that range's retry and leaves no incomplete upload."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask.config
import psutil
import pytest

from ckptvault.checkpoint.manifest import checkpoint_prefix
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests import dask_probe
from tests.dask_cluster import DaskCluster
from tests.faultproxy import FaultProxy
from tests.helpers import PIPELINE_STORES, stored_checkpoints, write_config

MiB = 2**20


@pytest.fixture
def one_source(seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config with one run of one small checkpoint, the store's credentials in the environment."""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    root = tmp_path / "hot"
    root.mkdir()
    write_checkpoint(root, "hf", 100, MiB, seed=1)
    return write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [("r", root, "hf")])


def _closed_port() -> int:
    with socket.socket() as s:  # bound and closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_an_unreachable_scheduler_is_exit_2_naming_it_and_the_fix(
    one_source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # an API URL that nothing serves: the scheduler check comes before any use of Prefect
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{_closed_port()}/api")
    address = f"tcp://127.0.0.1:{_closed_port()}"
    with one_source.open("a") as f:
        f.write(f'[scale]\ndask_address = "{address}"\nconnect_timeout_seconds = 1\n')
    err = _refused(capsys, ["--config", str(one_source), "ingest"])
    assert f"[scale] dask_address: no Dask scheduler answered at {address} within 1 s" in err
    assert "infra/local/dask.sh up" in err


def test_a_bad_address_flag_is_exit_2_with_the_form_to_use(
    one_source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused(capsys, ["--config", str(one_source), "ingest", "--dask-address", "dask-scheduler:8786"])
    assert "--dask-address: 'dask-scheduler:8786' is not a Dask scheduler address" in err
    assert "tcp://HOST:PORT" in err


def test_a_cluster_without_a_prefect_server_is_exit_2(
    one_source: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    err = _refused(capsys, ["--config", str(one_source), "ingest", "--dask-address", "tcp://127.0.0.1:8786"])
    assert "PREFECT_API_URL" in err and "--dask-workers N" in err


def test_a_bad_scale_key_is_exit_2_naming_it(one_source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with one_source.open("a") as f:
        f.write('[scale]\ndask_address = "http://h:8786"\n')
    err = _refused(capsys, ["--config", str(one_source), "ingest"])
    assert "scale.dask_address" in err and "tcp://HOST:PORT" in err


# one run, 3 checkpoints; each shard (~6 MiB) is a multipart upload at part_size_mb = 5
RUN, STEPS, CKPT_BYTES = "llm", (100, 200, 300), 12 * MiB
NO_GATES = "[validation]\nenabled = false\n"  # the gates are not what is compared here, and cost ~3 s each


@pytest.fixture
def hot(tmp_path: Path) -> Path:
    root = tmp_path / "hot"
    for step in STEPS:
        write_checkpoint(root, "hf", step, CKPT_BYTES, shards=2, seed=step)
    return root


@pytest.fixture
def api_env(prefect_api: None, store: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The store's credentials and the test Prefect API, in this process's environment (the command
    line reads PREFECT_API_URL from there) and returned for a child process."""
    from prefect.settings import PREFECT_API_URL

    env = {**store.env(), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def _config(tmp_path: Path, name: str, endpoint: Any, bucket: str, hot: Path, extra: str = "") -> Path:
    return write_config(tmp_path / f"{name}.toml", endpoint, bucket, [(RUN, hot, "hf")], extra=NO_GATES + extra)


def _ingest(capsys: pytest.CaptureFixture[str], cfg: Path, *flags: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    rc = main(["--config", str(cfg), "ingest", "--json", *flags])
    out = capsys.readouterr()
    assert rc == 0, out.err[-3000:]
    outcomes: list[dict[str, Any]] = json.loads(out.out)["outcomes"]
    return outcomes


def _stored(client: Any, bucket: str) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    return stored_checkpoints(client, bucket, f"t/{RUN}/")  # uploaded_at: the one field that differs


def _single_process(capsys: pytest.CaptureFixture[str], tmp_path: Path, store: Any, bucket_factory: Any,
                    hot: Path) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:  # fmt: skip
    bucket = bucket_factory(store)
    outcomes = _ingest(capsys, _config(tmp_path, "plain", store, bucket, hot))
    assert [o["result"] for o in outcomes] == ["uploaded"] * len(STEPS)
    return _stored(store.client(), bucket)


@dataclasses.dataclass(frozen=True)
class _Front:
    """What write_config reads of an endpoint: the proxy in front of the server."""

    url: str
    region: str


def _uploads(records: list[dict[str, Any]], event: str = "memory") -> list[dict[str, Any]]:
    # Prefect's Dask client keys a task by its function's name: upload_one_task-<token>
    return [r for r in records if r["key"].startswith("upload_one_task") and r["event"] == event]


def _same_as_single_process(stored: Any, single: Any) -> None:
    objects, manifests = stored
    assert len(manifests) == len(STEPS) and manifests == single[1]
    assert objects.keys() == single[0].keys() and objects == single[0]


def test_dask_workers_flag_runs_the_uploads_in_two_worker_processes_and_stores_the_same(
    api_env: dict[str, str], store: Any, bucket_factory: Any, hot: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    single = _single_process(capsys, tmp_path, store, bucket_factory, hot)
    nodes = tmp_path / "local-cluster"
    nodes.mkdir()
    # the LocalCluster's spawned workers inherit this environment, and their nannies hand them this
    # process's Dask config: the probe as a preload
    monkeypatch.setenv("CKPTVAULT_NODE_DIR", str(nodes))
    bucket = bucket_factory(store)
    with dask.config.set({"distributed.worker.preload": ["tests.dask_probe"]}):
        outcomes = _ingest(capsys, _config(tmp_path, "dask", store, bucket, hot), "--dask-workers", "2")
    assert [(o["step"], o["result"]) for o in outcomes] == [(s, "uploaded") for s in STEPS]
    _same_as_single_process(_stored(store.client(), bucket), single)
    done = _uploads(dask_probe.records([nodes]))
    assert len(done) == sum(o["files"] for o in outcomes)
    pids = {r["pid"] for r in done}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes, neither this one


@pytest.mark.parametrize("store", PIPELINE_STORES, indirect=True)
def test_dask_address_runs_the_uploads_on_the_clusters_workers_and_stores_the_same(
    api_env: dict[str, str], store: Any, bucket_factory: Any, hot: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], dask_cluster_2: DaskCluster,
) -> None:  # fmt: skip
    c = dask_cluster_2
    single = _single_process(capsys, tmp_path, store, bucket_factory, hot)
    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    dask_probe.clear(dirs)
    bucket = bucket_factory(store)
    # Through a proxy holding the first CompleteMultipartUpload (one of checkpoint 100's files, the first
    # submitted) until an upload of checkpoint 200 is running beside it. A flow that waited for one
    # checkpoint's uploads before submitting the next would never start one: the check is of the
    # flow's order, not of timing. The other worker finishes checkpoint 100's other files meanwhile.
    proxy = FaultProxy(store.url).start()
    cfg = _config(tmp_path, "dask", _Front(proxy.url, store.region), bucket, hot,
                  f'[scale]\ndask_address = "{c.address}"\n')  # fmt: skip
    beside: list[set[str]] = []  # checkpoint 100's unfinished uploads when one of 200's was running

    def release_once_the_second_checkpoint_uploads() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            records = dask_probe.records(dirs)
            running = {r["path"] for r in _uploads(records, "executing")}
            running -= {r["path"] for r in _uploads(records, "memory")}
            if any("/checkpoint-200/" in p for p in running):
                beside.append({p for p in running if "/checkpoint-100/" in p})
                break
            time.sleep(0.2)
        proxy.release()

    proxy.hold("CompleteMultipartUpload", first=1, under=f"/t/{RUN}/")  # a file's, not the capability probe's
    watcher = threading.Thread(target=release_once_the_second_checkpoint_uploads, daemon=True)
    watcher.start()
    try:
        outcomes = _ingest(capsys, cfg)
    finally:
        proxy.release()
        watcher.join(timeout=100)
        proxy.stop()
    assert len(proxy.held) == 1, "the proxy held no CompleteMultipartUpload: the test checked nothing"
    # the server's capabilities probed once, by the flow (RestoreObject: only the probe sends one), not
    # again by each upload task's copy of the store (before plan_upload learnt them: 28 in this pass)
    assert proxy.requests["RestoreObject"] == 1, proxy.requests
    assert beside, "no upload of checkpoint 200 ran while checkpoint 100's first upload was held"
    assert len(beside[0]) == 1, f"checkpoint 100's held upload was not running beside 200's: {beside}"
    assert [(o["step"], o["result"]) for o in outcomes] == [(s, "uploaded") for s in STEPS]
    _same_as_single_process(_stored(store.client(), bucket), single)
    records = dask_probe.records(dirs)
    done = _uploads(records)
    assert len(done) == sum(o["files"] for o in outcomes)
    pids = c.worker_pids()
    assert {(r["node"], r["pid"]) for r in done} == {(n, p) for n, p in pids.items()}  # both nodes worked
    spans = _spans(records)  # every checkpoint's uploads ran on the workers
    assert sorted(spans) == list(STEPS)


@pytest.mark.parametrize("store", PIPELINE_STORES, indirect=True)
def test_a_file_over_split_size_goes_up_in_ranges_on_both_workers_and_stores_the_same(
    api_env: dict[str, str], store: Any, bucket_factory: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], dask_cluster_2: DaskCluster,
) -> None:  # fmt: skip
    c = dask_cluster_2
    root = tmp_path / "big"
    write_checkpoint(root, "hf", 500, 30 * MiB, shards=2, seed=9)  # optimizer.pt ~21 MiB: 5 parts of 5 MiB
    big = root / "checkpoint-500" / "optimizer.pt"
    assert 20 * MiB < big.stat().st_size <= 25 * MiB
    plain = bucket_factory(store)  # one process, nothing split: what the cluster must store too
    outcomes = _ingest(capsys, _config(tmp_path, "plain", store, plain, root, "[scale]\nsplit_size_mb = 0\n"))
    assert [o["result"] for o in outcomes] == ["uploaded"]
    single = stored_checkpoints(store.client(), plain, f"t/{RUN}/")

    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    dask_probe.clear(dirs)
    bucket = bucket_factory(store)
    scale = f'[scale]\ndask_address = "{c.address}"\nsplit_size_mb = 5\n'
    outcomes = _ingest(capsys, _config(tmp_path, "split", store, bucket, root, scale))
    assert [o["result"] for o in outcomes] == ["uploaded"]
    assert stored_checkpoints(store.client(), bucket, f"t/{RUN}/") == single  # same bytes, same manifest
    assert store.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    records = dask_probe.records(dirs)
    ranges = [r for r in records if r["key"].startswith("send_range_task") and r["event"] == "memory"]
    # every file over 5 MiB (optimizer.pt and the two weight shards) in ranges of one part, each its own
    # task, on the workers; submitted at once to two 1-thread workers, so both send some (each range is
    # a Prefect task run on its worker: far longer than the scheduler takes to hand the next to the idle one)
    over = {p.name: p.stat().st_size for p in big.parent.iterdir() if p.stat().st_size > 5 * MiB}
    assert "optimizer.pt" in over and len(over) > 1
    expected = sorted((name, n) for name, size in over.items() for n in range(1, -(-size // (5 * MiB)) + 1))
    assert sorted((r["rel"], r["first"]) for r in ranges) == expected
    assert {(r["node"], r["pid"]) for r in ranges} == set(c.worker_pids().items())
    whole = {r["rel"] for r in _uploads(records)}
    assert whole == {p.name for p in big.parent.iterdir()} - over.keys()  # the rest: one task a file


def _spans(records: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """Per checkpoint step: when its first upload task started and its last ended, on any worker."""
    started = {r["key"]: r for r in _uploads(records, "executing")}
    out: dict[int, tuple[float, float]] = {}
    for r in _uploads(records):
        step = _step_of(r["path"])
        first, last = out.get(step, (float("inf"), 0.0))
        out[step] = (min(first, started[r["key"]]["t"]), max(last, r["t"]))
    return out


def _step_of(path: str) -> int:
    m = re.search(r"/checkpoint-(\d+)/", path)  # hot/checkpoint-<step>/...
    assert m is not None, path
    return int(m[1])


def _pid_with_local_port(pids: list[int], port: int) -> int:
    for pid in pids:
        if any(conn.laddr and conn.laddr.port == port for conn in psutil.Process(pid).net_connections("tcp")):
            return pid
    raise AssertionError(f"no worker process among {pids} has a connection from port {port}")


# Ceph with every file one task (the kill lands in a whole file's upload); SeaweedFS with every file over
# 5 MiB split into ranges of one part (split_size_mb = 5; smaller files are one PutObject): every UploadPart
# is then a range task's, so the kill lands in one. The retry is the cluster's and ckptvault's, not the
# store's: a third case, SeaweedFS with whole files, added ~45 s to the suite and no path of its own.
KILL_CASES = [
    pytest.param("ceph", 0, id="ceph", marks=pytest.mark.ceph),
    pytest.param("seaweedfs", 5, id="seaweedfs-split"),
]


def _sends(records: list[dict[str, Any]], event: str = "memory") -> list[dict[str, Any]]:
    """The tasks that send bytes: a whole file's upload, or a range of a split file's."""
    keys = ("upload_one_task", "send_range_task")
    return [r for r in records if r["key"].startswith(keys) and r["event"] == event]


@pytest.mark.parametrize(("store", "split_mb"), KILL_CASES, indirect=["store"])
def test_a_worker_killed_mid_upload_costs_a_retry_not_the_checkpoint(
    api_env: dict[str, str], store: Any, split_mb: int, bucket_factory: Any, hot: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], dask_cluster_factory: Callable[[str], DaskCluster],
) -> None:  # fmt: skip
    c = dask_cluster_factory("kill")  # its own: this test kills one of its workers
    single = _single_process(capsys, tmp_path, store, bucket_factory, hot)
    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    bucket = bucket_factory(store)
    with FaultProxy(store.url) as proxy:
        via_proxy = dataclasses.replace(store, url=proxy.url)
        scale = f'[scale]\ndask_address = "{c.address}"\nsplit_size_mb = {split_mb}\n'
        cfg = _config(tmp_path, "dask", via_proxy, bucket, hot, scale)
        # every part of a file waits at the proxy: a worker inside an upload, by construction
        proxy.hold("UploadPart", under=f"/t/{RUN}/")
        cli = subprocess.Popen(
            [sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), "ingest", "--json"],
            env={**os.environ, **api_env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proxy.first_held.wait(timeout=300), "no part upload reached the store"
            before = c.worker_pids()
            victim = _pid_with_local_port(list(before.values()), proxy.held[0][1])
            os.kill(victim, signal.SIGKILL)
        finally:
            proxy.release()
            out, err = cli.communicate(timeout=600)
        assert cli.returncode == 0, err[-3000:]
        outcomes = json.loads(out)["outcomes"]
        assert [(o["step"], o["result"], o["save"]) for o in outcomes] == [(s, "uploaded", 1) for s in STEPS]

        # converged: the same objects and manifests as one process, one save per step, nothing left to do
        _same_as_single_process(_stored(store.client(), bucket), single)
        again = _ingest(capsys, cfg)
        assert [(o["result"], o["uploaded_files"]) for o in again] == [("present", 0)] * len(STEPS)
        capsys.readouterr()
        assert main(["--config", str(cfg), "ls", "--run", RUN, "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert sorted((r["step"], r["save"], r["state"]) for r in rows) == [(s, 1, "verified") for s in STEPS]
        for step in STEPS:
            dest = tmp_path / f"restored-{step}"
            assert main(["--config", str(cfg), "restore", RUN, "--step", str(step), "--dest", str(dest)]) == 0
            src = hot / f"checkpoint-{step}"
            files = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
            back = dest / f"checkpoint-{step}"
            assert files and all((back / f).read_bytes() == (src / f).read_bytes() for f in files)

    # the killed worker had started an upload and never finished it (it may have finished others before:
    # a small file needs no UploadPart); that task finished on a live worker
    records = dask_probe.records(dirs)
    started = {r["key"] for r in _sends(records, "executing") if r["pid"] == victim}
    finished = {r["key"]: r["pid"] for r in _sends(records)}
    cut = {k for k in started if finished.get(k) != victim}  # started there, never finished there
    assert cut and all(k in finished for k in cut), (started, finished, victim)
    assert victim not in c.worker_pids().values()  # its nanny started a new worker process
    # what the kill leaves behind: at most the victim's own multipart upload(s), never completed, and
    # nothing of the retry (its upload completed) nor of a capability probe. The next pass that uploads
    # aborts them once STALE_UPLOAD_SECONDS old, the bucket's abort-incomplete-MPU rule after a day: on
    # the test Ceph a lifecycle day lasts 10 s (LC_DEBUG_INTERVAL), so there it may be gone already.
    victims_keys = {checkpoint_prefix("t", RUN, _step_of(r["path"])) + r["rel"]
                    for r in _sends(records, "executing") if r["key"] in cut}  # fmt: skip
    left = [u["Key"] for u in store.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    assert set(left) <= victims_keys and len(left) == len(set(left)), (left, victims_keys)
    if split_mb:
        # the kill cut a range (every UploadPart is one's); its upload belongs to the flow, which
        # completed it once the rerun range was in: nothing at all is left incomplete
        assert all(k.startswith("send_range_task") for k in cut), cut
        assert left == [], left
