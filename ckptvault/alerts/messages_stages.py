"""Messages of the lifecycle stages: ingest, validation, drills, tiering, eviction, restore.

One builder per kind; see ckptvault/alerts/alert.py for whom the wording is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ckptvault.alerts.alert import ALL_RUNS, Alert


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def ingest_failed(run: str, step: int, error: str, attempts: int, flow_run_url: str | None = None) -> Alert:
    return Alert(
        kind="ingest_failed",
        run=run,
        step=step,
        summary=f"Upload of {run} step {step} failed after {attempts} attempts; it is NOT in the store",
        details=[f"Last error: {error}"],
        next_step=(
            "The local checkpoint is untouched; do not delete it. Fix the cause above (store reachable? "
            "credentials? disk?), then run `ckptvault ingest` again: files already uploaded are skipped."
        ),
        severity="error",
        flow_run_url=flow_run_url,
        reason=f"step={step}",
    )


def validation_blocked(run: str, step: int, problems: Sequence[str], flow_run_url: str | None = None) -> Alert:
    return Alert(
        kind="validation_blocked",
        run=run,
        step=step,
        summary=f"Checkpoint {run} step {step} was quarantined: validation blocked it",
        details=list(problems),
        next_step=(
            "Look at the training job first: the failed checks above often mean a crash mid-save or a "
            "diverging loss. If the checkpoint is fine, relax that rule in [validation] and run "
            "`ckptvault ingest` again."
        ),
        severity="error",
        flow_run_url=flow_run_url,
        reason=f"step={step}",
    )


def validation_warned(run: str, step: int, problems: Sequence[str], flow_run_url: str | None = None) -> Alert:
    return Alert(
        kind="validation_warned",
        run=run,
        step=step,
        summary=f"Checkpoint {run} step {step} was uploaded with validation warnings",
        details=list(problems),
        next_step="No action needed tonight. Check the warnings above against the training job tomorrow.",
        severity="warning",
        flow_run_url=flow_run_url,
        reason=f"step={step}",
    )


def drill_failed(run: str, step: int, problems: Sequence[str], flow_run_url: str | None = None) -> Alert:
    return Alert(
        kind="drill_failed",
        run=run,
        step=step,
        summary=f"Restore drill FAILED for {run} step {step}: the stored copy could not be restored intact",
        details=list(problems),
        next_step=(
            "Treat this stored checkpoint as unusable. Keep the local copy if it still exists, and "
            "run `ckptvault drill` again to tell a one-off from a damaged object before re-uploading."
        ),
        severity="error",
        flow_run_url=flow_run_url,
        reason=f"step={step}",
    )


def drill_digest(
    passed: Sequence[tuple[str, int]],
    failed: Sequence[tuple[str, int]],
    flow_run_url: str | None = None,
) -> Alert:
    total = len(passed) + len(failed)
    bad = bool(failed)
    tail = f", {len(failed)} FAILED" if bad else ""
    return Alert(
        kind="drill_digest",
        run=ALL_RUNS,
        step=None,
        summary=f"Restore drills: {len(passed)} of {total} passed{tail}",
        details=[f"FAILED: {r} step {s}" for r, s in failed] + [f"ok: {r} step {s}" for r, s in passed],
        next_step=(
            "Each failure was alerted on its own: start there."
            if bad
            else "Nothing to do: every sampled checkpoint restored and matched its checksums."
        ),
        severity="warning" if bad else "info",
        flow_run_url=flow_run_url,
        reason="failed" if bad else "passed",
    )


def tier_applied(
    run: str,
    moved: Mapping[str, int],
    bytes_moved: int,
    saved_usd_per_month: float,
    flow_run_url: str | None = None,
    scheduled: Mapping[str, int] | None = None,
) -> Alert:
    """`moved`: checkpoints moved per target tier, e.g. {"cold": 3, "expired": 1}; `scheduled`: per
    tier, those left to the bucket lifecycle (tagged, moved from the rule's date)."""
    n = sum(moved.values())
    later = dict(scheduled or {})
    k = sum(later.values())
    what = f"{n} checkpoints moved" + (f", {k} scheduled to move by the bucket lifecycle" if k else "")
    return Alert(
        kind="tier_applied",
        run=run,
        step=None,
        summary=f"Tier plan applied to {run}: {what} ({_gb(bytes_moved)}), saving ${saved_usd_per_month:,.2f}/month",
        details=[f"{tier}: {count}" for tier, count in sorted(moved.items())]
        + [f"{tier}: {count} (scheduled)" for tier, count in sorted(later.items())],
        next_step="Nothing to do. Restoring from cold or archive tiers takes longer; plan restores ahead.",
        severity="info",
        flow_run_url=flow_run_url,
        reason=f"n={n},bytes={bytes_moved}" + (f",scheduled={k}" if k else ""),
    )


def evict_skipped(
    run: str,
    step: int,
    save: int,
    local: Sequence[str],
    store: Sequence[str],
    flow_run_url: str | None = None,
) -> Alert:
    """The tier run did not delete a local copy: re-checked before deleting, it (`local`) or the stored
    copy (`store`) no longer matched the manifest. Each item names a file and what differs."""
    broken_store = bool(store)
    why = "the stored copy is incomplete or changed" if broken_store else "the local files changed after upload"
    if broken_store:
        next_step = (
            "Keep the local copy: it may now be the only intact one. Find out who deleted or overwrote the "
            f"objects above behind ckptvault (versioning, another tool); `ckptvault restore {run} --step "
            f"{step} --save {save} --dest /scratch/check` shows whether the stored copy still restores. "
            "Every tier run checks again and evicts nothing until the store holds it all."
        )
    else:
        next_step = (
            "Nothing was deleted. Check what rewrote these files (a restarted job saving this step again?); "
            "the next `ckptvault ingest` uploads a rewritten step as a new save, and this save's local copy "
            "is then no longer its to evict. Every tier run checks again; nothing is lost meanwhile."
        )
    return Alert(
        kind="evict_skipped",
        run=run,
        step=step,
        summary=f"Local copy of {run} step {step} save {save} was NOT evicted: {why}",
        details=[f"store: {m}" for m in store] + [f"local: {m}" for m in local],
        next_step=next_step,
        severity="error" if broken_store else "warning",
        flow_run_url=flow_run_url,
        reason=f"step={step},save={save},{'store' if broken_store else 'local'}",
    )


def restore_completed(run: str, step: int, destination: str, seconds: float, flow_run_url: str | None = None) -> Alert:
    return Alert(
        kind="restore_completed",
        run=run,
        step=step,
        summary=f"Restore of {run} step {step} finished in {seconds:,.0f} s; checksums verified",
        details=[f"Restored to: {destination}"],
        next_step="Resume training from the path above.",
        severity="info",
        flow_run_url=flow_run_url,
        reason=f"step={step},to={destination}",
    )


def restore_failed(run: str, step: int, error: str, flow_run_url: str | None = None) -> Alert:
    return Alert(
        kind="restore_failed",
        run=run,
        step=step,
        summary=f"Restore of {run} step {step} FAILED",
        details=[f"Error: {error}"],
        next_step=(
            "If the error says the object is archived, the thaw is still running: rerun the same "
            f"`ckptvault restore` later. Otherwise restore an earlier step (`ckptvault ls --run {run}`)."
        ),
        severity="error",
        flow_run_url=flow_run_url,
        reason=f"step={step}",
    )


def legal_hold(
    run: str, step: int, save: int, on: bool, who: str, why: str, objects: int, flow_run_url: str | None = None
) -> Alert:
    """`ckptvault hold` / `release`: a legal hold set or cleared on every object of a save, by whom and why.
    A release is a warning: from then on only the save's retention (if any) protects it."""
    verb = "placed under a legal hold" if on else "released from its legal hold"
    return Alert(
        kind="legal_hold",
        run=run,
        step=step,
        summary=f"{run} step {step} save {save} {verb} by {who}",
        details=[f"Reason: {why}", f"Objects: {objects}"],
        next_step=(
            "Nothing to do unless this is unexpected: no policy expires a held save. To lift it, "
            f"`ckptvault release {run} --step {step} --save {save} --reason TEXT`."
            if on
            else "The tier policy may now expire this save once its retention ends. If the release was a mistake, "
            f"`ckptvault hold {run} --step {step} --save {save} --reason TEXT` again."
        ),
        severity="info" if on else "warning",
        flow_run_url=flow_run_url,
        reason=f"step={step},save={save},{'on' if on else 'off'},{why}",
    )


def lock_drift(run: str, step: int, save: int, problems: Sequence[str], flow_run_url: str | None = None) -> Alert:
    """A drilled save whose objects lost the Object Lock ckptvault set (ckptvault/objectlock/drift.py)."""
    return Alert(
        kind="lock_drift",
        run=run,
        step=step,
        summary=f"{run} step {step} save {save}: Object Lock weaker than ckptvault set on {len(problems)} object(s)",
        details=list(problems),
        next_step=(
            "The data restored intact, but it is no longer protected as recorded: someone with "
            "s3:BypassGovernanceRetention shortened or removed a lock, or cleared a legal hold. Find who in the "
            "bucket's access logs; re-apply with `ckptvault hold` or by raising the retention (aws s3api "
            "put-object-retention), and review who holds the bypass."
        ),
        severity="error",
        flow_run_url=flow_run_url,
        reason=f"step={step},save={save}," + ",".join(problems)[:500],
    )


def replicate_failed(
    replica: str, run: str, step: int | None, save: int | None, error: str, flow_run_url: str | None = None
) -> Alert:
    """A save the replicate flow did not copy to `replica` (it stays uncommitted there), or, with
    run ALL_RUNS and no step, a replica's whole pass that stopped (every retry of its task failed)."""
    whole = run == ALL_RUNS
    what = (
        f"Replicate to replica {replica} stopped"
        if whole
        else f"Copy of {run} step {step} save {save} to replica {replica} FAILED"
    )
    return Alert(
        kind="replicate_failed",
        run=run,
        step=step,
        summary=f"{what}: the replica does NOT hold {'the saves it had not reached' if whole else 'this save'}",
        details=[f"Error: {error}"],
        next_step=(
            "The primary's copy is untouched. If the error says the primary's bytes are not the manifest's, the "
            "primary's object is damaged: check it with `ckptvault restore` into scratch before anything else. "
            f"Otherwise fix the cause (replica reachable? its credentials profile? its bucket?) and run `ckptvault "
            f"replicate --replica {replica}`, or wait for the next hourly run: objects already copied are kept."
        ),
        severity="error",
        flow_run_url=flow_run_url,
        reason=f"replica={replica}" + ("" if whole else f",step={step},save={save}"),
    )


def scrub_problem(
    store: str, run: str, step: int, save: int, problems: Sequence[str], repaired: bool, flow_run_url: str | None = None
) -> Alert:
    """What a scrub left wrong with one save on one copy (`store`: "primary" or a replica's name), each
    of `problems` "path: why" (why it could not be repaired, when the scrub repaired)."""
    first = problems[0].split(":", 1)[0] if problems else "?"
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    return Alert(
        kind="scrub_problem",
        run=run,
        step=step,
        summary=f"Scrub: {store}'s copy of {run} step {step} save {save} is damaged: {first}{more}",
        details=list(problems),
        next_step=(
            (
                "The scrub could not repair this from another copy (the reason is above). Restore the save with "
                "`ckptvault restore` into scratch to see which copy still serves it, before that copy is needed."
            )
            if repaired
            else (
                f"Run `ckptvault scrub --replica {store} --repair`: it rewrites each object from a copy whose "
                "object checks out (never over a good one, never deleting). Until then a restore of this save "
                "falls back to another copy for these objects."
            )
        ),
        severity="error",
        flow_run_url=flow_run_url,
        reason=f"store={store},step={step},save={save}," + ",".join(p.split(":", 1)[0] for p in problems)[:400],
    )
