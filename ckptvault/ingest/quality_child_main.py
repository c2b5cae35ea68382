"""The gate child process itself (`python -m ckptvault.ingest.quality_child_main`, started by
ckptvault/ingest/quality_child.py): apart from the parent's side, so that the parent's modules never
import the evaluation they hand to the child."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import sys
import threading
import time
from types import ModuleType

from ckptvault.ingest.quality_child import LEAN_ENV

# Optional dependencies of Great Expectations and pandas that the gates never touch (they evaluate small
# in-memory pandas frames): the child treats them as not installed. A None entry in sys.modules is
# Python's documented way to block an import, and GX's and pandas' own compatibility layers take the
# ImportError as "extra not installed". It saves ~60 MiB of the child's ~270 MiB, which the flow
# process (~175 MiB) pays on top while the gates run: the CLI's peak. If a future GX or pandas needs
# one of them after all, the child starts over with the full import (LEAN_ENV = "0"), slower but right.
LEAN_BLOCKED = ("pyarrow", "sqlalchemy", "boto3", "botocore")


# Imported at the top of one Great Expectations module (expect_column_kl_divergence_to_be_less_than: its
# charts and its entropy), used only inside that expectation's functions, which no gate calls: half of
# the child's start (scipy.stats ~28%, altair with narwhals ~23% of the import time, `python -X
# importtime`, GX 1.24). Deferred, not blocked: a GX that does call them still gets the real modules.
LEAN_DEFERRED = ("altair", "scipy.stats")


_loading = threading.RLock()  # one first read loads the real module; another thread's waits for it


class _Deferred(ModuleType):
    """Stands in sys.modules for a module not imported yet; the first attribute read imports the real
    one and answers from it. Not importlib.util.LazyLoader: `import altair as alt` reads the module's
    `__spec__` (Python 3.11), which makes a LazyLoader module run its code at once. A submodule imported
    while it stands in (`import scipy.stats._x` reads its `__path__`) would run that submodule twice, so
    that is an ImportError: the child starts over with the full import (`_child_main`)."""

    def __getattr__(self, attr: str) -> object:
        with _loading:
            real = self.__dict__.get("_real")
            if real is None:
                real = self._load()
        if attr == "__path__":
            raise ImportError(f"{self.__name__}: a submodule imported while it was deferred")
        return getattr(real, attr)

    def _load(self) -> ModuleType:
        name = self.__name__
        parent, _, child = name.rpartition(".")
        # out of the way while the real one runs: its own `import scipy.stats._x` must find that one
        del sys.modules[name]
        if parent and getattr(sys.modules[parent], child, None) is self:
            delattr(sys.modules[parent], child)
        try:
            real = importlib.import_module(name)
        except BaseException:
            sys.modules[name] = self
            if parent:
                setattr(sys.modules[parent], child, self)
            raise
        self.__dict__["_real"] = real
        return real


def _defer(name: str) -> bool:
    """`name` in sys.modules as a _Deferred; False (nothing changed) when it is not installed or is
    imported already."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)  # a dotted name's parent is imported: scipy, cheap
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    stand_in = _Deferred(name)
    stand_in.__spec__ = spec  # find_spec(name) answers from it, as for any imported module
    sys.modules[name] = stand_in
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, stand_in)  # `from scipy import stats` reads it there
    return True


def _deferred_loaded(names: list[str]) -> tuple[str, ...]:
    return tuple(n for n in names if not isinstance(sys.modules.get(n), _Deferred) or "_real" in vars(sys.modules[n]))


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
    deferred = [m for m in LEAN_DEFERRED if _defer(m)] if blocked else []
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
    from ckptvault.command.process_clock import process_age

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
    ran = _deferred_loaded(deferred)
    info = {"lean": bool(blocked), "blocked_loaded": loaded, "deferred": tuple(deferred), "deferred_loaded": ran,
            "peak_rss_mib": _peak_rss_mib(), "ready_after_s": ready_after, "evaluate_s": evaluate_s}  # fmt: skip
    answer.write(pickle.dumps((outcomes, info)))
    answer.flush()
    return 0


if __name__ == "__main__":
    code = _child_main()
    # The answer is written and flushed, and the parent's communicate() waits for this process's end:
    # the interpreter's teardown of Great Expectations' module graph (~0.3 s, measured) would be on the
    # gates' critical path. Nothing here needs it (no files, no threads that hold data).
    sys.stderr.flush()
    os._exit(code)
