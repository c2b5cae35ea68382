"""Prefect tasks of the drill flow's selection, coverage, lock check and resume check: one library call each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ckptvault.catalog import CheckpointState
from ckptvault.history import tamper
from ckptvault.objectlock import drift
from ckptvault.restore import drill as lib
from ckptvault.restore import environment, verify
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


@local_task("drill-one-save")
def one_save_task(states: Sequence[CheckpointState], run: str, step: int) -> lib.Selection:
    """`drill --verify-only RUN --step N`: that save alone."""
    return lib.one_save(states, run, step)


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


@local_task("drill-verify", task_run_name="drill-verify-{run_name}-{step}-{save}")
def verify_task(
    settings: verify.Settings,
    checkpoint: Path,
    *,
    run_name: str,
    step: int,
    save: int,
    fmt: str,
    metrics: Mapping[str, float],
) -> verify.VerifyResult:
    """The resume check of one restored save (docs/drills.md, "Resume check"), its outcome in the log."""
    got = verify.run(settings, checkpoint, run_name=run_name, step=step, save=save, fmt=fmt, metrics=metrics)
    print(f"{lib.label(run_name, step, save)}: resume check {got.outcome}: {got.why} ({got.seconds:.1f} s)")
    return got


# the versions this worker's checks load with (docs/drills.md, "Before an upgrade: --python")
loaded_with_task = local_task("loaded-with")(environment.loaded_with)


@local_task("drill-other-python", task_run_name="drill-other-python-{run_name}-{step}-{save}")
def other_python_task(
    python: str,
    checkpoint: Path,
    settings: verify.Settings | None,
    *,
    run_name: str,
    step: int,
    save: int,
    fmt: str,
    metrics: Mapping[str, float],
    timeout: float,
) -> environment.OtherResult:
    """`drill --python PATH`: the load checks and the resume check of the restored save with that interpreter."""
    return environment.drill_with(python, checkpoint, settings, run_name=run_name, step=step, save=save, fmt=fmt,
                                  metrics=metrics, timeout=timeout)  # fmt: skip
