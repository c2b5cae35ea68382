"""Where one command's wall time goes (`ckptvault ingest --profile`, docs/performance.md, "Where a
command's time goes").

Code marks its phases with `with phase("transfer"): ...`. Nothing is recorded unless the process
turned the recorder on (`RECORDER.enable`): otherwise `phase` costs one attribute read, so the library
marks its phase boundaries unconditionally.

The breakdown is of one timeline, the thread that enabled the recorder (the command's main thread):
each instant of it is charged to the innermost phase open on that thread, or to "other" when none is,
so the phases and "other" sum to the measured wall time exactly, by construction. A phase nested in
another takes its time out of the outer one (`prefect flow run` around the flow's own phases is the
flow run's overhead alone). Phases opened on other threads (a worker's upload) overlap the timeline:
they are summed separately, as thread-seconds beside it, and never added to the total; so is what a
child process reports of itself (`note`: the gate child's start and evaluation).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

__all__ = ["OTHER", "RECORDER", "Breakdown", "Recorder", "mark", "phase"]

OTHER = "other"  # the timeline's time no phase covered
# The phase names the commands' code marks (one spelling each; docs/performance.md says what each holds)
PROCESS_START = "process start"
IMPORTS = "imports"
PREFLIGHT = "config and preflight"
PREFECT = "prefect flow run"
CATALOG_READ = "catalog and manifest reads"
DISCOVERY = "discovery"
PLAN = "plan"
GATES = "quality gates"
TRANSFER = "transfer"
VERIFICATION = "verification"
WRITES = "manifest and catalog writes"
FINALIZE = "pointer file and rename into place"
ARTIFACTS = "artifacts"
ALERTS = "alerts"
COMPACTION = "compaction"
OUTPUT = "output"
SHUTDOWN = "shutdown"
# Instants, not phases: when something first happened, in seconds from the process's start
FIRST_BYTE = "first_byte"  # the first bytes of a transfer moved (a restore's first GET body read)


@dataclass(frozen=True)
class Breakdown:
    """`phases`: (name, seconds) on the timeline in the order each was first entered, then `OTHER`;
    they sum to `total`. `alongside`: thread-seconds of phases on other threads (not in the total).
    `marks`: (name, seconds from the origin) of instants (`first_byte`), on no line of the sum."""

    phases: tuple[tuple[str, float], ...]
    total: float
    alongside: tuple[tuple[str, float], ...] = ()
    marks: tuple[tuple[str, float], ...] = ()

    def seconds(self, name: str) -> float:
        return sum(s for n, s in self.phases if n == name)

    def as_dict(self) -> dict[str, object]:
        return {
            "total_s": round(self.total, 4),
            "phases": [{"phase": n, "seconds": round(s, 4)} for n, s in self.phases],
            "alongside": [{"phase": n, "thread_seconds": round(s, 4)} for n, s in self.alongside],
            "marks": {n: round(s, 4) for n, s in self.marks},
        }

    def table(self) -> list[str]:
        """The breakdown as printed: one line a phase, its share of the total, then the total."""
        width = max([len(n) for n, _ in (*self.phases, *self.alongside)] + [len("total")])
        lines = [f"{'phase':<{width}}  {'seconds':>8}  {'share':>6}"]
        for n, s in self.phases:
            share = 100 * s / self.total if self.total > 0 else 0.0
            lines.append(f"{n:<{width}}  {s:8.3f}  {share:5.1f}%")
        lines.append(f"{'total':<{width}}  {self.total:8.3f}  100.0%")
        if self.alongside:
            lines.append("beside the above, overlapping it (worker threads, the gate child; seconds each):")
            lines += [f"{n:<{width}}  {s:8.3f}" for n, s in self.alongside]
        lines += [f"{n} at {s:.3f} s from the process's start" for n, s in self.marks]
        return lines


@dataclass
class _Stack:
    names: list[str] = field(default_factory=list)
    mark: float = 0.0  # when the time since was last charged


class Recorder:
    """Process-wide and thread-safe; a no-op until `enable`."""

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._timeline = 0  # the enabling thread's ident
        self._origin = 0.0
        self._stacks: dict[int, _Stack] = {}
        self._on: dict[str, float] = {}  # the timeline's, in first-entered order (dicts keep it)
        self._beside: dict[str, float] = {}
        self._marks: dict[str, float] = {}  # name: perf_counter value of its first `mark`

    def enable(self, origin: float | None = None) -> None:
        """Start recording on the calling thread's timeline. `origin`: a `time.perf_counter()` value
        the total is measured from (the process start, which may be before now); the time from it to
        now is "other" until `charge` names it."""
        now = time.perf_counter()
        with self._lock:
            self.enabled = True
            self._timeline = threading.get_ident()
            self._origin = now if origin is None else min(origin, now)
            self._stacks = {self._timeline: _Stack(mark=self._origin)}
            self._on, self._beside, self._marks = {}, {}, {}

    def disable(self) -> None:
        with self._lock:
            self.enabled = False

    def note(self, name: str, seconds: float) -> None:
        """Add `seconds` beside the timeline under `name`: what ran elsewhere and reported its own
        duration (the gate child's import and evaluation)."""
        if not self.enabled:
            return
        with self._lock:
            self._beside[name] = self._beside.get(name, 0.0) + seconds

    def mark(self, name: str) -> None:
        """Note the instant `name` first happens, from any thread; later marks of it are ignored."""
        if not self.enabled or name in self._marks:
            return
        now = time.perf_counter()
        with self._lock:
            self._marks.setdefault(name, now)

    def charge(self, name: str, until: float) -> None:
        """Charge the timeline's time from its last mark up to `until` (a perf_counter value) to
        `name`: for what ran before the recorder could be on (the interpreter's start, imports)."""
        if not self.enabled:
            return
        with self._lock:
            stack = self._stacks[self._timeline]
            if until > stack.mark:
                self._on[name] = self._on.get(name, 0.0) + (until - stack.mark)
                stack.mark = until

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        ident = threading.get_ident()
        self._switch(ident, push=name)
        try:
            yield
        finally:
            self._switch(ident, push=None)

    def _switch(self, ident: int, push: str | None) -> None:
        """Charge the thread's time since its last mark to its innermost phase (or "other"), then
        enter `push`, or leave the innermost phase when None."""
        now = time.perf_counter()
        with self._lock:
            if not self.enabled:
                return
            stack = self._stacks.get(ident)
            if stack is None:
                stack = self._stacks[ident] = _Stack(mark=now)
            on_timeline = ident == self._timeline
            top = stack.names[-1] if stack.names else (OTHER if on_timeline else None)
            if top is not None:
                into = self._on if on_timeline else self._beside
                into[top] = into.get(top, 0.0) + (now - stack.mark)
            stack.mark = now
            if push is not None:
                stack.names.append(push)
            elif stack.names:
                stack.names.pop()

    def report(self, end: float | None = None, expected: Sequence[str] = ()) -> Breakdown:
        """The breakdown from the origin to `end` (default: now). Phases still open on the timeline
        are charged up to `end`. `expected`: names listed first, in this order, 0 s if never entered
        (a command's every phase is on its table); the others follow as first entered."""
        end = time.perf_counter() if end is None else end
        with self._lock:
            on = dict(self._on)
            stack = self._stacks.get(self._timeline)
            if stack is not None and end > stack.mark:
                top = stack.names[-1] if stack.names else OTHER
                on[top] = on.get(top, 0.0) + (end - stack.mark)
            other = on.pop(OTHER, 0.0)
            total = end - self._origin
            beside = tuple(self._beside.items())
            marks = tuple((n, at - self._origin) for n, at in self._marks.items() if at <= end)
        rows = [(n, on.pop(n, 0.0)) for n in expected if n != OTHER]
        return Breakdown((*rows, *on.items(), (OTHER, other)), total, beside, marks)


RECORDER = Recorder()


def phase(name: str) -> AbstractContextManager[None]:
    """`with phase("transfer"): ...` on the process-wide recorder."""
    return RECORDER.phase(name)


def mark(name: str) -> None:
    """`mark(FIRST_BYTE)` on the process-wide recorder: the first call's instant is kept."""
    RECORDER.mark(name)
