"""`ckptvault serve`'s flow runs forked from a warm process instead of started cold.

Prefect's runner starts each served flow run in a new interpreter (multiprocessing's "spawn"), which
imports Prefect's engine and ckptvault's flows again: ~2 s of CPU, and the most of a hook-triggered
ingest's start (issue [T]: created -> Running 2.0 s of a 4.3 s RPO on a quiet box). On a training node
or a small box the archive shares, that import is also what the training's neighbours pay for: a
memory-heavy burst per save (docs/hooks.md, "Step time").

With the warm start, the serving process asks multiprocessing for its "forkserver" instead: one
single-threaded process started once, which imports what a flow run imports anyway (`FLOW_RUN`, the
preload list's: ckptvault_prefect/runtime/preload.py) once and forks a child per flow run.
The child gets the same payload Prefect would have given a spawned one (the cloudpickled flow run,
its environment, the control channel) and runs it the same way; only its imports are already done.
Nothing else changes: one process per flow run, its own exit, Prefect's cancellation and crash
handling by pid.

The seam is one module global: prefect.flow_engine's `multiprocessing`, whose `get_context("spawn")`
the runner's direct starter calls (Runner.add_flow's path; prefect 3.9), reached through
ckptvault_prefect/runtime/prefect_private.py like every name Prefect does not offer as API. Where this
Prefect has no such seam, `install` says so and changes nothing: flow runs start cold, as before.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.context
import types
from typing import Any

from ckptvault_prefect.runtime import prefect_private
from ckptvault_prefect.runtime.preload import FLOW_RUN

log = logging.getLogger(__name__)


class _Multiprocessing(types.ModuleType):
    """multiprocessing, as prefect.flow_engine sees it: "spawn" answered with the warm context."""

    def __init__(self, warm: multiprocessing.context.BaseContext) -> None:
        super().__init__("multiprocessing")
        self._warm = warm

    def get_context(self, method: str | None = None) -> Any:
        return self._warm if method == "spawn" else multiprocessing.get_context(method)

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)


def install(preload: tuple[str, ...] = FLOW_RUN) -> bool:
    """Fork served flow runs from a warm process (started now, its imports done before the first run).
    False, changing nothing, when this Prefect or this platform cannot."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        log.info("flow runs start cold: this platform has no forkserver")
        return False
    engine = prefect_private.flow_engine()
    if engine is None:
        log.info("flow runs start cold: this Prefect starts them in a way ckptvault does not know")
        return False
    warm = multiprocessing.get_context("forkserver")
    warm.set_forkserver_preload(list(preload))
    from multiprocessing import forkserver

    forkserver.ensure_running()  # its imports now, while serve registers, not in the first run
    prefect_private.set_flow_engine_multiprocessing(engine, _Multiprocessing(warm))
    return True


def installed() -> bool:
    return isinstance(prefect_private.flow_engine_multiprocessing(), _Multiprocessing)
