"""A task that runs either as a Prefect task or, in direct mode, as a plain call.

Why direct mode: with no Prefect API configured, Prefect starts a temporary API server before the
first flow or task runs (10-30 s), and tears it down noisily at exit. The command line's one-shot
commands then spend far longer waiting for Prefect than working. In direct mode the flow's own
function runs as written (the same wiring, the same library calls, the same catalog events and
alerts); each step is called in-process, and mapped steps fan out over a thread pool. Retries are the
store's in either mode (ckptvault/store/retrying.py): a step's store calls retry transient errors under
the port, so neither a Prefect task nor a direct call retries the step around them. Only the
Prefect-side records (flow and task runs, artifacts) are absent: without a server there is nowhere to
keep them.

Nothing in a flow changes: a flow calls `step(...)`, `step.map(...)` or `step.submit(...)`, and waits
with `settle`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from prefect import Task

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

_direct: ContextVar[int] = ContextVar("ckptvault_direct_workers", default=0)


class StepFuture(Protocol[R_co]):
    """What a mapped step returns per item, in either mode (PrefectFuture has this shape)."""

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any: ...


@contextmanager
def direct_mode(max_workers: int = 4) -> Iterator[None]:
    """Inside: every Step runs as a plain call; mapped steps share `max_workers` threads per map."""
    token = _direct.set(max(1, max_workers))
    try:
        yield
    finally:
        _direct.reset(token)


def in_direct_mode() -> bool:
    return _direct.get() > 0


class _Done:
    """A finished direct call, shaped like a PrefectFuture."""

    def __init__(self, future: Future[Any]) -> None:
        self._future = future

    def wait(self, timeout: float | None = None) -> None:
        self._future.exception(timeout)

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        error = self._future.exception(timeout)
        if error is None:
            return self._future.result()
        if raise_on_failure:
            raise error
        return error


def _annotation(value: Any) -> bool:
    """Prefect's `unmapped(x)` (or another annotation). Without Prefect imported there can be none, and
    direct mode does not import it (ckptvault_cli/running.py: ~1-3 s of a command's start)."""
    annotations = sys.modules.get("prefect.utilities.annotations")
    return annotations is not None and isinstance(value, annotations.BaseAnnotation)


def _unwrap(value: Any) -> Any:
    return value.unwrap() if _annotation(value) else value


class Step(Generic[P, R]):
    """A Prefect task and how to run it directly.

    The Prefect task is made from `fn` by `make_task` on its first use as one: in direct mode no task
    is ever made, so the modules that define steps import no Prefect (tests/unit/test_cli_imports.py)."""

    def __init__(
        self,
        fn: Callable[P, R],
        make_task: Callable[[Callable[P, R]], Task[P, R]],
        *,
        record_only: bool = False,
    ) -> None:
        self.fn = fn
        self._make_task = make_task
        self._task: Task[P, R] | None = None
        self._task_lock = threading.Lock()
        # A step that only records into Prefect (an artifact): in direct mode there is nowhere to record.
        self.record_only = record_only

    def __getstate__(self) -> dict[str, Any]:
        # a step travels by value to Dask workers inside the task runner's wrapper (cloudpickle): its
        # lock does not pickle, and a worker makes its own
        state = dict(self.__dict__)
        del state["_task_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._task_lock = threading.Lock()

    @property
    def task(self) -> Task[P, R]:
        """The Prefect task (made once, on first use)."""
        with self._task_lock:
            if self._task is None:
                self._task = self._make_task(self.fn)
            return self._task

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if not in_direct_mode():
            return self.task(*args, **kwargs)
        return self._direct(*args, **kwargs)

    def _direct(self, *args: Any, **kwargs: Any) -> R:
        if self.record_only:
            return None  # type: ignore[return-value]
        return self.fn(*args, **kwargs)

    def submit(self, *args: P.args, **kwargs: P.kwargs) -> StepFuture[R]:
        """The step started beside what the flow does next (on the flow's task runner), for a step nothing
        after it waits on, e.g. an artifact published while the transfer runs. Direct mode: called now."""
        if not in_direct_mode():
            return self.task.submit(*args, **kwargs)
        done: Future[R] = Future()
        try:
            done.set_result(self._direct(*args, **kwargs))
        except Exception as e:
            done.set_exception(e)
        return _Done(done)

    def map(self, *args: Any, **kwargs: Any) -> list[StepFuture[R]]:
        if not in_direct_mode():
            return list(self.task.map(*args, **kwargs))
        calls = _expand(args, kwargs)
        workers = _direct.get()
        pool = ThreadPoolExecutor(max_workers=min(workers, max(1, len(calls))))
        try:
            # each thread runs in a copy of this context, so nested steps stay in direct mode
            futures = [pool.submit(copy_context().run, self._direct, *a, **kw) for a, kw in calls]
            out: list[StepFuture[R]] = [_Done(f) for f in futures]
            wait_all(out)
        except BaseException:
            # Ctrl-C: start nothing new and do not wait for what is in flight (an upload left half-way is
            # resumed by the next run; nothing is committed before every file is verified)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return out


def _expand(args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[list[Any], dict[str, Any]]]:
    """Prefect's map semantics: iterables are zipped, `unmapped(x)` is passed whole to every call."""
    mapped = [i for i, a in enumerate(args) if not _annotation(a)]
    mapped_kw = [k for k, v in kwargs.items() if not _annotation(v)]
    lengths = {len(list(args[i])) for i in mapped} | {len(list(kwargs[k])) for k in mapped_kw}
    if len(lengths) > 1:
        raise ValueError(f"mapped arguments differ in length: {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    columns = {i: list(args[i]) for i in mapped}
    kw_columns = {k: list(kwargs[k]) for k in mapped_kw}
    calls = []
    for j in range(n):
        a = [columns[i][j] if i in columns else _unwrap(v) for i, v in enumerate(args)]
        kw = {k: (kw_columns[k][j] if k in kw_columns else _unwrap(v)) for k, v in kwargs.items()}
        calls.append((a, kw))
    return calls


def wait_all(futures: Iterable[StepFuture[Any]]) -> None:
    """Wait for every future of either kind."""
    items = list(futures)
    prefect_futures = [f for f in items if not isinstance(f, _Done)]
    if prefect_futures:  # direct mode has none, and imports no Prefect for them
        from prefect.futures import wait

        wait(prefect_futures)  # type: ignore[arg-type]
    for f in items:
        if isinstance(f, _Done):
            f.wait()
