"""`--profile` on `ingest` and `restore`: the wall time of the one command, from the process's start to
just before it exits, broken down by phase (ckptvault/clock/timing.py records; docs/performance.md, "Where a
command's time goes", says what each phase holds).

The table goes to stderr after everything the command printed; with `--json` the command's document is
held back and printed with a `profile` key instead, so stdout stays one document. In the console
script the breakdown is printed by the last exit handler (ckptvault_cli/main.py, `_end_process`), so
the shutdown (Prefect's log and event drains, the exit handlers) is on it; `main` called in-process
(the tests) prints it when it returns, timed from its own start.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ckptvault.clock import timing
from ckptvault.clock.timing import RECORDER
from ckptvault.command.process_clock import process_age

PHASES = {
    "ingest": (
        timing.PROCESS_START, timing.IMPORTS, timing.PREFLIGHT, timing.PREFECT, timing.CATALOG_READ,
        timing.DISCOVERY, timing.GATES, timing.TRANSFER, timing.VERIFICATION, timing.WRITES, timing.ARTIFACTS,
        timing.ALERTS, timing.COMPACTION, timing.OUTPUT, timing.SHUTDOWN,
    ),
    "restore": (
        timing.PROCESS_START, timing.IMPORTS, timing.PREFLIGHT, timing.CATALOG_READ, timing.PLAN, timing.PREFECT,
        timing.TRANSFER, timing.FINALIZE, timing.WRITES, timing.ALERTS, timing.OUTPUT, timing.COMPACTION,
        timing.ARTIFACTS, timing.SHUTDOWN,
    ),
}  # fmt: skip

_state: dict[str, Any] = {}  # command, json, one_shot, held (the --json document, held back)


def begin(command: str, as_json: bool, main_started: float, one_shot: bool) -> None:
    """Turn the recorder on for `command`. In the console script (`one_shot`) the total starts at the
    process's start: the interpreter's start up to `main_started` (main.py's first line) is "process
    start", from there to now "imports"; in-process, at `main_started`."""
    now = time.perf_counter()
    age = process_age() if one_shot else None
    origin = now - age if age is not None else main_started
    RECORDER.enable(origin=origin)
    RECORDER.charge(timing.PROCESS_START, main_started)
    RECORDER.charge(timing.IMPORTS, now)
    _state.clear()
    _state.update(command=command, json=as_json, one_shot=one_shot)


def active() -> bool:
    return RECORDER.enabled and bool(_state)


def hold_json(doc: object) -> bool:
    """True when `doc` (the command's one --json document) is held back for the profile to join it."""
    if not (active() and _state.get("json")):
        return False
    _state["held"] = doc
    return True


def returned() -> None:
    """`main` has returned (the console script): what follows, up to the exit, is the shutdown."""
    if active():
        RECORDER.charge(timing.OTHER, time.perf_counter())


def finish(*, shutdown: bool) -> None:
    """Print the breakdown (stderr) and any held --json document (stdout, with `profile`), once.
    `shutdown`: the time since `returned` is the process's shutdown (the last exit handler calls it)."""
    if not active():
        return
    end = time.perf_counter()
    if shutdown:
        RECORDER.charge(timing.SHUTDOWN, end)
    breakdown = RECORDER.report(end, expected=PHASES.get(_state["command"], ()))
    RECORDER.disable()
    held, as_json = _state.pop("held", None), _state.get("json")
    _state.clear()
    print(f"ckptvault: --profile, where this command's {breakdown.total:.3f} s went:", file=sys.stderr)
    print("\n".join(breakdown.table()), file=sys.stderr, flush=True)
    if as_json and held is not None:  # none held: the command ended before its document (exit 2)
        from ckptvault_cli.json_text import dumps

        doc = held if isinstance(held, dict) else {"result": held}
        print(dumps({**doc, "profile": breakdown.as_dict()}), flush=True)
