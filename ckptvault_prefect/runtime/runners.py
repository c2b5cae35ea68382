"""Task runners for scaling one flow run beyond one process: prefect-dask on a Dask cluster.

The default runner of `ingest` is a thread pool in the flow's process. When one host's cores are not
enough for the per-file upload tasks, run the same flow with a Dask task runner:

    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.runtime.runners import dask_task_runner

    ingest.with_options(task_runner=dask_task_runner(4, processes=True))(config_path="ckptvault.toml")

Only the tasks a flow submits or maps (`upload_one_task.map(...)` in ingest) go to Dask; the rest of
the flow runs in the flow's own process.

Two things to know (docs in infra/k8s/README.md, "Scale-out"):
- `processes=True` starts one worker process per worker. Each worker process runs Prefect task runs
  itself and so must reach a real Prefect API: PREFECT_API_URL must be set (in the environment, a
  profile, or a temporary setting) when the flow starts. Without one, every worker process would start
  its own ephemeral API server and time out. We refuse that early with a clear error.
- Task arguments are pickled to reach worker processes. S3Store pickles as its configuration and
  rebuilds its boto3 client on the other side (ckptvault.store.s3_client.S3Connection.__getstate__). The
  terminal ProgressBar handed to every upload task holds a lock and a stream: importing this module
  registers a reducer that sends it as a silent bar of the same size (a worker process cannot draw
  on the flow's terminal; progress is in the Prefect UI as task states).

The Dask dashboard is off (no listener on :8787) and the workers' scratch space is a directory of
ours under the system temp dir (not the shared `dask-scratch-space`); each worker removes its own
sub-directory when it stops.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from prefect.settings import PREFECT_API_URL

from ckptvault.errors import CkptvaultError
from ckptvault_prefect.runtime.scale import RunnerChoice

try:
    from prefect_dask.task_runners import DaskTaskRunner
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("the Dask task runner needs prefect-dask: pip install 'ckptvault[dask]'") from e

SCRATCH_NAME = "ckptvault-dask"


def scratch_dir() -> str:
    """The workers' local directory: `<system temp>/ckptvault-dask` (created if missing)."""
    path = os.path.join(tempfile.gettempdir(), SCRATCH_NAME)
    os.makedirs(path, exist_ok=True)
    return path


class NoPrefectApiError(CkptvaultError, RuntimeError):
    """Dask worker processes need a running Prefect server to report their task runs to."""


class CkptvaultDaskTaskRunner(DaskTaskRunner):
    """DaskTaskRunner that, with worker processes, checks that a Prefect API is configured and hands
    its URL to the worker processes (a temporary setting in the parent is invisible to them)."""

    def __enter__(self) -> CkptvaultDaskTaskRunner:
        if self.cluster_kwargs.get("processes", True) and not self.address:
            url = PREFECT_API_URL.value()
            if not url:
                raise NoPrefectApiError(
                    "a Dask task runner with worker processes needs a running Prefect server: set "
                    "PREFECT_API_URL (e.g. `make up`, then PREFECT_API_URL=http://127.0.0.1:4200/api), "
                    "or use processes=False"
                )
            env = dict(self.cluster_kwargs.get("env") or {})
            env.setdefault("PREFECT_API_URL", str(url))
            self.cluster_kwargs["env"] = env
        super().__enter__()  # type: ignore[no-untyped-call]
        return self


def dask_task_runner(
    n_workers: int,
    processes: bool,
    *,
    threads_per_worker: int = 1,
    local_directory: str | None = None,
    **cluster_kwargs: Any,
) -> CkptvaultDaskTaskRunner:
    """A DaskTaskRunner on a new local Dask cluster (`distributed.LocalCluster`) of `n_workers`.

    processes: True for one OS process per worker (no shared GIL; needs a Prefect server,
    PREFECT_API_URL), False for worker threads inside the flow's process (no server needed; fine for
    I/O-bound uploads, but the workers share the flow process's GIL).
    threads_per_worker: tasks run at once per worker; each upload task has its own part thread pool
    ([store] max_concurrency), so 1 is the sensible default.
    Extra keyword arguments go to LocalCluster (e.g. memory_limit).
    """
    if n_workers < 1:
        raise ValueError(f"n_workers must be at least 1, got {n_workers}")
    kwargs: dict[str, Any] = {
        "n_workers": n_workers,
        "processes": processes,
        "threads_per_worker": threads_per_worker,
        # No dashboard, and the scheduler's small HTTP server (health, metrics) on a free loopback port
        # instead of :8787 (where it would otherwise go even with the dashboard off).
        "dashboard_address": None,
        "scheduler_kwargs": {"dashboard": False, "dashboard_address": "127.0.0.1:0"},
        "worker_dashboard_address": None,
        "local_directory": local_directory or scratch_dir(),
        **cluster_kwargs,
    }
    return CkptvaultDaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=kwargs)


def task_runner_for(choice: RunnerChoice) -> CkptvaultDaskTaskRunner | None:
    """The Dask task runner ckptvault_prefect.runtime.scale.choose_runner decided on; None: keep the flow's
    own runner."""
    if choice.kind == "local":
        return dask_task_runner(choice.workers, processes=choice.processes)
    if choice.kind == "cluster":
        # the handshake bound also for the runner's own connection (the CLI checked it just before)
        return CkptvaultDaskTaskRunner(address=choice.address, client_kwargs={"timeout": choice.connect_timeout})
    return None
