"""Scale-out: the full ingest flow with its per-file upload tasks on a local Dask cluster of 2 workers
(prefect-dask), against a real S3 server (SeaweedFS) and a real Prefect API over HTTP.

Worker *processes*: each Dask worker is its own OS process that runs Prefect task runs and reports them
to the test's Prefect server (PREFECT_API_URL is handed to the workers by ckptvault_prefect.runtime.runners).
The S3Store argument of every upload task is pickled to reach them (S3Store.__getstate__ drops the boto3 client;
the worker builds its own). The same checkpoints ingested with the default thread-pool runner must give
the same objects, byte for byte and CRC for CRC.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, Manifest, checkpoint_prefix
from ckptvault.config import SourceConfig, StoreConfig
from ckptvault.ingest.steps import find_checkpoints, plan_upload
from ckptvault.store import S3Store
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import crc32c_b64, write_config

MiB = 2**20

# (run, format, step, bytes): single PUTs and one multipart file (> 5 MiB part size) per checkpoint set
CHECKPOINTS = [("hf", "hf", 100, 3 * MiB), ("ds", "deepspeed", 10, 12 * MiB), ("lt", "lightning", 7, 2 * MiB)]
# per-pass metadata objects (timestamps, flow run ids inside): compared by content, not bytes
PASS_METADATA = ("_MANIFEST.json", "_VALIDATION.json")


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch, seaweedfs: Any) -> Any:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    return seaweedfs


@pytest.fixture
def sources(tmp_path: Path) -> dict[tuple[str, int], Path]:
    """(run, step) -> the checkpoint's directory; runs live in tmp_path/<run>."""
    return {
        (run, step): write_checkpoint(tmp_path / run, fmt, step, size, shards=2, seed=step)
        for run, fmt, step, size in CHECKPOINTS
    }


@pytest.fixture
def worker_stats(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """What each Dask worker did, read from the live cluster just before the flow shuts it down."""
    from ckptvault_prefect.runtime.runners import CkptvaultDaskTaskRunner

    seen: list[dict[str, Any]] = []
    original_exit = CkptvaultDaskTaskRunner.__exit__

    def stats(dask_worker: Any) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "executed": dask_worker.state.executed_count,
            "local_directory": dask_worker.local_directory,
        }

    def exit_and_record(self: CkptvaultDaskTaskRunner, *args: Any) -> None:
        if self._client is not None:
            cluster: Any = self._client.cluster
            http = cluster.scheduler.http_server
            ports = [sock.getsockname()[1] for sock in http._sockets.values()]
            seen.append({"workers": self._client.run(stats), "scheduler_http_ports": ports})
        original_exit(self, *args)

    monkeypatch.setattr(CkptvaultDaskTaskRunner, "__exit__", exit_and_record)
    yield seen


def _objects(client: Any, bucket: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="t/"):
        for o in page.get("Contents", []):
            # the catalog, the pass's metadata and the metrics' ledger are named per pass (time, uuid)
            if not any(k in o["Key"] for k in ("/_catalog/", "/_state/ledger/")) and not o["Key"].endswith(
                PASS_METADATA
            ):
                out[o["Key"]] = o["Size"]
    return out


def _manifest(client: Any, bucket: str, run: str, step: int) -> Manifest:
    key = checkpoint_prefix("t", run, step) + MANIFEST_NAME
    return Manifest.from_json(client.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_s3store_pickles_as_its_config_and_rebuilds_its_client(creds: Any, bucket_factory: Any) -> None:
    bucket = bucket_factory(creds)
    store = S3Store(StoreConfig(bucket=bucket, prefix="t", endpoint_url=creds.url, region=creds.region))
    caps = store.capabilities()  # probed once here; the copy must not probe again
    copy = pickle.loads(pickle.dumps(store))
    assert copy.client is not store.client
    assert copy.cfg == store.cfg and copy.transfer == store.transfer
    assert copy._caps == caps and copy.capabilities() == caps
    copy.put_bytes("t/pickled", b"hello")
    assert store.get_bytes("t/pickled") == b"hello"


def test_a_store_planned_for_uploads_reaches_the_tasks_knowing_its_capabilities(
    creds: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    """plan_upload runs where the flow runs; the upload tasks get pickled copies of its store. Were the
    capabilities not learnt before, every task's copy would probe the server again."""
    store = S3Store(StoreConfig(bucket=bucket_factory(creds), prefix="t", endpoint_url=creds.url, region=creds.region))
    write_checkpoint(tmp_path, "hf", 10, 2**16, seed=3)
    [found] = find_checkpoints(SourceConfig(run="r", path=tmp_path, format="hf", settle_seconds=0)).found
    assert store._caps is None  # opening a store does not probe
    jobs = plan_upload(store, "t", found)
    assert jobs and all(j.upload for j in jobs)
    copy = pickle.loads(pickle.dumps(store))
    assert copy._caps is not None and copy._caps == store.capabilities()


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_ingest_on_a_two_worker_dask_cluster_moves_the_same_bytes(
    prefect_api: None,
    creds: Any,
    bucket_factory: Any,
    sources: dict[tuple[str, int], Path],
    worker_stats: list[dict[str, Any]],
    tmp_path: Path,
    processes: bool,
) -> None:
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.runtime.runners import dask_task_runner, scratch_dir

    roots = [(run, tmp_path / run, fmt) for run, fmt, _, _ in CHECKPOINTS]  # one checkpoint per run
    dask_bucket, plain_bucket = bucket_factory(creds), bucket_factory(creds)
    dask_cfg = write_config(tmp_path / "dask.toml", creds, dask_bucket, roots)
    plain_cfg = write_config(tmp_path / "plain.toml", creds, plain_bucket, roots)

    runner: Any = dask_task_runner(2, processes=processes)  # a TaskRunner[PrefectDaskFuture]: invariant generic
    outcomes = ingest.with_options(task_runner=runner)(config_path=str(dask_cfg))

    assert {(o.run, o.step): o.result for o in outcomes} == {(r, s): "uploaded" for r, _, s, _ in CHECKPOINTS}
    files = sum(o.files for o in outcomes)
    assert sum(o.uploaded_files for o in outcomes) == files

    # the uploads ran on the two Dask workers, in their own processes when processes=True
    assert len(worker_stats) == 1, "the Dask task runner was not used"
    workers = worker_stats[0]["workers"]
    assert len(workers) == 2
    assert all(w["local_directory"].startswith(scratch_dir()) for w in workers.values())
    assert 8787 not in worker_stats[0]["scheduler_http_ports"]  # no dashboard port
    assert sum(w["executed"] for w in workers.values()) == files
    pids = {w["pid"] for w in workers.values()}
    if processes:
        assert len(pids) == 2 and os.getpid() not in pids
    else:
        assert pids == {os.getpid()}

    client = creds.client()
    manifests = {o["Key"] for o in client.list_objects_v2(Bucket=dask_bucket, Prefix="t/")["Contents"]}
    assert {checkpoint_prefix("t", r, s) + MANIFEST_NAME for r, _, s, _ in CHECKPOINTS} <= manifests
    dask_objects = _objects(client, dask_bucket)
    for run, _fmt, step, _size in CHECKPOINTS:
        m = _manifest(client, dask_bucket, run, step)
        written = sources[(run, step)]
        src = written if written.is_dir() else written.parent  # lightning: one file in the run root
        assert {checkpoint_prefix("t", run, step) + f.path for f in m.files} <= set(dask_objects)
        for f in m.files:
            assert f.crc32c == crc32c_b64(src / f.path), f.path
            body = client.get_object(Bucket=dask_bucket, Key=checkpoint_prefix("t", run, step) + f.path)["Body"]
            assert body.read() == (src / f.path).read_bytes(), f.path

    if not processes:
        return  # the comparison with the default runner once is enough (it costs a full ingest)
    # the default (thread pool) runner, same checkpoints: the same objects, sizes and CRCs
    plain = ingest(config_path=str(plain_cfg))
    assert all(o.result == "uploaded" for o in plain)
    assert _objects(client, plain_bucket) == dask_objects
    for run, _fmt, step, _size in CHECKPOINTS:
        a, b = _manifest(client, dask_bucket, run, step), _manifest(client, plain_bucket, run, step)
        assert {(f.path, f.size, f.crc32c) for f in a.files} == {(f.path, f.size, f.crc32c) for f in b.files}


def test_worker_processes_without_a_prefect_server_are_refused_early() -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from ckptvault_prefect.runtime.runners import NoPrefectApiError, dask_task_runner

    runner = dask_task_runner(2, processes=True)
    with (
        temporary_settings(restore_defaults={PREFECT_API_URL}),
        pytest.raises(NoPrefectApiError, match="PREFECT_API_URL"),
    ):
        runner.__enter__()
    assert runner._cluster is None  # refused before any cluster was started
