"""How the library's multi-step protocols (the ingest pass, the node-local restore) have their steps run.

A protocol decides what to call, in which order, and what to undo when a step fails; how a call runs
is not its business. It names the library function and the arguments, and its Submitter runs them:
in the flows each call is the Prefect task that wraps that function (recorded, placed on a node's
worker: ckptvault_prefect/runtime/submitter.py) except the transfer's, which runs on `Threads` unless
on a Dask cluster; in the command line without a Prefect API and in the unit tests, plain calls. No
submitter retries a call: the store its calls are given retries transient errors under the port, the
same in each (ckptvault/store/retrying.py). So the order and the rollback are library code a unit test
reaches on the in-memory store, and the flow only wires.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from functools import partial
from typing import Any, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Pending(Protocol[R_co]):
    """A submitted call (a Prefect future has this shape): its result, or with `raise_on_failure`
    False the exception it raised."""

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any: ...


class Submitter(Protocol):
    @property
    def inline(self) -> bool:
        """Whether `map` returns only once every call it was given has finished (plain calls in the
        unit tests): nothing is then in flight for later work to overlap with."""
        ...

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn(*args, **kwargs)` as one step, awaited."""
        ...

    def map(self, calls: Sequence[partial[R]], node: str | None = None) -> list[Pending[R]]:
        """Every call (each one function with its arguments bound) started, none awaited. `node`: each
        runs where that node's local disk is (its Dask worker)."""
        ...

    def node_workers(self) -> list[dict[str, float]] | None:
        """The resources each worker advertises (node-0=1 ...), or None when the calls do not run on
        workers that can be pinned to a node."""
        ...


def settle(pending: Sequence[Pending[Any]]) -> list[str]:
    """Wait for every call, then name every failure: a pass reports all problems, not the first, and
    nothing may be cleaned up while a sibling call is still writing."""
    outs = [p.result(raise_on_failure=False) for p in pending]
    return [str(out) for out in outs if isinstance(out, BaseException)]


def first_error_class(pending: Sequence[Pending[Any]]) -> str:
    """The type name of the first failed call's exception ("" when none failed): a failure's error class."""
    outs = (p.result(raise_on_failure=False) for p in pending)
    return next((type(out).__name__ for out in outs if isinstance(out, BaseException)), "")


class _Running:
    """One call of a `Threads.map`, running or queued: `result` waits for it. Ctrl-C while waiting
    stops the whole restore's pool (`Threads.stop`) before it is raised."""

    def __init__(self, future: Future[Any], owner: Threads) -> None:
        self._future, self._owner = future, owner

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        try:
            error: BaseException | None = self._future.exception(timeout)
        except CancelledError as e:  # a queued call stopped by Ctrl-C: it never ran
            error = e
        except TimeoutError:
            raise
        except BaseException:  # Ctrl-C in the waiting thread
            self._owner.stop()
            raise
        if error is None:
            return self._future.result()
        if raise_on_failure:
            raise error
        return error


class Threads:
    """A Submitter without Prefect, for the command line's direct mode and the transfer of the restore
    and ingest flows on a thread pool task runner: each call a plain call (its store retries, as it
    does under a task). A map's calls go to one pool of `workers` threads shared by every map of this
    submitter and are not waited for (not `inline`): a big file's ranges and the whole-file downloads
    submitted after them run at once, as they do on a task runner. Use it as a context manager (or call
    `close`): no thread outlives it."""

    def __init__(self, workers: int = 4) -> None:
        self._workers = max(1, workers)
        self._pool: ThreadPoolExecutor | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._name = f"ckptvault-threads-{id(self):x}"

    @property
    def inline(self) -> bool:
        return False

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return fn(*args, **kwargs)

    def map(self, calls: Sequence[partial[R]], node: str | None = None) -> list[Pending[R]]:
        if node is not None:
            raise ValueError("plain threads cannot run a call on a node's worker (--node-local needs a cluster)")
        if not calls:
            return []
        with self._lock:
            if self._stopped:
                # after Ctrl-C nothing new starts, whatever a cleanup path asks for
                raise KeyboardInterrupt("the restore was interrupted: no new call is started")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._name)
            pool = self._pool
        futures: list[Future[Any]] = []
        try:
            for c in calls:
                futures.append(pool.submit(self, c.func, *c.args, **c.keywords))
        except BaseException:  # Ctrl-C while submitting
            self.stop()
            raise
        return [_Running(f, self) for f in futures]

    def stop(self) -> None:
        """After Ctrl-C: every queued call cancelled, no new one started, and the calls already running
        waited for, so that the staging directory the caller then removes has no writer left (a second
        Ctrl-C ends the wait). Nothing is renamed into place: that is the caller's step after every
        result, which is never reached."""
        with self._lock:
            self._stopped = True
            pool = self._pool
        self._end(pool)

    def close(self) -> None:
        """Every call still queued cancelled, every running one waited for, the threads gone."""
        with self._lock:
            pool, self._pool = self._pool, None
        self._end(pool)

    def _end(self, pool: ThreadPoolExecutor | None) -> None:
        if pool is None:
            return
        pool.shutdown(wait=True, cancel_futures=True)
        # and a thread the pool started but had not yet counted (Ctrl-C inside its start): joined too
        for t in threading.enumerate():
            if t.name.startswith(self._name) and t is not threading.current_thread():
                t.join()

    def node_workers(self) -> list[dict[str, float]] | None:
        return None
