"""How every bench runs: a scratch directory left by a run killed hard is cleared first (its servers
stopped), SIGTERM is a Ctrl-C, and whatever happens the bench's servers are stopped and its data deleted."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.measure import log
from bench.servers import stop_leftovers


class Bench(Protocol):
    def main(self) -> int: ...

    def cleanup(self) -> None: ...


B = TypeVar("B", bound=Bench)


def run_bench(scratch: Path, make: Callable[[], B], on_interrupt: Callable[[B], None] | None = None) -> int:
    """`make()`'s bench run to its end: its exit code, or 130 after Ctrl-C or SIGTERM (`on_interrupt` may
    print what was measured so far)."""
    if scratch.exists():  # a previous run was killed hard: stop what it left running first
        stop_leftovers(scratch)
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
    bench = make()

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        return bench.main()
    except KeyboardInterrupt:
        log("interrupted: stopping servers and deleting bench data")
        if on_interrupt is not None:
            on_interrupt(bench)
        return 130
    finally:
        bench.cleanup()


def stop_all(servers: list[Any], scratch: Path, keep_scratch: bool = False) -> None:
    """A bench's cleanup: the commands still running killed, every server down (each failure ignored:
    the next one still stops), the scratch directory deleted unless asked to keep it."""
    from bench.measure import running

    for p in list(running):
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    for s in servers:
        with contextlib.suppress(Exception):
            s.down()
    if not keep_scratch:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
