"""Alert kinds and their messages: pure data, no I/O.

Every message is written for a tired on-call engineer at 3 a.m.: what happened, to which run and step,
what to do next, and a link to the Prefect flow run when there is one. The builders below are the
only place where wording lives, so every caller (flows, hooks, the watch) says things the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ckptvault.errors import InvalidArgumentError

KINDS = (
    "ingest_failed",
    "validation_blocked",
    "validation_warned",
    "drill_failed",
    "drill_digest",
    "tier_applied",
    "evict_skipped",
    "restore_completed",
    "restore_failed",
    "run_stale",
    "run_recovered",
    "budget_exceeded",
    "flow_failed",
    "run_restarted",
    "catalog_unreadable",
)

Severity = Literal["info", "warning", "error"]
ALL_RUNS = "*"  # the run of an alert that is about the whole store, not one run

# Slack rejects a section over 3000 characters and a message over 50 blocks; a wall of detail
# is also useless at 3 a.m., so we cut early and say how much was cut.
MAX_DETAILS = 10
MAX_DETAIL_CHARS = 300

_ICON = {"info": ":information_source:", "warning": ":warning:", "error": ":rotating_light:"}


@dataclass(frozen=True)
class Alert:
    kind: str
    run: str
    step: int | None
    summary: str
    details: list[str]
    next_step: str
    severity: Severity
    flow_run_url: str | None = None
    reason: str = ""  # part of the dedup key: what makes two alerts of one kind and run different

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"unknown alert kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    def dedup_key(self) -> str:
        return f"{self.kind}|{self.run}|{self.reason}"

    def where(self) -> str:
        if self.run == ALL_RUNS:
            return "all runs"
        return f"run {self.run}" + (f", step {self.step}" if self.step is not None else "")

    def shown_details(self) -> list[str]:
        shown = [_clip(d, MAX_DETAIL_CHARS) for d in self.details[:MAX_DETAILS]]
        if len(self.details) > MAX_DETAILS:
            shown.append(f"... and {len(self.details) - MAX_DETAILS} more")
        return shown

    def text(self) -> str:
        lines = [f"[{self.severity.upper()}] {self.summary} ({self.where()})"]
        lines += [f"  - {d}" for d in self.shown_details()]
        lines.append(f"Next: {self.next_step}")
        if self.flow_run_url:
            lines.append(f"Flow run: {self.flow_run_url}")
        return "\n".join(lines)

    def blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [
            _section(f"{_ICON[self.severity]} *{escape(self.summary)}*"),
            {"type": "context", "elements": [_mrkdwn(self._context())]},
        ]
        if self.details:
            blocks.append(_section("\n".join(f"• {escape(d)}" for d in self.shown_details())))
        blocks.append(_section(f"*Next:* {escape(self.next_step)}"))
        return blocks

    def _context(self) -> str:
        parts = [f"`{escape(self.kind)}`", escape(self.where())]
        if self.flow_run_url:
            parts.append(f"<{self.flow_run_url}|Open the flow run>")
        return " · ".join(parts)


def escape(text: str) -> str:
    """Slack mrkdwn control characters; an error message with `<` must not become a broken link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": _clip(text, 3000)}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(text)}


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hours(seconds: float) -> str:
    h = seconds / 3600
    return f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} days"


def _ckpt(step: int | None, ts: float) -> str:
    return (f"step {step}, " if step is not None else "") + f"written {_utc(ts)}"


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


# --- builders, one per kind -------------------------------------------------------------------------


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


# keep the builder list next to KINDS so a new kind cannot be added without its wording
BUILDERS: dict[str, Callable[..., Alert]] = {
    "ingest_failed": ingest_failed,
    "validation_blocked": validation_blocked,
    "validation_warned": validation_warned,
    "drill_failed": drill_failed,
    "drill_digest": drill_digest,
    "tier_applied": tier_applied,
    "evict_skipped": evict_skipped,
    "restore_completed": restore_completed,
    "restore_failed": restore_failed,
    "run_stale": run_stale,
    "run_recovered": run_recovered,
    "budget_exceeded": budget_exceeded,
    "flow_failed": flow_failed,
    "run_restarted": run_restarted,
    "catalog_unreadable": catalog_unreadable,
}
assert tuple(BUILDERS) == KINDS
