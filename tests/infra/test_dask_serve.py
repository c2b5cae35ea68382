"""`ckptvault serve` with `[scale]`: the served ingest deployment's runs use the task runner the config
names, as `ckptvault ingest` does. Checked on the deployment objects serve builds, by `serve` refusing a
scheduler that does not answer (exit 2 at start), and by one served run against a real Prefect server,
SeaweedFS and the real 2-worker cluster: the uploads ran on the cluster's workers (each worker records
where its tasks ran: tests/dask_probe.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault_cli.synthetic import write_checkpoint
from tests import dask_probe
from tests.dask_cluster import DaskCluster
from tests.deployments import local_prefect
from tests.deployments.local_prefect import wait_for
from tests.deployments.test_serve import _stop_group, prefect_server  # noqa: F401 - the fixture
from tests.helpers import write_config
from tests.infra.test_dask_scale import _closed_port

pytestmark = pytest.mark.timeout(600)
MiB = 2**20
CKPTVAULT = str(Path(sys.executable).parent / "ckptvault")


def test_serve_binds_the_ingest_deployment_to_the_configs_task_runner() -> None:
    from ckptvault.config import ScaleConfig
    from ckptvault_prefect.deployments.serve import served_flows
    from ckptvault_prefect.runtime.runners import CkptvaultDaskTaskRunner, task_runner_for
    from ckptvault_prefect.runtime.scale import choose_runner

    address = "tcp://10.0.0.5:8786"
    choice = choose_runner(
        ScaleConfig(dask_address=address), address_flag=None, workers_flag=None, api_url="http://x/api"
    )
    runner = task_runner_for(choice)
    bound = {opts["name"]: flow for flow, opts in served_flows("/etc/c.toml", runner)}
    assert isinstance(bound["ingest"].task_runner, CkptvaultDaskTaskRunner)
    assert bound["ingest"].task_runner.address == address
    # the others, and ingest without [scale], keep their own runner
    plain = {opts["name"]: flow for flow, opts in served_flows("/etc/c.toml")}
    assert type(plain["ingest"].task_runner).__name__ == "ThreadPoolTaskRunner"
    others = ("tier", "replicate", "scrub", "drill", "watch", "restore")
    assert all(bound[n].task_runner is plain[n].task_runner for n in others)


def test_serve_with_an_unreachable_scheduler_is_exit_2_naming_it(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path
) -> None:
    address = f"tcp://127.0.0.1:{_closed_port()}"
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket_factory(seaweedfs), [],
                       extra=f'[scale]\ndask_address = "{address}"\nconnect_timeout_seconds = 1\n')  # fmt: skip
    env = local_prefect.telemetry_off_env(**seaweedfs.env(), PREFECT_API_URL=f"http://127.0.0.1:{_closed_port()}/api")
    proc = subprocess.run([CKPTVAULT, "--config", str(cfg), "serve"], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"[scale] dask_address: no Dask scheduler answered at {address} within 1 s" in proc.stderr
    assert "infra/local/dask.sh up" in proc.stderr and "Traceback" not in proc.stderr


def test_a_served_ingest_run_uploads_on_the_clusters_workers(
    prefect_server: local_prefect.PrefectServer,  # noqa: F811 - the fixture
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, dask_cluster_2: DaskCluster,
) -> None:  # fmt: skip
    c = dask_cluster_2
    dirs = _probed(c)
    bucket = bucket_factory(seaweedfs)
    cfg, hot = _one_checkpoint(tmp_path, seaweedfs, bucket, c.address)
    log = tmp_path / "serve.log"
    env = prefect_server.cli_env(**seaweedfs.env(), PREFECT_HOME=str(tmp_path / "home"))
    with open(log, "w") as out:
        proc = subprocess.Popen([CKPTVAULT, "--config", str(cfg), "serve"], env=env, cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # fmt: skip
    try:

        def ingest_deployment() -> dict[str, Any] | None:
            if proc.poll() is not None:
                raise AssertionError(f"ckptvault serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            ds = {d["name"]: d for d in prefect_server.deployments()}
            return ds.get("ingest") if len(ds) == 7 else None

        deployment = wait_for("ckptvault serve registers seven deployments", ingest_deployment, 120)
        t0 = time.monotonic()
        _, state = prefect_server.run_deployment(deployment["id"], 300)
        assert state["type"] == "COMPLETED", f"{state}\n{log.read_text()[-3000:]}"
        print(f"\nserve on Dask: the ingest run completed in {time.monotonic() - t0:.1f} s")
    finally:
        _stop_group(proc, 60)
    _assert_uploaded_on(c, dirs, seaweedfs, bucket, hot)  # none in the serve process


def test_the_configured_runner_names_an_unreachable_scheduler_once_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from ckptvault_prefect.runtime.configured import ConfiguredTaskRunner
    from ckptvault_prefect.runtime.scale import SchedulerUnreachable

    address = f"tcp://127.0.0.1:{_closed_port()}"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nbucket = "bkt"\n[scale]\ndask_address = "{address}"\nconnect_timeout_seconds = 1\n')
    monkeypatch.setenv("CKPTVAULT_CONFIG", str(cfg))  # no flow run here: the flow's fallback, as config_path=None
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:1/api"}), ConfiguredTaskRunner().duplicate() as r:
        with pytest.raises(SchedulerUnreachable, match=f"no Dask scheduler answered at {address} within 1 s") as first:
            r.resolved()
        t0 = time.monotonic()
        with pytest.raises(SchedulerUnreachable) as again:
            r.resolved()
        assert again.value is first.value and time.monotonic() - t0 < 0.5  # not a second handshake


REGISTER = """
import sys
from prefect.types.entrypoint import EntrypointType
from ckptvault_prefect.flows.configured import ingest
d = ingest.to_deployment(
    name="scaled", entrypoint_type=EntrypointType.MODULE_PATH, parameters={"config_path": sys.argv[1]}
)
d.entrypoint = "ckptvault_prefect.flows.configured.ingest"  # as prefect.yaml names it; the flow's own fn is ingest.py's
print(d.apply())
"""


@pytest.mark.parametrize("scale", [True, False], ids=["scale", "no-scale"])
def test_a_worker_started_run_of_the_configured_entrypoint_follows_scale(
    prefect_server: local_prefect.PrefectServer,  # noqa: F811 - the fixture
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, dask_cluster_2: DaskCluster, scale: bool,
) -> None:  # fmt: skip
    """The run is started as a process worker starts it: `python -m prefect.engine` with
    PREFECT__FLOW_RUN_ID, importing the flow from the deployment's entrypoint. With `[scale]` its
    uploads run on the cluster's workers; without, in the run's own 2 threads (none on the cluster)."""
    c = dask_cluster_2
    dirs = _probed(c)
    bucket = bucket_factory(seaweedfs)
    cfg, hot = _one_checkpoint(tmp_path, seaweedfs, bucket, c.address if scale else None)
    env = prefect_server.cli_env(**seaweedfs.env(), PREFECT_HOME=str(tmp_path / "home"))
    reg = subprocess.run([sys.executable, "-c", REGISTER, str(cfg)], env=env, capture_output=True, text=True,
                         timeout=120, check=False, cwd=tmp_path)  # fmt: skip
    assert reg.returncode == 0, reg.stderr[-3000:]
    deployment_id = reg.stdout.strip().splitlines()[-1]
    run = prefect_server.post(f"/deployments/{deployment_id}/create_flow_run", {})
    t0 = time.monotonic()
    engine = subprocess.run([sys.executable, "-m", "prefect.engine"], env={**env, "PREFECT__FLOW_RUN_ID": run["id"]},
                            capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)  # fmt: skip
    state = prefect_server.flow_run(run["id"])["state"]
    assert state["type"] == "COMPLETED", f"{state}\n{engine.stdout[-2000:]}\n{engine.stderr[-3000:]}"
    print(f"\nworker-style run (scale={scale}): completed in {time.monotonic() - t0:.1f} s")
    if scale:
        _assert_uploaded_on(c, dirs, seaweedfs, bucket, hot)
        return
    # without [scale]: every file uploaded by the flow run's own plain threads, no task run per file (issue
    # [W]: docs/performance.md), and none of them on the cluster
    prefix = checkpoint_prefix("t", "r", 10)
    listed = seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    stored = {o["Key"][len(prefix) :] for o in listed}
    assert MANIFEST_NAME in stored
    assert {p.relative_to(hot / "checkpoint-10").as_posix() for p in _files(hot)} <= stored

    def committed() -> list[dict[str, Any]]:  # task runs reach the API through events: a moment after the run
        return [r for r in prefect_server.task_runs(run["id"])
                if r["task_key"].startswith("commit_manifest") and r["state_type"] == "COMPLETED"]  # fmt: skip

    wait_for("the commit's completed task run of this flow run", committed, 60)
    assert not [r for r in prefect_server.task_runs(run["id"]) if r["task_key"].startswith("upload_one_task")]
    assert _uploads_on_cluster(dirs) == []


def _probed(c: DaskCluster) -> list[Path]:
    """The cluster's node directories, its workers recording where each task runs, nothing recorded yet."""
    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    dask_probe.clear(dirs)
    return dirs


def _one_checkpoint(tmp_path: Path, seaweedfs: Any, bucket: str, address: str | None) -> tuple[Path, Path]:
    """A config of one hf checkpoint (gates off), with `[scale] dask_address` when an address is given."""
    hot = tmp_path / "hot"
    write_checkpoint(hot, "hf", 10, 12 * MiB, shards=2, seed=10)
    scale = f'[scale]\ndask_address = "{address}"\n' if address else ""
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", hot, "hf")],
                       extra="[validation]\nenabled = false\n" + scale)  # fmt: skip
    return cfg, hot


def _files(hot: Path) -> list[Path]:
    return [p for p in (hot / "checkpoint-10").rglob("*") if p.is_file()]


def _uploads_on_cluster(dirs: list[Path]) -> list[dict[str, Any]]:
    return [r for r in dask_probe.records(dirs) if r["key"].startswith("upload_one_task") and r["event"] == "memory"]


def _assert_uploaded_on(c: DaskCluster, dirs: list[Path], seaweedfs: Any, bucket: str, hot: Path) -> None:
    """The checkpoint is committed, and every file's upload ran on a worker of the cluster, both working."""
    seaweedfs.client().head_object(Bucket=bucket, Key=checkpoint_prefix("t", "r", 10) + MANIFEST_NAME)
    done = _uploads_on_cluster(dirs)
    assert len(done) == len(_files(hot))
    assert {(r["node"], r["pid"]) for r in done} == set(c.worker_pids().items())
