"""The ingest flow's submitter: a checkpoint's transfer on plain threads, every other step its task."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ParamSpec, TypeVar

from ckptvault.ingest.uploads import DATA_PATH
from ckptvault.transfer.submitter import Pending, Threads
from ckptvault_prefect.runtime.submitter import TaskSubmitter
from ckptvault_prefect.tasks.ingest import STEPS
from ckptvault_prefect.tasks.step import in_direct_mode

P = ParamSpec("P")
R = TypeVar("R")


class IngestSubmitter(TaskSubmitter):
    """In a flow run on a thread pool task runner, the calls of a checkpoint's transfer
    (`uploads.DATA_PATH`: each whole file, each range of a split file's parts, its begin, completion and
    abort) run on plain threads of the flow run, as many as the flow's task runner has, with the same
    retries (the store's) and the same CRC32C checks: a task run each cost the flow run's process CPU
    (creating it, reporting its states to the API) on the same cores as the transfer. Every other step
    (the plan, the gates, the commit, the catalog's record) stays its task run. On a Dask cluster every
    call stays a task (the workers run tasks, and a node-local file is sent by its node's worker); in
    direct mode every step is already a plain call. Maps are not waited for, as on a task runner: a
    backlog's checkpoints overlap. Use it as a context manager: its threads end with it."""

    def __init__(self, workers: int = 2) -> None:
        super().__init__(STEPS)
        self._threads = Threads(workers)
        self._plain: bool | None = None  # the task runner does not change during a flow run: asked once

    def __enter__(self) -> IngestSubmitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._threads.close()  # no upload thread outlives the pass

    def on_threads(self, fn: Callable[..., Any]) -> bool:
        """Whether a call of `fn` runs on the plain threads rather than as its task."""
        if fn not in DATA_PATH or in_direct_mode():
            return False
        if self._plain is None:
            self._plain = self.node_workers() is None
        return self._plain

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.on_threads(fn):
            return self._threads(fn, *args, **kwargs)
        return super().__call__(fn, *args, **kwargs)

    def map(self, calls: Sequence[partial[R]], node: str | None = None) -> list[Pending[R]]:
        if calls and node is None and self.on_threads(calls[0].func):
            return self._threads.map(calls)
        return super().map(calls, node)
