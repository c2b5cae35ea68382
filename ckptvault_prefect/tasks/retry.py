"""How the flows' steps are made into Prefect tasks: `io_task` for a step that talks to the store,
`local_task` for one that does local work or only records into Prefect.

Neither has Prefect task retries. A store call is retried under the store port, by the one policy of
store I/O (ckptvault/store/retrying.py), in whichever process it runs: a task retry around it would
make every call's attempts again, and a step that is not a store call has nothing transient to retry.
A checksum mismatch, a missing bucket or a precondition failure is an answer, not a glitch: it fails
the task at once, as it always did. Each retry shows as a warning in the task's process and in the
ledger's `ckptvault_store_retries_total` (docs/metrics.md), where Prefect's task retries were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from ckptvault_prefect.tasks.step import Step

if TYPE_CHECKING:
    from prefect import Task

P = ParamSpec("P")
R = TypeVar("R")


def io_task(name: str, task_run_name: str | None = None) -> Callable[[Callable[P, R]], Step[P, R]]:
    """A task that talks to the store: never cached (our idempotency lives in the store: a manifest
    present means done), and not retried as a task (its store calls are, under the port)."""

    def make(fn: Callable[P, R]) -> Task[P, R]:
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        return task(name=name, task_run_name=task_run_name, cache_policy=NO_CACHE)(fn)

    def wrap(fn: Callable[P, R]) -> Step[P, R]:
        return Step(fn, make)

    return wrap


def local_task(
    name: str, task_run_name: str | None = None, *, record_only: bool = False
) -> Callable[[Callable[P, R]], Step[P, R]]:
    """A task that does local work (or only records into Prefect: `record_only`), not retried."""

    def make(fn: Callable[P, R]) -> Task[P, R]:
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        return task(name=name, task_run_name=task_run_name, cache_policy=NO_CACHE)(fn)

    def wrap(fn: Callable[P, R]) -> Step[P, R]:
        return Step(fn, make, record_only=record_only)

    return wrap
