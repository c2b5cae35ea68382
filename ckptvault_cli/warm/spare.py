"""The warm process's spare Great Expectations child, for the next ingest's quality gates.

The gates' child (ckptvault/ingest/quality_child.py) takes ~1.2 s to import and build its engine. A cold
ingest starts one first thing, and Prefect's own start hides it; a warm ingest reaches its gates sooner
than that, so the warm process keeps one started, and an ingest's child inherits it as if it had
prewarmed it itself. It is started only while no command runs (its import would take a core from one),
and it stays the warm process's child: reaped there (`ended`) once the ingest is done with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptvault_cli.warm.client import command_of

# The commands whose quality gates take the spare; the others leave it for the next.
GATED = frozenset({"ingest", "follow"})
DEATHS_MAX = 3  # spares that died unused before no more are started (a broken install: logged)


def gated(argv: Sequence[object]) -> bool:
    return command_of([str(a) for a in argv]) in GATED


def _close_pipes(proc: Any) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@dataclass
class Spare:
    log: Callable[[str], None]
    handed: dict[int, Any] = field(default_factory=dict)  # given to commands' children, to reap
    deaths: int = 0

    def start(self) -> None:
        """Idle: have one started (idempotent), unless too many died unused."""
        from ckptvault.ingest import quality_child

        if self.deaths >= DEATHS_MAX:
            return
        try:
            quality_child.prewarm()
        except OSError as e:  # an ingest then starts its own, as a cold one does
            self.log(f"could not start a Great Expectations child: {e}")

    def hand_over(self, child: int) -> None:
        """In the warm process, after forking an ingest's child: the spare is that child's now."""
        from ckptvault.ingest import quality_child

        for proc in quality_child.take_prewarmed():
            self.log(f"gate child {proc.pid} handed to child {child}")
            _close_pipes(proc)  # the command's child holds the pipes; EOF must reach each end from it
            self.handed[proc.pid] = proc

    @staticmethod
    def leave() -> None:
        """In a command's child that runs no gates: the spare stays the warm process's, not stopped at
        this child's exit."""
        from ckptvault.ingest import quality_child

        for proc in quality_child.take_prewarmed():
            _close_pipes(proc)

    def ended(self, pid: int) -> None:
        """`pid`, not a command's child, was reaped: a handed-over spare, or the spare itself, dead unused."""
        from ckptvault.ingest import quality_child

        if self.handed.pop(pid, None) is not None:
            return
        proc = quality_child.forget_prewarmed(pid)
        if proc is None:
            return
        self.deaths += 1
        tail = b""
        with contextlib.suppress(OSError, ValueError):
            tail = proc.stderr.read()[-600:] if proc.stderr is not None else b""
        more = "" if self.deaths < DEATHS_MAX else "; no more are started: ingests start their own"
        self.log(f"gate child {pid} ended unused: {tail.decode(errors='replace').strip() or 'nothing on stderr'}{more}")
