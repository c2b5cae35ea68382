"""When the command's process started, on the monotonic clock every process shares (Linux: /proc).
Standard library only: the console script reads it before it imports anything else
(ckptvault_cli/warm/client.py), and a warm process's child is told it (`set_process_start`), as its own
process is not the one the user started. `--profile` and the gate child's readiness read `process_age`."""

from __future__ import annotations

import os
import time


def age() -> float | None:
    """Seconds since this process started (to the clock tick), None where unknown."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        # the fields after the command name, which may itself hold spaces and parentheses
        started_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def started() -> float | None:
    """This process's start as a perf_counter instant (CLOCK_MONOTONIC: comparable across processes)."""
    a = age()
    return None if a is None else time.perf_counter() - a


_process_start: list[float] = []  # set_process_start's: the command's start, for a warm process's child


def set_process_start(started: float) -> None:
    """The command began at `started` (perf_counter's clock) in another process: a warm process's child
    runs a command whose process (the one the user started) is not itself (ckptvault_cli/warm/server.py)."""
    _process_start[:] = [started]


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc, to the clock tick), None where unknown; in a
    warm process's child, since the command's own process started (`set_process_start`)."""
    if _process_start:
        return max(0.0, time.perf_counter() - _process_start[0])
    return age()
