"""Session-scoped checkpoint trees written by the real frameworks (tests/frameworks/writers.py).

`framework_run(fw)` trains framework `fw` once per test session in a child process and returns its
run root; every test reads the same tree and must not change it (a test that needs to change one
makes its own with `write_run`). A framework that is not installed fails the tests that need it
with CI=true and skips them elsewhere (tests.frameworks.need).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks import need

REPO = Path(__file__).resolve().parents[2]
# The module each writer needs, imported in the test process only to fail or skip early and clearly.
MODULE = {
    "hf": "transformers",
    "hf-sharded": "transformers",
    "lightning": "lightning",
    "dcp": "torch.distributed.checkpoint",
    "orbax": "orbax.checkpoint",
    "deepspeed": "deepspeed",
    "deepspeed-tags": "deepspeed",
    "megatron": "megatron.core.dist_checkpointing",
}
TIMINGS: dict[str, float] = {}


def writer(*args: str, env: dict[str, str] | None = None, expect_kill: bool = False) -> dict[str, Any]:
    """Run `python -m tests.frameworks.writers ARGS` and return its RESULT; a kill (--kill-at-last) is
    expected to end it by a signal, anything else must exit 0."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.frameworks.writers", *args],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})},
    )  # fmt: skip
    TIMINGS[" ".join(args[:2])] = TIMINGS.get(" ".join(args[:2]), 0.0) + time.monotonic() - t0
    tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
    if expect_kill:
        assert proc.returncode < 0 or proc.returncode > 128, f"expected a kill, got exit {proc.returncode}:\n{tail}"
        return {}
    assert proc.returncode == 0, f"writers {' '.join(args)} exited {proc.returncode}:\n{tail}"
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def write_run(fw: str, root: Path, *extra: str, env: dict[str, str] | None = None, expect_kill: bool = False) -> Path:
    need(MODULE[fw])
    writer("train", fw, str(root), *extra, env=env, expect_kill=expect_kill)
    return root


@pytest.fixture(scope="session")
def framework_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """framework_run(fw) -> the run root `fw` wrote (6 steps, a checkpoint every 2), made once a session."""
    made: dict[str, Path] = {}
    # Under pytest-xdist every worker is a session of its own: the trees are made once for the whole run,
    # in the directory the workers' base temps share, by whichever worker asks first (the others wait on
    # the lock, then read the finished tree).
    shared = tmp_path_factory.getbasetemp().parent / "framework-runs" if os.environ.get("PYTEST_XDIST_WORKER") else None

    def get(fw: str) -> Path:
        need(MODULE[fw])
        if fw in made:
            return made[fw]
        if shared is None:
            made[fw] = write_run(fw, tmp_path_factory.mktemp(f"run-{fw}") / "root")
            return made[fw]
        shared.mkdir(exist_ok=True)
        with open(shared / f"{fw}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            root, done = shared / fw / "root", shared / fw / "written"
            if not done.exists():
                shutil.rmtree(shared / fw, ignore_errors=True)  # a writer that failed half-way
                (shared / fw).mkdir()
                write_run(fw, root)
                done.touch()
        made[fw] = root
        return root

    return get


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.section("framework writers (child processes)")
        for what, seconds in sorted(TIMINGS.items()):
            terminalreporter.write_line(f"{what}: {seconds:.1f} s")
