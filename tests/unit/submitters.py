"""A Submitter (ckptvault/transfer/submitter.py) for unit tests: every call a plain call in the test's thread,
logged by function name and node, with failures and stand-ins injected where a test asks.

`inline=True` runs a mapped call when it is submitted, as the command line's direct mode does;
`inline=False` runs it when its result is first asked for, as a task runner with work queued would
have it still in flight: what a pass does before it waits is then visible in the log."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class Injected(Exception):
    """The failure a test asked for."""


@dataclass(frozen=True)
class Call:
    fn: Callable[..., Any]  # the library function asked for (a stand-in may have run instead)
    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    node: str | None


class _Later:
    def __init__(self, submitter: Plain, call: partial[Any], node: str | None) -> None:
        self._submitter, self._call, self._node = submitter, call, node
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._value = self._submitter.run(self._call.func, self._call.args, self._call.keywords, self._node)
        except Exception as e:
            self._error = e

    def result(self, timeout: float | None = None, raise_on_failure: bool = True) -> Any:
        self.run()
        if self._error is None:
            return self._value
        if raise_on_failure:
            raise self._error
        return self._error


class Plain:
    """`fail(call)` True: that call raises Injected instead of running. `instead`: a function name's
    stand-in, called with the same arguments. `workers`: what node_workers answers."""

    def __init__(
        self,
        *,
        inline: bool = True,
        fail: Callable[[Call], bool] = lambda call: False,
        instead: dict[str, Callable[..., Any]] | None = None,
        workers: list[dict[str, float]] | None = None,
    ) -> None:
        self._inline, self._fail, self._instead, self._workers = inline, fail, instead or {}, workers
        self.ran: list[Call] = []  # in the order they ran
        # ("submitted" for a mapped call handed out, "ran" for any call run), in the order it happened
        self.timeline: list[tuple[str, Call]] = []

    @property
    def inline(self) -> bool:
        return self._inline

    def __call__(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.run(fn, args, kwargs, None)
        return result

    def map(self, calls: Sequence[partial[R]], node: str | None = None) -> list[Any]:
        out = []
        for c in calls:
            self.timeline.append(("submitted", Call(c.func, _name(c.func), c.args, c.keywords, node)))
            later = _Later(self, c, node)
            if self._inline:
                later.run()
            out.append(later)
        return out

    def node_workers(self) -> list[dict[str, float]] | None:
        return self._workers

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], node: str | None) -> Any:
        call = Call(fn, _name(fn), args, kwargs, node)
        self.ran.append(call)
        self.timeline.append(("ran", call))
        if self._fail(call):
            raise Injected(f"injected: {call.name} failed")
        return self._instead.get(call.name, fn)(*args, **kwargs)

    def names(self) -> list[str]:
        return [c.name for c in self.ran]


def _name(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", fn))
