"""The one retry policy of every I/O task: back off and retry transient store errors only.

A checksum mismatch, a missing bucket or a precondition failure is an answer, not a glitch:
retrying it wastes time and hides the problem, so those fail at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ckptvault.store import TransientStoreError
from ckptvault.transfer import submitter
from ckptvault.transfer.submitter import RETRIES as RETRIES
from ckptvault.transfer.submitter import RETRY_JITTER as RETRY_JITTER
from ckptvault_prefect.tasks.step import Step

if TYPE_CHECKING:
    from prefect import Task

# The one retry policy of store I/O, the library's (ckptvault/transfer/submitter.py, which the command line's plain
# threads follow): the delays are what prefect.tasks.exponential_backoff(backoff_factor=2) gives for
# RETRIES retries, spelled out because this module is imported in direct mode, which imports no Prefect.
RETRY_DELAYS: list[float] = list(submitter.RETRY_DELAYS)

P = ParamSpec("P")
R = TypeVar("R")


def only_transient(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except TransientStoreError:
        return True
    except Exception:
        return False
    return False


def io_task(name: str, task_run_name: str | None = None) -> Callable[[Callable[P, R]], Step[P, R]]:
    """A task that talks to the store: retried with backoff on transient errors only, never cached
    (our idempotency lives in the store: a manifest present means done)."""

    def make(fn: Callable[P, R]) -> Task[P, R]:
        from prefect import task
        from prefect.cache_policies import NO_CACHE

        return task(
            name=name,
            task_run_name=task_run_name,
            retries=RETRIES,
            retry_delay_seconds=RETRY_DELAYS,
            retry_jitter_factor=RETRY_JITTER,
            retry_condition_fn=only_transient,
            cache_policy=NO_CACHE,
        )(fn)

    def wrap(fn: Callable[P, R]) -> Step[P, R]:
        return Step(fn, make, retries=RETRIES, delays=RETRY_DELAYS, jitter=RETRY_JITTER)

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
