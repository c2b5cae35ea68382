"""Great Expectations in a short-lived child process: the gates' evaluation without its import cost and
memory staying in the flow's process. The parent pickles a `GatePlan` to the child's stdin and reads
the rule outcomes from its stdout; a child can be started ahead (`prewarm`) so its import overlaps the
caller's start-up. This is the parent's side; the child runs ckptvault/ingest/quality_child_main.py,
whose evaluation is `quality.evaluate`."""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, cast

from ckptvault.clock.timing import RECORDER
from ckptvault.ingest.quality_error import QualityError

if TYPE_CHECKING:
    from ckptvault.ingest.gates import GatePlan
    from ckptvault.ingest.judging import RuleOutcome

log = logging.getLogger(__name__)


CHILD_TIMEOUT = 300.0  # seconds; a cold GX start takes 3-9 s

# Unset or "1": the child blocks quality_child_main.LEAN_BLOCKED; "0": block nothing; otherwise a
# comma-separated list to block instead.
LEAN_ENV = "CKPTVAULT_GATES_LEAN"


_warm: list[subprocess.Popen[bytes]] = []  # at most one started child waiting for its plan
_warm_lock = threading.Lock()
# The newest child's report on itself: {'lean': bool, 'blocked_loaded': [the modules it blocks
# (quality_child_main.LEAN_BLOCKED) imported anyway], 'peak_rss_mib': float}. A plain dict: the child
# is `__main__`, its classes do not unpickle here.
last_child: dict[str, Any] = {}


def _spawn() -> subprocess.Popen[bytes]:
    # The package's parent directory goes first on the child's path, so the child runs this very
    # code even where ckptvault is not installed (a checkout on PYTHONPATH, a Prefect worker's cwd).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "ckptvault.ingest.quality_child_main"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def prewarm() -> None:
    """Start the child now, so its Great Expectations import (~3 s) overlaps whatever the caller does
    before the first validation (the CLI: Prefect's start-up, discovery). The next isolated validation
    in this process uses it; an unused one is stopped at exit. Idempotent."""
    with _warm_lock:
        if not _warm:
            _warm.append(_spawn())


def discard_prewarmed() -> None:
    """Stop (kill) a prewarmed child that no validation used; it holds no state worth a clean exit."""
    with _warm_lock:
        procs = list(_warm)
        _warm.clear()
    for proc in procs:
        proc.kill()
        proc.communicate()


atexit.register(discard_prewarmed)


def take_prewarmed() -> list[subprocess.Popen[bytes]]:
    """The prewarmed child, if any, taken out of this module's hands: not used by a validation here, not
    stopped at exit. For a process that gives it to another (ckptvault_cli/warm/server.py)."""
    with _warm_lock:
        procs = list(_warm)
        _warm.clear()
    return procs


def forget_prewarmed(pid: int) -> subprocess.Popen[bytes] | None:
    """The prewarmed child `pid` has ended and was reaped by its parent's own loop: not to be used. Its
    Popen (its stderr still readable), or None when it was not the prewarmed one."""
    with _warm_lock:
        gone = [p for p in _warm if p.pid == pid]
        _warm[:] = [p for p in _warm if p.pid != pid]
    return gone[0] if gone else None


def _take_child() -> subprocess.Popen[bytes]:
    with _warm_lock:
        if _warm:
            return _warm.pop()
    return _spawn()


def evaluate_in_child(plan: GatePlan) -> dict[str, RuleOutcome]:
    what = f"{plan.candidate.run} step {plan.candidate.step}"
    proc = _take_child()
    try:
        stdout, stderr = proc.communicate(pickle.dumps(plan), timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise QualityError(
            f"validating {what}: Great Expectations did not finish within {CHILD_TIMEOUT:.0f} s in its child "
            "process; the machine may be overloaded. Retry, or set [validation] isolate = false"
        ) from None
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise QualityError(
            f"validating {what}: the Great Expectations child process exited with {proc.returncode}: "
            + " | ".join(tail)
            + f". The gates did not run, so the checkpoint is not uploaded. Check that {sys.executable} can "
            "`import great_expectations` (the project's install), or set [validation] isolate = false"
        )
    if not stdout:  # it ended without an answer; its exit code, where its parent is another, reads 0
        tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
        raise QualityError(
            f"validating {what}: the Great Expectations child process ended without an answer: "
            + (" | ".join(tail) or "nothing on its stderr")
            + ". The gates did not run, so the checkpoint is not uploaded. Retry; if it happens again, set"
            " [validation] isolate = false"
        )
    outcomes, info = pickle.loads(stdout)  # our own child's answer
    last_child.clear()
    last_child.update(info)
    # --profile: how much of the gates' wait was the child's start (prewarm hides what it can of it)
    if info.get("ready_after_s") is not None:
        RECORDER.note("gate child: start and imports", info["ready_after_s"])
    RECORDER.note("gate child: evaluation", info.get("evaluate_s", 0.0))
    log.debug("gate child for %s: %s", what, info)
    return cast("dict[str, RuleOutcome]", outcomes)
