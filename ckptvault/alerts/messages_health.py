"""Messages about the health of runs and of the store: staleness and recovery, the budget, failed
flows, restarted runs, unreadable catalog objects, a replica lagging behind the primary.

One builder per kind; see ckptvault/alerts/alert.py for whom the wording is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from ckptvault.alerts.alert import ALL_RUNS, Alert


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hours(seconds: float) -> str:
    h = seconds / 3600
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def _ckpt(step: int | None, ts: float) -> str:
    return (f"step {step}, " if step is not None else "") + f"written {_utc(ts)}"


def run_stale(
    run: str,
    newest_at: float,
    stale_after_hours: float,
    now: float,
    step: int | None = None,
    flow_run_url: str | None = None,
) -> Alert:
    return Alert(
        kind="run_stale",
        run=run,
        step=step,
        summary=f"Run {run} has written no checkpoint for {_hours(now - newest_at)}",
        details=[
            f"Newest checkpoint: {_ckpt(step, newest_at)}",
            f"Expected at least one every {stale_after_hours:g} h (sources.stale_after_hours)",
        ],
        next_step=(
            "Check the training job: is it alive, hung, or out of disk? If the run ended on purpose, "
            "remove stale_after_hours for it. You get one alert per episode and one when it recovers."
        ),
        severity="warning",
        flow_run_url=flow_run_url,
        # one episode = one newest checkpoint; a later episode is a different alert
        reason=f"since={newest_at:.3f}",
    )


def run_recovered(
    run: str,
    stale_since: float,
    newest_at: float,
    step: int | None = None,
    flow_run_url: str | None = None,
) -> Alert:
    return Alert(
        kind="run_recovered",
        run=run,
        step=step,
        summary=f"Run {run} is checkpointing again after a gap of {_hours(newest_at - stale_since)}",
        details=[f"New checkpoint: {_ckpt(step, newest_at)}"],
        next_step="Nothing to do; the earlier stale alert is resolved.",
        severity="info",
        flow_run_url=flow_run_url,
        reason=f"since={stale_since:.3f}",
    )


def budget_exceeded(monthly_usd: float, budget: float, run: str = ALL_RUNS, flow_run_url: str | None = None) -> Alert:
    return Alert(
        kind="budget_exceeded",
        run=run,
        step=None,
        summary=f"Storage spend ${monthly_usd:,.2f}/month is over the budget of ${budget:,.2f}/month",
        details=[f"Over by ${monthly_usd - budget:,.2f} ({(monthly_usd / budget - 1) * 100:.0f}%)"],
        next_step=(
            "Not urgent at night. Review the tier plan: lower policy.keep_hot, tier sooner, or set "
            "expire_after_days; or raise notify.budget_usd_per_month if the spend is expected."
        ),
        severity="warning",
        flow_run_url=flow_run_url,
        reason=f"budget={budget:g}",
    )


def flow_failed(
    flow: str,
    state: str,
    message: str,
    run: str = ALL_RUNS,
    flow_run_url: str | None = None,
    step: int | None = None,
) -> Alert:
    """From a Prefect on_failure/on_crashed hook (or direct mode); `state` is the state name (Failed,
    Crashed). A flow about one checkpoint (restore) names its run and step."""
    return Alert(
        kind="flow_failed",
        run=run,
        step=step,
        summary=f"Flow {flow} ended {state}" + (f" for {run} step {step}" if step is not None else ""),
        details=[message] if message else [],
        next_step="Open the flow run for the traceback. Flows are safe to re-run: finished work is skipped.",
        severity="error",
        flow_run_url=flow_run_url,
        # a different error in the same flow is news; the same one again within the window is not
        reason=f"{flow}:{state}:{message.splitlines()[0][:120] if message else ''}",
    )


def run_restarted(run: str, restart_step: int | None, resaved: Sequence[str], flow_run_url: str | None = None) -> Alert:
    """A training job went back and saved steps again: the old saves are kept, never `latest` again."""
    where = f"step {restart_step}" if restart_step is not None else "an earlier step"
    return Alert(
        kind="run_restarted",
        run=run,
        step=restart_step,
        summary=f"Run {run} restarted from {where}; steps were saved again. The old saves are kept as superseded",
        details=list(resaved),
        next_step=(
            "Nothing to do if the job was restarted on purpose: `restore --step latest` now means the new "
            f"branch. The old saves stay restorable: `ckptvault ls --run {run} --state superseded`, then "
            "`ckptvault restore RUN --step N --save K`."
        ),
        severity="warning",
        flow_run_url=flow_run_url,
        reason="resaved=" + ",".join(resaved),
    )


def catalog_unreadable(run: str, objects: Mapping[str, str], flow_run_url: str | None = None) -> Alert:
    """Catalog objects no reader could read (`run`: the partition's run, ALL_RUNS for the flat layout):
    every command skipped them, so what they held is missing from `ls` until someone looks."""
    keys = sorted(objects)
    return Alert(
        kind="catalog_unreadable",
        run=run,
        step=None,
        summary=f"{len(keys)} catalog object(s) cannot be read; commands skip them",
        details=[objects[k] if objects[k].startswith(k) else f"{k}: {objects[k]}" for k in keys],
        next_step=(
            "Nothing is lost from the checkpoints: their manifests are the source of truth, and a restore of this "
            "run reads them. The next compaction moves these objects to _catalog/unreadable/ (never deletes them); "
            "then `ckptvault catalog rebuild` shows what the manifests say, `--write` appends it."
        ),
        severity="warning",
        flow_run_url=flow_run_url,
        reason=",".join(keys),
    )


def catalog_unreadable_by_run(
    by_run: Mapping[str | None, Mapping[str, str]], flow_run_url: str | None = None
) -> list[Alert]:
    """One `catalog_unreadable` alert per run whose partition holds unreadable objects (`None`, the flat
    layout: ALL_RUNS), in run order: what every command that reads the catalog sends (`Catalog.unreadable_by_run`)."""
    return [catalog_unreadable(run or ALL_RUNS, objs, flow_run_url) for run, objs in sorted(by_run.items(), key=str)]


def replica_lagging(
    replica: str,
    late: Sequence[tuple[str, int, int, float]],
    max_lag_hours: float,
    now: float,
    flow_run_url: str | None = None,
) -> Alert:
    """Saves a replica should hold, committed on the primary more than `max_lag_hours` ago and not copied
    there: `late` is (run, step, save, committed_at) per save, oldest first (not empty). One alert per
    replica and oldest late save: it is news again only once that save is copied and another is late."""
    run, step, save, at = late[0]
    return Alert(
        kind="replica_lagging",
        run=ALL_RUNS,
        step=None,
        summary=(
            f"Replica {replica} is behind: {len(late)} save(s) committed more than {max_lag_hours:g} h ago are not "
            f"copied there; the oldest, {run} step {step} save {save}, for {_hours(now - at)}"
        ),
        details=[f"{r} step {n} save {k}: committed {_utc(t)}" for r, n, k, t in late],
        next_step=(
            f"Run `ckptvault replicate --replica {replica}` and read what it says failed (an unreachable endpoint, "
            "refused credentials, an object frozen on the primary). Until they are copied, `tier` neither expires "
            "these saves nor moves them into an archival class ([[replicas]] max_lag_hours sets this alert)."
        ),
        severity="warning",
        flow_run_url=flow_run_url,
        # the lag episode is its oldest late save: not repeated while that one waits
        reason=f"replica={replica};oldest={run}/{step}/{save}",
    )
