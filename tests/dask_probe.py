"""Where each task ran on a Dask cluster, recorded by the workers themselves: a worker plugin that
appends one JSON line per finished or started task, with when, to tasks.jsonl in the worker's node directory
(CKPTVAULT_NODE_DIR, set by infra/local/dask.sh). Sent to the workers by value (cloudpickle), since
they do not have the tests package on their path; so is everything else here a test runs on a worker."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
from distributed import Client, WorkerPlugin

# this module's functions and classes travel by value: the workers cannot import `tests`
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PLUGIN_NAME = "ckptvault-test-probe"
LOG_NAME = "tasks.jsonl"


class WhereTasksRan(WorkerPlugin):
    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.name = str(worker.name)
        self.address = str(worker.address)
        self.log = Path(os.environ["CKPTVAULT_NODE_DIR"]) / LOG_NAME

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "executing" or start == "executing":  # started, and how it ended (memory, error, ...)
            line = {"key": str(key), "event": finish, "node": self.name, "address": self.address, "pid": os.getpid(),
                    "t": time.time(), **self._what(key)}  # fmt: skip
            with self.log.open("a") as f:
                f.write(json.dumps(line) + "\n")

    def _what(self, key: Any) -> dict[str, Any]:
        """Which file an upload task sends or a download fetches (`rel`; `download`: the object's key;
        `offset`: where a range of a split file starts), which node a listing task lists (`lists`): read from
        the Prefect task run's parameters, which prefect-dask passes as the Dask task's `parameters`."""
        ts = self.worker.state.tasks.get(key)
        kwargs = getattr(getattr(ts, "run_spec", None), "kwargs", None) or {}
        params = kwargs.get("parameters")
        if not isinstance(params, dict):
            return {}
        out: dict[str, Any] = {}
        job = params.get("job")
        if job is not None and hasattr(job, "file"):
            out["rel"] = job.file.rel
            out["path"] = str(job.file.path)
        plan = params.get("plan")
        # a restore's download (ckptvault.restore.plan.ObjectPlan); the steps that make and verify a split
        # file take the plan too, but no store
        if plan is not None and hasattr(plan, "key") and "store" in params:
            out["rel"] = plan.path
            out["download"] = plan.key
            if isinstance(params.get("offset"), int):  # one range of a split file
                out["offset"] = params["offset"]
        if isinstance(params.get("first"), int):  # a range of a split upload: its first part
            out["first"] = params["first"]
        if isinstance(params.get("node"), int):
            out["lists"] = params["node"]
        return out


def install(address: str) -> None:
    """Register the probe on every worker of the cluster (and on any that joins later)."""
    with Client(address, timeout=10, set_as_default=False) as c:
        c.register_plugin(WhereTasksRan(), name=PLUGIN_NAME)


def identity(dask_worker: Any) -> dict[str, Any]:
    """What a worker is (for client.run): its name, node environment, directory, resources, pid."""
    return {
        "name": dask_worker.name,
        "node": os.environ.get("CKPTVAULT_NODE"),
        "node_dir": os.environ.get("CKPTVAULT_NODE_DIR"),
        "local_directory": dask_worker.local_directory,
        "resources": dict(dask_worker.state.total_resources),
        "pid": os.getpid(),
    }


def records(node_dirs: list[Path]) -> list[dict[str, Any]]:
    out = []
    for d in node_dirs:
        log = d / LOG_NAME
        if log.exists():
            for line in log.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:  # the line a worker is still writing (read while the test runs)
                    continue
    return out


def clear(node_dirs: list[Path]) -> None:
    for d in node_dirs:
        (d / LOG_NAME).unlink(missing_ok=True)


async def dask_setup(worker: Any) -> None:
    """As a preload (DASK_DISTRIBUTED__WORKER__PRELOAD='["tests.dask_probe"]'): the probe on the workers
    of a cluster the test does not start itself (ingest --dask-workers' LocalCluster, whose spawned
    worker processes have the test's sys.path)."""
    await worker.plugin_add(plugin=WhereTasksRan(), name=PLUGIN_NAME)
