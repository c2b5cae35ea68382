"""The restore flow's submitter: the library's plain threads, as the command line's direct mode, unless
a Dask cluster runs the flow's tasks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ckptvault.transfer.submitter import Submitter, Threads
from ckptvault_prefect.runtime.scale import worker_resources
from ckptvault_prefect.runtime.submitter import TaskSubmitter
from ckptvault_prefect.tasks.restore import STEPS


@contextmanager
def restore_submitter(workers: int = 4) -> Iterator[Submitter]:
    """How the restore flow runs `complete` (ckptvault/restore/complete.py): on a thread pool task
    runner, every call (each file's download, a big file's ranges, allocate, seal, the fsyncs, the
    rename into place, the catalog's record, the alert, the ledger) a plain call on `workers` threads of
    the flow run, its store calls retried under the port as a task's are, exactly as the command line
    without a Prefect API runs it: a task run per file and per range cost the flow run's process CPU on
    the same cores as the transfer (bench/README.md, "Where a command's time goes"). On a Dask cluster
    each call stays its task: the workers run tasks, and a node's files are written by its own worker
    (--node-local). The threads end with the block."""
    if worker_resources() is not None:
        yield TaskSubmitter(STEPS)
        return
    with Threads(workers) as threads:
        yield threads
