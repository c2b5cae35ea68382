"""The restore flow's submitter: its task for every call, except the ranges of a big file."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ckptvault.restore import complete, fallback, ranged
from ckptvault.submitter import Pending, Threads
from ckptvault_prefect.runtime.submitter import TaskSubmitter
from ckptvault_prefect.tasks.restore import STEPS

# The ranges of a big file: many per file (a 1 GiB save is dozens), each a task run created and its states
# reported to the API from the same cores as the transfer (bench/README.md, "Restore with a Prefect API").
RANGES = frozenset({ranged.fetch_range, fallback.fetch_range_guarded})


class RestoreSubmitter(TaskSubmitter):
    """The flow's submitter for a restore: every call its task, except a big file's ranges on a thread
    pool task runner, fetched on plain threads of the flow run (the same retry policy, the same CRC32C
    checks, no task run each); the file's allocate and verify steps stay task runs. On a Dask cluster
    each range stays a task, to run on a worker that sees the destination."""

    def __init__(self, workers: int = 4) -> None:
        super().__init__(STEPS)
        self._threads = Threads(complete.IO_STEPS, workers)

    def map(self, calls: Sequence[partial[Any]], node: str | None = None) -> list[Pending[Any]]:
        if calls and node is None and calls[0].func in RANGES and self.node_workers() is None:
            return self._threads.map(calls)
        return super().map(calls, node)
