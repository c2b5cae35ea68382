"""How the library's multi-step protocols (the ingest pass, the node-local restore) have their steps run.

A protocol decides what to call, in which order, and what to undo when a step fails; how a call runs
is not its business. It names the library function and the arguments, and its Submitter runs them:
in the flows each call is the Prefect task that wraps that function (retried, recorded, placed on a
node's worker: ckptvault_prefect/runtime/submitter.py), in the unit tests a plain call. So the order
and the rollback are library code a unit test reaches on the in-memory store, and the flow only wires.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        """Whether `map` returns only once every call it was given has finished (plain calls, the
        command line's direct mode): nothing is then in flight for later work to overlap with."""
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
