"""A step (ckptvault_prefect/tasks/step.py) makes its Prefect task only when it runs as one: direct mode,
the command line without a Prefect API, imports no Prefect for it (issue [W])."""

from __future__ import annotations

from typing import Any

import pytest

from ckptvault.store import POLICY, TransientStoreError
from ckptvault_prefect.tasks.retry import io_task
from ckptvault_prefect.tasks.step import Step, direct_mode


def test_a_step_in_direct_mode_never_makes_its_prefect_task_and_leaves_retries_to_the_store() -> None:
    made: list[str] = []
    calls: list[int] = []

    def make(fn: Any) -> Any:
        made.append(fn.__name__)
        raise AssertionError("direct mode made a Prefect task")

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 2:
            raise TransientStoreError("503, after the store's retries")
        return x * 2

    step = Step(flaky, make)
    with direct_mode(2):
        with pytest.raises(TransientStoreError):
            step(21)  # its store retried already (ckptvault/store/retrying.py): the step is not run again
        assert step(21) == 42
        assert [f.result() for f in step.map([1, 2])] == [2, 4]
        assert step.submit(5).result() == 10  # called now, its result kept as a mapped call's is
    assert calls == [21, 21, 1, 2, 5] and made == []


def test_a_submitted_step_that_fails_in_direct_mode_keeps_its_error_for_whoever_waits() -> None:
    def broken() -> None:
        raise ValueError("an artifact the API refused")

    def make(fn: Any) -> Any:
        raise AssertionError("direct mode made a Prefect task")

    with direct_mode(1):
        future = Step(broken, make).submit()
    assert isinstance(future.result(raise_on_failure=False), ValueError)
    with pytest.raises(ValueError, match="refused"):
        future.result()


def test_the_task_is_made_once_on_first_use_without_task_retries() -> None:
    from prefect.tasks import exponential_backoff

    # the store's policy is the backoff Prefect's task retries had
    assert exponential_backoff(backoff_factor=2)(POLICY.retries) == list(POLICY.delays)

    @io_task("double")
    def double(x: int) -> int:
        return 2 * x

    task = double.task
    assert task is double.task and task.name == "double" and task.retries == 0  # the store retries
    assert task.fn is double.fn


def test_a_step_pickles_by_value_as_dask_sends_it_and_keeps_its_lock_working() -> None:
    import threading

    import cloudpickle

    from ckptvault_prefect.tasks.retry import io_task

    def fetch(x: int) -> int:
        return x + 1

    step = io_task("fetch")(fetch)
    back = cloudpickle.loads(cloudpickle.dumps(step))  # the task runner's wrapper carries the step by value
    assert back.fn(1) == 2 and back.record_only == step.record_only
    assert isinstance(back._task_lock, type(threading.Lock()))
