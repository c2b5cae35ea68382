"""Great Expectations in a short-lived child process: the gates' evaluation without its import cost and
memory staying in the flow's process. The parent pickles a `GatePlan` to the child's stdin and reads
the rule outcomes from its stdout; a child can be started ahead (`prewarm`) so its import overlaps the
caller's start-up. The evaluation itself is `quality.evaluate`."""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ckptvault.ingest.gates import GatePlan
    from ckptvault.ingest.judging import RuleOutcome

log = logging.getLogger(__name__)


CHILD_TIMEOUT = 300.0  # seconds; a cold GX start takes 3-9 s

# Optional dependencies of Great Expectations and pandas that the gates never touch (they evaluate small
# in-memory pandas frames): the child treats them as not installed. A None entry in sys.modules is
# Python's documented way to block an import, and GX's and pandas' own compatibility layers take the
# ImportError as "extra not installed". It saves ~60 MiB of the child's ~270 MiB, which the flow
# process (~175 MiB) pays on top while the gates run: the CLI's peak. If a future GX or pandas needs
# one of them after all, the child starts over with the full import (LEAN_ENV = "0"), slower but right.
LEAN_BLOCKED = ("pyarrow", "sqlalchemy", "boto3", "botocore")
# Unset or "1": block LEAN_BLOCKED; "0": block nothing; otherwise a comma-separated list to block instead.
LEAN_ENV = "CKPTVAULT_GATES_LEAN"


def _lean_blocked(value: str | None) -> tuple[str, ...]:
    if value is None or value.strip() in ("", "1"):
        return LEAN_BLOCKED
    if value.strip() == "0":
        return ()
    return tuple(m.strip() for m in value.split(",") if m.strip())


_warm: list[subprocess.Popen[bytes]] = []  # at most one started child waiting for its plan
_warm_lock = threading.Lock()
# The newest child's report on itself: {'lean': bool, 'blocked_loaded': [LEAN_BLOCKED modules imported
# anyway], 'peak_rss_mib': float}. A plain dict: the child is `__main__`, its classes do not unpickle here.
last_child: dict[str, Any] = {}


def _spawn() -> subprocess.Popen[bytes]:
    # The package's parent directory goes first on the child's path, so the child runs this very
    # code even where ckptvault is not installed (a checkout on PYTHONPATH, a Prefect worker's cwd).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "ckptvault.ingest.quality_child"],
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


def _take_child() -> subprocess.Popen[bytes]:
    with _warm_lock:
        if _warm:
            return _warm.pop()
    return _spawn()


def evaluate_in_child(plan: GatePlan) -> dict[str, RuleOutcome]:
    from ckptvault.ingest.quality import QualityError  # loaded by now: it is what calls this

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
    outcomes, info = pickle.loads(stdout)  # our own child's answer
    last_child.clear()
    last_child.update(info)
    log.debug("gate child for %s: %s", what, info)
    return cast("dict[str, RuleOutcome]", outcomes)


def _peak_rss_mib() -> float:
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _child_main() -> int:
    """`python -m ckptvault.ingest.quality_child`: build the engine (the slow part, done before the plan arrives so
    a prewarmed child is ready), evaluate one pickled GatePlan from stdin, answer on stdout."""
    blocked = _lean_blocked(os.environ.get(LEAN_ENV))
    for name in blocked:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    from ckptvault.ingest import quality  # the parent imports quality first; the child only here

    try:
        quality.get_engine()
    except ImportError as e:
        if not blocked:
            raise
        print(f"gate child: the lean import failed ({e}); starting over with every dependency", file=sys.stderr)
        sys.stderr.flush()
        os.execve(
            sys.executable, [sys.executable, "-m", "ckptvault.ingest.quality_child"], {**os.environ, LEAN_ENV: "0"}
        )
    data = sys.stdin.buffer.read()
    if not data:
        return 0  # a prewarmed child nobody needed
    plan = pickle.loads(data)  # our own parent's request
    answer = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything GX prints must not corrupt the answer
    outcomes = quality.evaluate(plan)
    loaded = tuple(m for m in LEAN_BLOCKED if sys.modules.get(m) is not None)
    info = {"lean": bool(blocked), "blocked_loaded": loaded, "peak_rss_mib": _peak_rss_mib()}
    answer.write(pickle.dumps((outcomes, info)))
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
