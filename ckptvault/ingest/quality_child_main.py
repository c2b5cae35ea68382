"""The gate child process itself (`python -m ckptvault.ingest.quality_child_main`, started by
ckptvault/ingest/quality_child.py): apart from the parent's side, so that the parent's modules never
import the evaluation they hand to the child."""

from __future__ import annotations

import os
import pickle
import sys
import time

from ckptvault.ingest.quality_child import LEAN_ENV

# Optional dependencies of Great Expectations and pandas that the gates never touch (they evaluate small
# in-memory pandas frames): the child treats them as not installed. A None entry in sys.modules is
# Python's documented way to block an import, and GX's and pandas' own compatibility layers take the
# ImportError as "extra not installed". It saves ~60 MiB of the child's ~270 MiB, which the flow
# process (~175 MiB) pays on top while the gates run: the CLI's peak. If a future GX or pandas needs
# one of them after all, the child starts over with the full import (LEAN_ENV = "0"), slower but right.
LEAN_BLOCKED = ("pyarrow", "sqlalchemy", "boto3", "botocore")


def _lean_blocked(value: str | None) -> tuple[str, ...]:
    if value is None or value.strip() in ("", "1"):
        return LEAN_BLOCKED
    if value.strip() == "0":
        return ()
    return tuple(m.strip() for m in value.split(",") if m.strip())


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
    """Build the engine (the slow part, done before the plan arrives so a prewarmed child is ready),
    evaluate one pickled GatePlan from stdin, answer on stdout."""
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
            sys.executable, [sys.executable, "-m", "ckptvault.ingest.quality_child_main"], {**os.environ, LEAN_ENV: "0"}
        )
    from ckptvault.timing import process_age

    ready_after = process_age()  # the interpreter's start, the imports and the engine: what prewarm hides
    data = sys.stdin.buffer.read()
    if not data:
        return 0  # a prewarmed child nobody needed
    plan = pickle.loads(data)  # our own parent's request
    answer = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything GX prints must not corrupt the answer
    t0 = time.perf_counter()
    outcomes = quality.evaluate(plan)
    evaluate_s = time.perf_counter() - t0
    loaded = tuple(m for m in LEAN_BLOCKED if sys.modules.get(m) is not None)
    info = {"lean": bool(blocked), "blocked_loaded": loaded, "peak_rss_mib": _peak_rss_mib(),
            "ready_after_s": ready_after, "evaluate_s": evaluate_s}  # fmt: skip
    answer.write(pickle.dumps((outcomes, info)))
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
