"""Where the suite's time goes: each tests/ folder's total and test count, printed at the end of every run.

pytest's own `--durations=30` (the Makefile's test target) names the slowest tests; this adds the sum per
folder (setup, call and teardown: a session server's start-up is charged to the first test that needs it),
so a change that makes one area slower shows up in CI's log, not only in a single slow test.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

_SECONDS: defaultdict[str, float] = defaultdict(float)
_TESTS: defaultdict[str, set[str]] = defaultdict(set)
_STARTED = time.monotonic()


def folder_of(nodeid: str) -> str:
    """'tests/flows/test_cli.py::test_x[a]' -> 'tests/flows'; a test file directly in tests/ -> 'tests'."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    folder = folder_of(report.nodeid)
    _SECONDS[folder] += report.duration
    _TESTS[folder].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SECONDS:
        return
    terminalreporter.section("time per tests/ folder (setup + call + teardown)")
    total = sum(_SECONDS.values())
    for folder, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        share = 100 * seconds / total if total else 0.0
        terminalreporter.write_line(
            f"{seconds:9.1f} s {share:5.1f}%  {len(_TESTS[folder]):5d} tests  {folder}"
        )
    wall = time.monotonic() - _STARTED
    terminalreporter.write_line(f"{total:9.1f} s in tests, {wall:.1f} s wall (collection and servers included)")
