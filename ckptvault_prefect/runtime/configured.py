"""The task runner that follows the run's config `[scale]`: what makes `ingest` scale out from a
work-pool deployment (its entrypoint `ckptvault_prefect.flows.configured.ingest`, the flow with this runner).

A worker starts a run as `python -m prefect.engine`, which imports the flow from its entrypoint and
enters its task runner before the run's `config_path` parameter is visible (docs/OPERATIONS.md, "Which
entry points honour `[scale]`"). So the runner here defers its choice to the first task the flow
submits: by then the FlowRunContext holds the parameters, and the same decision as the command line
(`scale.choose_runner`, `runners.task_runner_for`) picks the runner, which is entered then and used for
every task of the run. No `[scale]`: the flow's own 2 threads, as `ckptvault_prefect.flows.ingest.ingest`.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner


class ConfiguredTaskRunner(TaskRunner[Any]):
    """Delegates to the runner the run's `[scale]` names, chosen at the first submit."""

    def __init__(self, default: TaskRunner[Any] | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._default: TaskRunner[Any] = default or ThreadPoolTaskRunner(max_workers=2)
        self._chosen: TaskRunner[Any] | None = None
        self._stack = ExitStack()
        self._failed: Exception | None = None
        self._lock = threading.Lock()  # tasks may be submitted from more than one thread

    def duplicate(self) -> ConfiguredTaskRunner:
        return type(self)(self._default.duplicate())

    def __getstate__(self) -> dict[str, Any]:
        # Each task sent to a Dask worker carries the flow, runner included: it travels unchosen (a lock
        # and an entered runner do not pickle), and a worker never submits through it.
        return {"default": self._default}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["default"])  # type: ignore[misc]

    def resolved(self) -> TaskRunner[Any]:
        """The runner this run uses (chosen and entered now if no task was submitted yet)."""
        with self._lock:
            if self._failed is not None:  # one handshake per run: each checkpoint gets the same error
                raise self._failed
            if self._chosen is None:
                try:
                    self._chosen = self._stack.enter_context(self._choose())
                except Exception as e:
                    self._failed = e
                    raise
            return self._chosen

    def _choose(self) -> TaskRunner[Any]:
        """The runner the run's [scale] names: the command line's decision (scale.choose_runner)."""
        from prefect.context import FlowRunContext
        from prefect.settings import PREFECT_API_URL

        from ckptvault.config import load_config
        from ckptvault_prefect.runtime.scale import check_scheduler, choose_runner

        ctx = FlowRunContext.get()
        params = (ctx.parameters if ctx is not None else None) or {}
        cfg = load_config(params.get("config_path"))  # as the flow reads it: None is $CKPTVAULT_CONFIG
        choice = choose_runner(cfg.scale, address_flag=None, workers_flag=None, api_url=PREFECT_API_URL.value())
        runner: TaskRunner[Any] = self._default
        if choice.needs_prefect:
            if choice.kind == "cluster":
                check_scheduler(choice)  # one bounded handshake: a wrong address fails the run now
            from ckptvault_prefect.runtime.runners import task_runner_for

            chosen = task_runner_for(choice)
            assert chosen is not None  # needs_prefect: a cluster or local workers, never the threads
            runner = chosen
        return runner

    def submit(self, task: Any, parameters: dict[str, Any], wait_for: Any = None, dependencies: Any = None) -> Any:
        return self.resolved().submit(task, parameters, wait_for, dependencies)

    def map(self, task: Any, parameters: dict[str, Any], wait_for: Any = None) -> Any:
        return self.resolved().map(task, parameters, wait_for)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._stack.__exit__(exc_type, exc_value, traceback)
        self._chosen = self._failed = None
        super().__exit__(exc_type, exc_value, traceback)
