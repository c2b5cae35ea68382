"""What each kind of alert says, as one table: for every kind the facts it is built from and, from them,
its summary, details, next step, severity and dedup reason. `kinds.build` is the one builder that
reads it; see ckptvault/alerts/alert.py for whom the wording is written.

A text is a `str.format` template over the kind's facts (with `run` and `step` among them) or, where
the words depend on the facts beyond filling them in, a small formatter of them; `derive` works out
the facts several texts share (a count, a duration in words). A fact's value is never read as a
template: an error message with braces in it is printed as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

Severity = Literal["info", "warning", "error"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "error")
ALL_RUNS = "*"  # the run of an alert that is about the whole store, not one run

Facts = Mapping[str, Any]
Text = str | Callable[[Facts], str]


@dataclass(frozen=True)
class Kind:
    """One kind of alert. `takes`: the facts a caller must give; `optional`: those it may, with their
    defaults. `run` and `step` are facts like the others: a kind that takes no `run` is about all runs,
    one that takes no `step` about no single step."""

    takes: tuple[str, ...]
    severity: Text
    summary: Text
    details: tuple[str, ...] | Callable[[Facts], list[str]]  # one template per line, or a formatter of all
    next_step: Text
    reason: Text  # what makes two alerts of one kind and run different (the dedup key's last part)
    optional: Mapping[str, Any] = field(default_factory=dict)
    derive: Callable[[Facts], Facts] | None = None


def render(text: Text, facts: Facts) -> str:
    return text(facts) if callable(text) else text.format_map(facts)


def _either(flag: str, yes: str, no: str) -> Callable[[Facts], str]:
    """The template `yes` when the fact `flag` is true, else `no`."""
    return lambda f: (yes if f[flag] else no).format_map(f)


def _each(name: str) -> Callable[[Facts], list[str]]:
    """The details: the fact `name`, a list of lines, as given."""
    return lambda f: list(f[name])


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hours(seconds: float) -> str:
    h = seconds / 3600
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def _ckpt(step: int | None, ts: float) -> str:
    return (f"step {step}, " if step is not None else "") + f"written {_utc(ts)}"


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def _tier_counts(f: Facts) -> Facts:
    later = dict(f["scheduled"] or {})
    n, k = sum(f["moved"].values()), sum(later.values())
    what = f"{n} checkpoints moved" + (f", {k} scheduled to move by the bucket lifecycle" if k else "")
    return {"later": later, "n": n, "k": k, "what": what, "gb": _gb(f["bytes_moved"])}


def _oldest_late(f: Facts) -> Facts:
    run, step, save, at = f["late"][0]  # `late` is oldest first and never empty
    oldest = {"oldest": f"{run} step {step} save {save}", "key": f"{run}/{step}/{save}"}
    return {"count": len(f["late"]), **oldest, "gap": _hours(f["now"] - at)}


def _scrub_first(f: Facts) -> Facts:
    problems = f["problems"]
    return {
        "first": problems[0].split(":", 1)[0] if problems else "?",
        "more": f" and {len(problems) - 1} more" if len(problems) > 1 else "",
    }


_PER_STEP = ("run", "step")

TABLE: dict[str, Kind] = {
    # --- the lifecycle stages: ingest, validation, drills, tiering, eviction, restore -------------------
    "ingest_failed": Kind(
        takes=(*_PER_STEP, "error", "attempts"),
        severity="error",
        summary="Upload of {run} step {step} failed after {attempts} attempts; it is NOT in the store",
        details=("Last error: {error}",),
        next_step=(
            "The local checkpoint is untouched; do not delete it. Fix the cause above (store reachable? "
            "credentials? disk?), then run `ckptvault ingest` again: files already uploaded are skipped."
        ),
        reason="step={step}",
    ),
    "validation_blocked": Kind(
        takes=(*_PER_STEP, "problems"),
        severity="error",
        summary="Checkpoint {run} step {step} was quarantined: validation blocked it",
        details=_each("problems"),
        next_step=(
            "Look at the training job first: the failed checks above often mean a crash mid-save or a "
            "diverging loss. If the checkpoint is fine, relax that rule in [validation] and run "
            "`ckptvault ingest` again."
        ),
        reason="step={step}",
    ),
    "validation_warned": Kind(
        takes=(*_PER_STEP, "problems"),
        severity="warning",
        summary="Checkpoint {run} step {step} was uploaded with validation warnings",
        details=_each("problems"),
        next_step="No action needed tonight. Check the warnings above against the training job tomorrow.",
        reason="step={step}",
    ),
    "drill_failed": Kind(
        takes=(*_PER_STEP, "problems"),
        severity="error",
        summary="Restore drill FAILED for {run} step {step}: the stored copy could not be restored intact",
        details=_each("problems"),
        next_step=(
            "Treat this stored checkpoint as unusable. Keep the local copy if it still exists, and "
            "run `ckptvault drill` again to tell a one-off from a damaged object before re-uploading."
        ),
        reason="step={step}",
    ),
    # the resume check broke (ckptvault/restore/verify.py): not a verdict on the save, which is not marked
    "drill_verify_error": Kind(
        takes=(*_PER_STEP, "save", "problems"),
        severity="error",
        summary="Restore drill of {run} step {step}: the resume check broke, so the save was not judged",
        details=_each("problems"),
        next_step=(
            "The save restored and loaded, and is NOT marked suspect: fix the verify command (its output is in "
            "the drill report), then try it with `ckptvault drill --verify-only {run} --step {step}`."
        ),
        reason="step={step},save={save}",
    ),
    # `drill --python PATH`: passed with this environment, failed (or broke) with the other interpreter
    "drill_format_rot": Kind(
        takes=(*_PER_STEP, "save", "problems", "python"),
        severity="error",
        summary="Restore drill of {run} step {step}: it loads here but NOT with {python} (format rot)",
        details=_each("problems"),
        next_step=(
            "The save is sound and is NOT marked suspect: the environment of {python} cannot load or resume "
            "it. Fix that environment (or convert the checkpoint) before upgrading; `ckptvault drill "
            "--verify-only {run} --step {step} --python {python}` tries it again."
        ),
        reason="step={step},save={save},python={python}",
    ),
    # `passed` and `failed`: (run, step) of each drilled checkpoint
    "drill_digest": Kind(
        takes=("passed", "failed"),
        derive=lambda f: {
            "n_passed": len(f["passed"]),
            "total": len(f["passed"]) + len(f["failed"]),
            "tail": f", {len(f['failed'])} FAILED" if f["failed"] else "",
        },
        severity=lambda f: "warning" if f["failed"] else "info",
        summary="Restore drills: {n_passed} of {total} passed{tail}",
        details=lambda f: (
            [f"FAILED: {r} step {s}" for r, s in f["failed"]] + [f"ok: {r} step {s}" for r, s in f["passed"]]
        ),
        next_step=_either(
            "failed",
            "Each failure was alerted on its own: start there.",
            "Nothing to do: every sampled checkpoint restored and matched its checksums.",
        ),
        reason=lambda f: "failed" if f["failed"] else "passed",
    ),
    # `moved`: checkpoints moved per target tier, e.g. {"cold": 3, "expired": 1}; `scheduled`: per tier,
    # those left to the bucket lifecycle (tagged, moved from the rule's date)
    "tier_applied": Kind(
        takes=("run", "moved", "bytes_moved", "saved_usd_per_month"),
        optional={"scheduled": None},
        derive=_tier_counts,
        severity="info",
        summary="Tier plan applied to {run}: {what} ({gb}), saving ${saved_usd_per_month:,.2f}/month",
        details=lambda f: (
            [f"{tier}: {count}" for tier, count in sorted(f["moved"].items())]
            + [f"{tier}: {count} (scheduled)" for tier, count in sorted(f["later"].items())]
        ),
        next_step="Nothing to do. Restoring from cold or archive tiers takes longer; plan restores ahead.",
        reason=lambda f: f"n={f['n']},bytes={f['bytes_moved']}" + (f",scheduled={f['k']}" if f["k"] else ""),
    ),
    # The tier run did not delete a local copy: re-checked before deleting, it (`local`) or the stored copy
    # (`store`) no longer matched the manifest. Each item names a file and what differs.
    "evict_skipped": Kind(
        takes=(*_PER_STEP, "save", "local", "store"),
        derive=lambda f: {
            "broken_store": bool(f["store"]),
            "why": "the stored copy is incomplete or changed" if f["store"] else "the local files changed after upload",
        },
        severity=_either("broken_store", "error", "warning"),
        summary="Local copy of {run} step {step} save {save} was NOT evicted: {why}",
        details=lambda f: [f"store: {m}" for m in f["store"]] + [f"local: {m}" for m in f["local"]],
        next_step=_either(
            "broken_store",
            "Keep the local copy: it may now be the only intact one. Find out who deleted or overwrote the "
            "objects above behind ckptvault (versioning, another tool); `ckptvault restore {run} --step "
            "{step} --save {save} --dest /scratch/check` shows whether the stored copy still restores. "
            "Every tier run checks again and evicts nothing until the store holds it all.",
            "Nothing was deleted. Check what rewrote these files (a restarted job saving this step again?); "
            "the next `ckptvault ingest` uploads a rewritten step as a new save, and this save's local copy "
            "is then no longer its to evict. Every tier run checks again; nothing is lost meanwhile.",
        ),
        reason=lambda f: f"step={f['step']},save={f['save']},{'store' if f['broken_store'] else 'local'}",
    ),
    "restore_completed": Kind(
        takes=(*_PER_STEP, "destination", "seconds"),
        severity="info",
        summary="Restore of {run} step {step} finished in {seconds:,.0f} s; checksums verified",
        details=("Restored to: {destination}",),
        next_step="Resume training from the path above.",
        reason="step={step},to={destination}",
    ),
    "restore_failed": Kind(
        takes=(*_PER_STEP, "error"),
        severity="error",
        summary="Restore of {run} step {step} FAILED",
        details=("Error: {error}",),
        next_step=(
            "If the error says the object is archived, the thaw is still running: rerun the same "
            "`ckptvault restore` later. Otherwise restore an earlier step (`ckptvault ls --run {run}`)."
        ),
        reason="step={step}",
    ),
    # --- the health of runs and of the store -------------------------------------------------------------
    # `newest_at`, `now`: epoch seconds; `step`, the newest checkpoint's where known
    "run_stale": Kind(
        takes=("run", "newest_at", "stale_after_hours", "now"),
        optional={"step": None},
        derive=lambda f: {"gap": _hours(f["now"] - f["newest_at"]), "newest": _ckpt(f["step"], f["newest_at"])},
        severity="warning",
        summary="Run {run} has written no checkpoint for {gap}",
        details=(
            "Newest checkpoint: {newest}",
            "Expected at least one every {stale_after_hours:g} h (sources.stale_after_hours)",
        ),
        next_step=(
            "Check the training job: is it alive, hung, or out of disk? If the run ended on purpose, "
            "remove stale_after_hours for it. You get one alert per episode and one when it recovers."
        ),
        reason="since={newest_at:.3f}",  # one episode = one newest checkpoint; a later episode is a different alert
    ),
    "run_recovered": Kind(
        takes=("run", "stale_since", "newest_at"),
        optional={"step": None},
        derive=lambda f: {"gap": _hours(f["newest_at"] - f["stale_since"]), "newest": _ckpt(f["step"], f["newest_at"])},
        severity="info",
        summary="Run {run} is checkpointing again after a gap of {gap}",
        details=("New checkpoint: {newest}",),
        next_step="Nothing to do; the earlier stale alert is resolved.",
        reason="since={stale_since:.3f}",
    ),
    "budget_exceeded": Kind(
        takes=("monthly_usd", "budget"),
        optional={"run": ALL_RUNS},
        derive=lambda f: {
            "over": f["monthly_usd"] - f["budget"],
            "percent": (f["monthly_usd"] / f["budget"] - 1) * 100,
        },
        severity="warning",
        summary="Storage spend ${monthly_usd:,.2f}/month is over the budget of ${budget:,.2f}/month",
        details=("Over by ${over:,.2f} ({percent:.0f}%)",),
        next_step=(
            "Not urgent at night. Review the tier plan: lower policy.keep_hot, tier sooner, or set "
            "expire_after_days; or raise notify.budget_usd_per_month if the spend is expected."
        ),
        reason="budget={budget:g}",
    ),
    # From a Prefect on_failure/on_crashed hook (or direct mode); `state` is the state name (Failed,
    # Crashed). A flow about one checkpoint (restore) names its run and step.
    "flow_failed": Kind(
        takes=("flow", "state", "message"),
        optional={"run": ALL_RUNS, "step": None},
        severity="error",
        summary=lambda f: (
            f"Flow {f['flow']} ended {f['state']}"
            + (f" for {f['run']} step {f['step']}" if f["step"] is not None else "")
        ),
        details=lambda f: [f["message"]] if f["message"] else [],
        next_step="Open the flow run for the traceback. Flows are safe to re-run: finished work is skipped.",
        # a different error in the same flow is news; the same one again within the window is not
        reason=lambda f: f"{f['flow']}:{f['state']}:{f['message'].splitlines()[0][:120] if f['message'] else ''}",
    ),
    # A training job went back and saved steps again (from `step`, None where unknown): the old saves are
    # kept, never `latest` again
    "run_restarted": Kind(
        takes=(*_PER_STEP, "resaved"),
        derive=lambda f: {"where": f"step {f['step']}" if f["step"] is not None else "an earlier step"},
        severity="warning",
        summary="Run {run} restarted from {where}; steps were saved again. The old saves are kept as superseded",
        details=_each("resaved"),
        next_step=(
            "Nothing to do if the job was restarted on purpose: `restore --step latest` now means the new "
            "branch. The old saves stay restorable: `ckptvault ls --run {run} --state superseded`, then "
            "`ckptvault restore RUN --step N --save K`."
        ),
        reason=lambda f: "resaved=" + ",".join(f["resaved"]),
    ),
    # Catalog objects no reader could read (`objects`: key -> why; `run`: the partition's run, ALL_RUNS
    # for the flat layout): every command skipped them, so what they held is missing from `ls` until
    # someone looks
    "catalog_unreadable": Kind(
        takes=("run", "objects"),
        derive=lambda f: {"keys": sorted(f["objects"])},
        severity="warning",
        summary=lambda f: f"{len(f['keys'])} catalog object(s) cannot be read; commands skip them",
        details=lambda f: [
            f["objects"][k] if f["objects"][k].startswith(k) else f"{k}: {f['objects'][k]}" for k in f["keys"]
        ],
        next_step=(
            "Nothing is lost from the checkpoints: their manifests are the source of truth, and a restore of this "
            "run reads them. The next compaction moves these objects to _catalog/unreadable/ (never deletes them); "
            "then `ckptvault catalog rebuild` shows what the manifests say, `--write` appends it."
        ),
        reason=lambda f: ",".join(f["keys"]),
    ),
    # `ckptvault hold` / `release`: a legal hold set (`on`) or cleared on every object of a save, by whom
    # and why. A release is a warning: from then on only the save's retention (if any) protects it.
    "legal_hold": Kind(
        takes=(*_PER_STEP, "save", "on", "who", "why", "objects"),
        derive=lambda f: {"verb": "placed under a legal hold" if f["on"] else "released from its legal hold"},
        severity=_either("on", "info", "warning"),
        summary="{run} step {step} save {save} {verb} by {who}",
        details=("Reason: {why}", "Objects: {objects}"),
        next_step=_either(
            "on",
            "Nothing to do unless this is unexpected: no policy expires a held save. To lift it, "
            "`ckptvault release {run} --step {step} --save {save} --reason TEXT`.",
            "The tier policy may now expire this save once its retention ends. If the release was a mistake, "
            "`ckptvault hold {run} --step {step} --save {save} --reason TEXT` again.",
        ),
        reason=lambda f: f"step={f['step']},save={f['save']},{'on' if f['on'] else 'off'},{f['why']}",
    ),
    # A drilled save whose objects lost the Object Lock ckptvault set (ckptvault/objectlock/drift.py)
    "lock_drift": Kind(
        takes=(*_PER_STEP, "save", "problems"),
        derive=lambda f: {"count": len(f["problems"])},
        severity="error",
        summary="{run} step {step} save {save}: Object Lock weaker than ckptvault set on {count} object(s)",
        details=_each("problems"),
        next_step=(
            "The data restored intact, but it is no longer protected as recorded: someone with "
            "s3:BypassGovernanceRetention shortened or removed a lock, or cleared a legal hold. Find who in the "
            "bucket's access logs; re-apply with `ckptvault hold` or by raising the retention (aws s3api "
            "put-object-retention), and review who holds the bypass."
        ),
        reason=lambda f: f"step={f['step']},save={f['save']}," + ",".join(f["problems"])[:500],
    ),
    # A save the replicate flow did not copy to `replica` (it stays uncommitted there), or, with run
    # ALL_RUNS and no step, a replica's whole pass that stopped (every retry of its task failed)
    "replicate_failed": Kind(
        takes=("replica", *_PER_STEP, "save", "error"),
        derive=lambda f: {"whole": f["run"] == ALL_RUNS},
        severity="error",
        summary=_either(
            "whole",
            "Replicate to replica {replica} stopped: the replica does NOT hold the saves it had not reached",
            "Copy of {run} step {step} save {save} to replica {replica} FAILED: the replica does NOT hold this save",
        ),
        details=("Error: {error}",),
        next_step=(
            "The primary's copy is untouched. If the error says the primary's bytes are not the manifest's, the "
            "primary's object is damaged: check it with `ckptvault restore` into scratch before anything else. "
            "Otherwise fix the cause (replica reachable? its credentials profile? its bucket?) and run `ckptvault "
            "replicate --replica {replica}`, or wait for the next hourly run: objects already copied are kept."
        ),
        reason=_either("whole", "replica={replica}", "replica={replica},step={step},save={save}"),
    ),
    # Saves a replica should hold, committed on the primary more than `max_lag_hours` ago and not copied
    # there: `late` is (run, step, save, committed_at) per save, oldest first (not empty). One alert per
    # replica and oldest late save: it is news again only once that save is copied and another is late.
    "replica_lagging": Kind(
        takes=("replica", "late", "max_lag_hours", "now"),
        derive=_oldest_late,
        severity="warning",
        summary=(
            "Replica {replica} is behind: {count} save(s) committed more than {max_lag_hours:g} h ago are not "
            "copied there; the oldest, {oldest}, for {gap}"
        ),
        details=lambda f: [f"{r} step {n} save {k}: committed {_utc(t)}" for r, n, k, t in f["late"]],
        next_step=(
            "Run `ckptvault replicate --replica {replica}` and read what it says failed (an unreachable endpoint, "
            "refused credentials, an object frozen on the primary). Until they are copied, `tier` neither expires "
            "these saves nor moves them into an archival class ([[replicas]] max_lag_hours sets this alert)."
        ),
        reason="replica={replica};oldest={key}",  # the lag episode is its oldest late save: not repeated while it waits
    ),
    # What a scrub left wrong with one save on one copy (`store`: "primary" or a replica's name), each of
    # `problems` "path: why" (why it could not be repaired, when the scrub `repaired`)
    "scrub_problem": Kind(
        takes=("store", *_PER_STEP, "save", "problems", "repaired"),
        derive=_scrub_first,
        severity="error",
        summary="Scrub: {store}'s copy of {run} step {step} save {save} is damaged: {first}{more}",
        details=_each("problems"),
        next_step=_either(
            "repaired",
            "The scrub could not repair this from another copy (the reason is above). Restore the save with "
            "`ckptvault restore` into scratch to see which copy still serves it, before that copy is needed.",
            "Run `ckptvault scrub --replica {store} --repair`: it rewrites each object from a copy whose "
            "object checks out (never over a good one, never deleting). Until then a restore of this save "
            "falls back to another copy for these objects.",
        ),
        reason=lambda f: (
            f"store={f['store']},step={f['step']},save={f['save']},"
            + ",".join(p.split(":", 1)[0] for p in f["problems"])[:400]
        ),
    ),
    # A committed save whose object or manifest was deleted or overwritten after its commit, found by a
    # scrub's tamper check (ckptvault/history/tamper.py) on copy `store`: `keys` one "key: what at when"
    # each, `since` the moment just before the earliest of them, `committed` when the save was committed
    "tamper": Kind(
        takes=("store", *_PER_STEP, "save", "keys", "since", "committed"),
        derive=lambda f: {"count": len(f["keys"]), "primary": f["store"] == "primary"},
        severity="error",
        summary=(
            "TAMPERED: {store}'s copy of {run} step {step} save {save}: {count} object(s) deleted or overwritten "
            "since its commit on {committed}"
        ),
        details=_each("keys"),
        next_step=_either(
            "primary",
            "Someone with the bucket's credentials changed an archived save; the versions its commit wrote are "
            'still in the bucket. Follow docs/runbook.md, "The bucket was attacked": revoke the key and pause '
            "the writers, then `ckptvault recover --since {since}` shows the undo (nothing changed) and "
            "`--apply` carries it out; meanwhile `ckptvault restore {run} --step {step} --save {save} --as-of "
            "{since}` reads the save as it was committed.",
            "Someone with replica {store}'s credentials changed its copy; the versions the copy's commit wrote are "
            "still in its bucket. Revoke that key, then `ckptvault scrub --replica {store} --repair` rewrites "
            "each object from a copy that matches the save's first committed manifest (never the tampered one).",
        ),
        reason=lambda f: (
            f"store={f['store']},step={f['step']},save={f['save']},"
            + ",".join(k.split(": ", 1)[0] for k in f["keys"])[:400]
        ),
    ),
}
KINDS = tuple(TABLE)
