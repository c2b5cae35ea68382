"""Prefect tasks of the drill flow's selection, coverage and lock check: one library call each."""

from __future__ import annotations

from collections.abc import Sequence

from ckptvault.catalog import CheckpointState
from ckptvault.history import tamper
from ckptvault.objectlock import drift
from ckptvault.restore import drill as lib
from ckptvault_prefect.tasks.retry import io_task, local_task


@local_task("select-drill")
def select_task(
    states: Sequence[CheckpointState], sample: int, cover_days: float | None, interval_days: float | None
) -> lib.Selection:
    sel = lib.select(states, sample, cover_days=cover_days, interval_days=interval_days)
    print(
        f"drilling {len(sel.chosen)} of {sel.drillable} drillable: {len(sel.newest)} run newest, "
        f"{len(sel.suspect)} suspect, {len(sel.queued)} from the rotation (share {sel.sample}; every checkpoint "
        f"within {sel.window} drill(s))"
    )
    return sel


@local_task("drill-coverage")
def coverage_task(
    states: Sequence[CheckpointState], now: float, sample: int, cover_days: float | None, interval_days: float | None
) -> lib.Coverage:
    return lib.coverage(states, now, sample, cover_days=cover_days, interval_days=interval_days)


lock_drift_task = io_task("lock-drift", task_run_name="lock-drift-{state.run}-{state.step}-{state.save}")(
    drift.lock_drift
)

# the save's tamper check on the copy the drill reads (docs/object-lock.md, "Noticed: the tamper check")
tamper_task = io_task("drill-tamper", task_run_name="drill-tamper-{run}-{step}-{save}")(tamper.drill_problems)
