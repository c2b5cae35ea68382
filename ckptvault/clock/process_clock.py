"""When this process started, on the monotonic clock every process shares (Linux: /proc). Standard
library only: the console script reads it before it imports anything else (ckptvault_cli/warm/client.py),
and `timing.process_age` is this unless a warm process's child was told its command's own start."""

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
