"""The library's Submitter (ckptvault/transfer/submitter.py) as the flows run it: each library call as the
Prefect task that wraps it, with that task's run, pinned to a node's Dask worker
when asked; in direct mode (ckptvault_prefect/tasks/step.py) the same steps as plain calls."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, ParamSpec, TypeVar

from ckptvault.transfer.submitter import Pending
from ckptvault_prefect.runtime.scale import pinned, worker_resources
from ckptvault_prefect.tasks.step import Step, in_direct_mode

P = ParamSpec("P")
R = TypeVar("R")


class TaskSubmitter:
    """`tasks`: the task of each library function a protocol calls (ckptvault_prefect/tasks/*: STEPS)."""

    def __init__(self, tasks: Mapping[Callable[..., Any], Step[..., Any]]) -> None:
        self._tasks = tasks

    @property
    def inline(self) -> bool:
        return in_direct_mode()  # direct mode's map waits for every call before it returns

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self._tasks[fn](*args, **kwargs)
        return result

    def map(self, calls: Sequence[partial[R]], node: str | None = None) -> list[Pending[R]]:
        if not calls:
            return []
        task = self._tasks[calls[0].func]
        assert all(c.func is calls[0].func for c in calls), "one map runs one function"
        # Task.map's form: a list per argument, one item per call
        args = [list(column) for column in zip(*(c.args for c in calls), strict=True)]
        kwargs = {k: [c.keywords[k] for c in calls] for k in calls[0].keywords}
        if node is None:
            return task.map(*args, **kwargs)
        with pinned(node):  # each call runs on the worker of the node whose disk it reads or writes
            return task.map(*args, **kwargs)

    def node_workers(self) -> list[dict[str, float]] | None:
        # direct mode runs no Dask (and asks Prefect's run context nothing: it imports no Prefect)
        return None if in_direct_mode() else worker_resources()
