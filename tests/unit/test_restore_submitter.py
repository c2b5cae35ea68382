"""The restore flow's submitter (ckptvault_prefect/runtime/restore.py): a big file's ranges go to plain
threads of the flow run (no task run each) when no Dask cluster runs the flow's tasks; every other call,
and every range on a cluster, goes to its task as before."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from ckptvault.restore import fallback, ranged
from ckptvault_prefect.runtime import restore as runtime
from ckptvault_prefect.runtime.submitter import TaskSubmitter


class Seen:
    def __init__(self) -> None:
        self.maps: list[tuple[str, Any]] = []

    def map(self, calls: Any, node: str | None = None) -> list[Any]:
        self.maps.append((calls[0].func.__name__, node))
        return []


def test_ranges_go_to_threads_and_the_rest_to_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = Seen()
    monkeypatch.setattr(TaskSubmitter, "map", lambda self, calls, node=None: tasks.map(calls, node))
    submit = runtime.RestoreSubmitter()
    threads = Seen()
    submit._threads = threads  # type: ignore[assignment]
    for fn in (fallback.fetch_range_guarded, ranged.fetch_range):
        submit.map([partial(fn, None)])
    submit.map([partial(ranged.allocate, None)])
    submit.map([partial(fallback.fetch_range_guarded, None)], node="node-0")  # --node-local: on that node
    assert threads.maps == [("fetch_range_guarded", None), ("fetch_range", None)]
    assert tasks.maps == [("allocate", None), ("fetch_range_guarded", "node-0")]
    # on a Dask cluster (workers to pin to), a range is a task: it runs where the destination is seen
    monkeypatch.setattr(submit, "node_workers", lambda: [{"node-0": 1.0}])
    submit.map([partial(ranged.fetch_range, None)])
    assert tasks.maps[-1] == ("fetch_range", None) and len(threads.maps) == 2
