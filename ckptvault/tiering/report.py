"""A tiering plan as text an operator reads before saying --apply: what moves, why, and the money."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ckptvault.catalog import CheckpointState
from ckptvault.humanize import size, usd
from ckptvault.store import LockStatus
from ckptvault.tiering.apply import Observation, Scheduled
from ckptvault.tiering.eviction import EvictionCheck
from ckptvault.tiering.milestone_lock import LockExtension
from ckptvault.tiering.policy import Action, Plan
from ckptvault.tiering.store_cost import StoreCosts

# files named per skipped checkpoint in the artifact; the flow's report and the catalog event have more
MAX_FILES_SHOWN = 10


@dataclass(frozen=True)
class RunDigest:
    """What an applied plan did to one run: for the tier-applied alert."""

    run: str
    moved: dict[str, int]  # tier (or "expire", "evict_local") -> checkpoints
    bytes: int
    saved_per_month: float
    scheduled: dict[str, int] = field(default_factory=dict)  # tier -> checkpoints left to the bucket lifecycle


def applied_by_run(
    plan: Plan,
    states: Sequence[CheckpointState],
    tier_of: Mapping[str, str],
    done: Sequence[Action] | None = None,
) -> list[RunDigest]:
    """`done`: the actions carried out (default: all of the plan's); a skipped eviction is not one."""
    size = {s.key: s.bytes for s in states}
    moved: dict[str, dict[str, int]] = {}
    later: dict[str, dict[str, int]] = {}
    nbytes: dict[str, int] = {}
    for a in plan.actions if done is None else done:
        if a.kind not in ("transition", "expire", "evict_local"):
            continue
        label = tier_of.get(a.to_class or "", a.to_class or "") if a.kind == "transition" else a.kind
        per_run = (later if a.by_lifecycle else moved).setdefault(a.run, {})
        per_run[label] = per_run.get(label, 0) + 1
        nbytes[a.run] = nbytes.get(a.run, 0) + size.get((a.run, a.step, a.save), 0)
    s = plan.summary
    return [
        RunDigest(
            r,
            moved.get(r, {}),
            nbytes[r],
            sum(s.monthly_before.get(r, {}).values()) - sum(s.monthly_after.get(r, {}).values()),
            later.get(r, {}),
        )
        for r in sorted(set(moved) | set(later))
    ]


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "date not recorded"
    return f"from {_day(ts)}" + (" (due: awaiting the lifecycle engine)" if ts <= now else "")


def render_markdown(plan: Plan, would_lock: Sequence[LockExtension] = ()) -> str:
    """The tier flow's plan artifact; a postponed expiry is a `keep` row whose reason says until when."""
    s = plan.summary
    lines = [
        "### Tiering plan",
        "",
        f"- monthly storage: {usd(s.total_before)} now, {usd(s.total_after)} after the plan "
        f"(saves {usd(s.monthly_saving)}/month)",
        f"- one-time fees (requests, early deletion): {usd(s.one_time_fees_usd)}",
        f"- against keeping it all on the parallel file system: {usd(s.hot_fs_monthly_usd)}/month "
        f"(saves {usd(s.saving_vs_hot_fs)}/month)",
        "",
        "| run | step | action | to | reason |",
        "|---|---|---|---|---|",
    ]
    if s.pending_monthly_saving:
        lines.insert(
            3,
            f"- of that saving, {usd(s.pending_monthly_saving)}/month comes from moves the bucket lifecycle "
            "has scheduled: billed in their old class until their dates (below)",
        )
    for a in plan.actions:
        lines.append(f"| {a.run} | {a.step} | {a.kind} | {a.to_class or ''} | {a.reason} |")
    if would_lock:
        lines += ["", "Milestone locks to extend (Object Lock; the apply raises each, the manifest last):", ""]
        lines += [f"- {x.would()}" for x in would_lock]
    if plan.pending:
        lines += [
            "",
            "Scheduled in the bucket lifecycle, not yet seen moved (each tier run looks):",
            "",
            "| run | step | save | class now | scheduled | takes effect |",
            "|---|---|---|---|---|---|",
        ]
        for m in plan.pending:
            lines.append(
                f"| {m.run} | {m.step} | {m.save} | {m.from_class} | {m.to_class} | {_when(m.takes_effect, plan.now)} |"
            )
    lines += ["", "| run | class | size | stored | $/month before | $/month after |", "|---|---|---|---|---|---|"]
    for r in cost_rows(plan):
        lines.append(
            f"| {r['run']} | {r['class']} | {size(r['bytes'])} | {_stored(r['bytes'], r['stored_bytes'])} "
            f"| {usd(r['usd_month_before'])} | {usd(r['usd_month_after'])} |"
        )
    if s.compression_monthly_saving:
        lines.append(f"\nCompression saves {usd(s.compression_monthly_saving)}/month now (included above).")
    return "\n".join(lines)


def bucket_lock_line(bucket: str, status: LockStatus) -> str:
    """`plan`'s line on the bucket's Object Lock configuration and its default retention."""
    if not status.known:
        return f"bucket {bucket}: Object Lock unknown (the server does not answer GetObjectLockConfiguration)"
    if not status.enabled:
        return f"bucket {bucket}: Object Lock off"
    if status.default_mode is None:
        return f"bucket {bucket}: Object Lock on, no default retention"
    period = f"{status.default_years} years" if status.default_years is not None else f"{status.default_days} days"
    return f"bucket {bucket}: Object Lock on, default retention {status.default_mode} {period}"


def bucket_lock_record(bucket: str, status: LockStatus) -> dict[str, Any]:
    """`plan --json`'s "bucket_lock"."""
    default = None
    if status.enabled and status.default_mode is not None:
        default = {"mode": status.default_mode, "days": status.default_days, "years": status.default_years}
    state = "unknown" if not status.known else "on" if status.enabled else "off"
    return {"bucket": bucket, "object_lock": state, "default_retention": default}


def render_text(
    plan: Plan,
    would_lock: Sequence[LockExtension] = (),
    bucket_lock: tuple[str, LockStatus] | None = None,
    stores: StoreCosts | None = None,
) -> str:
    """The plan an operator reads; `would_lock`: the milestone locks a dry run would raise
    (milestone_lock.would_extend); `bucket_lock`: (bucket, its configuration), for `plan`; `stores`: each
    store's classes and the replicas' egress (store_cost.store_costs; None without replicas)."""
    s = plan.summary
    out = [bucket_lock_line(*bucket_lock)] if bucket_lock is not None else []
    for a in plan.actions:
        if a.kind == "keep":
            continue
        to = f" -> {a.to_class}" if a.to_class else ""
        out.append(f"{a.kind:11} {a.run} step {a.step}{to}: {a.reason}")
    for m in plan.pending:
        out.append(
            f"{'scheduled':11} {m.run} step {m.step} save {m.save} {m.from_class} -> {m.to_class}: "
            f"by the bucket lifecycle, {_when(m.takes_effect, plan.now)}"
        )
    for p in plan.postponed:  # kept, so not among the lines above
        out.append(f"{'postponed':11} {p.run} step {p.step} save {p.save}: {p.why}")
    out += [w.line() for w in plan.waits]  # kept too, until the replica holds the save
    out += [x.would() for x in would_lock]
    kept = sum(1 for a in plan.actions if a.kind == "keep")
    out.append(f"({kept} checkpoints kept as they are)")
    out += ["", *cost_table(plan)]
    out.append(
        f"monthly: {usd(s.total_before)} -> {usd(s.total_after)}; one-time fees {usd(s.one_time_fees_usd)}; "
        f"vs parallel file system {usd(s.hot_fs_monthly_usd)}/month"
    )
    if stores is not None:
        out += ["", *stores.lines()]
    return "\n".join(out)


def cost_rows(plan: Plan) -> list[dict[str, Any]]:
    """Monthly cost per run and storage class, before and after the plan (`plan --json`'s "cost")."""
    s = plan.summary
    rows = []
    for run in sorted(set(s.monthly_before) | set(s.monthly_after)):
        before, after = s.monthly_before.get(run, {}), s.monthly_after.get(run, {})
        sizes = s.bytes_before.get(run, {})
        for cls in sorted(set(before) | set(after)):
            orig, stored = sizes.get(cls, (0, 0))
            rows.append(
                {
                    "run": run,
                    "class": cls,
                    "usd_month_before": before.get(cls, 0.0),
                    "usd_month_after": after.get(cls, 0.0),
                    "bytes": orig,  # of the checkpoints in the class now, as written
                    "stored_bytes": stored,  # and as stored (compressed: fewer)
                }
            )
    return rows


def cost_table(plan: Plan) -> list[str]:
    """The per run x class table and what the store saves against keeping it all on the parallel file system."""
    s = plan.summary
    rows = cost_rows(plan)
    header = ("RUN", "CLASS", "SIZE", "STORED", "$/MONTH NOW", "$/MONTH AFTER")
    cells = [
        (r["run"], r["class"], size(r["bytes"]), _stored(r["bytes"], r["stored_bytes"]),
         usd(r["usd_month_before"]), usd(r["usd_month_after"]))
        for r in rows
    ]  # fmt: skip
    orig, stored = sum(r["bytes"] for r in rows), sum(r["stored_bytes"] for r in rows)
    cells.append(("total", "", size(orig), _stored(orig, stored), usd(s.total_before), usd(s.total_after)))
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    lines = ["  ".join(c[i].rjust(w) if i >= 2 else c[i].ljust(w) for i, w in enumerate(widths)).rstrip()
             for c in [header, *cells]]  # fmt: skip
    lines.append(
        f"on the parallel file system instead: {usd(s.hot_fs_monthly_usd)}/month; "
        f"the store saves {usd(s.saving_vs_hot_fs)}/month after this plan"
    )
    if s.compression_monthly_saving:
        lines.append(f"compression saves {usd(s.compression_monthly_saving)}/month now (included above)")
    return lines


def _stored(original: int, stored: int) -> str:
    """The stored size, with its ratio to the original where compression changed it."""
    return size(stored) if stored == original or not original else f"{size(stored)} ({stored / original:.2f}x)"


def plan_record(
    plan: Plan,
    would_lock: Sequence[LockExtension] = (),
    bucket_lock: tuple[str, LockStatus] | None = None,
    stores: StoreCosts | None = None,
) -> dict[str, Any]:
    """`ckptvault plan --json`: every action, the pending lifecycle moves, the expiries a lock
    postpones, the milestone locks it would raise, the moves waiting for a replica, the cost table, (given)
    the bucket's lock and (with replicas) each store's classes and the replicas' egress."""
    s = plan.summary
    doc = {
        "actions": [
            {
                "run": a.run,
                "step": a.step,
                "save": a.save,
                "kind": a.kind,
                "to_class": a.to_class,
                "reason": a.reason,
                "saving_usd": a.saving_usd,
                "fee_usd": a.fee_usd,
            }
            for a in plan.actions
        ],
        "pending": [
            {
                "run": m.run,
                "step": m.step,
                "save": m.save,
                "from_class": m.from_class,
                "to_class": m.to_class,
                "takes_effect": m.takes_effect,
            }
            for m in plan.pending
        ],
        "cost": cost_rows(plan),
        "usd_month_before": s.total_before,
        "usd_month_after": s.total_after,
        "one_time_fees_usd": s.one_time_fees_usd,
        "hot_fs_usd_month": s.hot_fs_monthly_usd,
        "saving_vs_hot_fs_usd_month": s.saving_vs_hot_fs,
        "compression_saving_usd_month": s.compression_monthly_saving,
        "expire_postponed": [p.as_dict() for p in plan.postponed],
        "lock_extended": [x.as_dict() for x in would_lock],
        "waits_for_replica": [w.as_dict() for w in plan.waits],
    }
    if bucket_lock is not None:
        doc["bucket_lock"] = bucket_lock_record(*bucket_lock)
    if stores is not None:
        doc.update(stores.as_dict())
    return doc


def skipped_record(c: EvictionCheck) -> dict[str, Any]:
    """A skipped eviction as the tier flow's report lists it."""
    return {
        "run": c.run,
        "step": c.step,
        "save": c.save,
        "path": c.root,
        "reason": c.reason,
        "local": [str(m) for m in c.local],
        "store": [str(m) for m in c.store],
    }


def scheduled_record(x: Scheduled) -> dict[str, Any]:
    """A transition left to the bucket lifecycle, as the tier flow's report lists it."""
    return {
        "run": x.run,
        "step": x.step,
        "save": x.save,
        "to_class": x.to_class,
        "rule": x.rule,
        "takes_effect": x.takes_effect,
        "objects": x.objects,
    }


def observed_record(o: Observation) -> dict[str, Any]:
    """A scheduled transition the listing showed done, as the tier flow's report lists it."""
    return {"run": o.run, "step": o.step, "save": o.save, "storage_class": o.scheduled_class, "objects": o.classes}


def render_applied(
    skipped: Sequence[EvictionCheck], scheduled: Sequence[Scheduled] = (), observed: Sequence[Observation] = ()
) -> str:
    """What an apply did beyond the plan's table: the moves it left to the bucket lifecycle (with the
    date each takes effect), the scheduled moves it saw done, and the evictions the re-check stopped."""
    lines = ["### Tiering applied", ""]
    if observed:
        lines += [
            f"{len(observed)} scheduled transitions were seen done by the bucket lifecycle and recorded:",
            "",
            "| run | step | save | now in | data objects per class |",
            "|---|---|---|---|---|",
        ]
        for o in observed:
            counts = ", ".join(f"{c}: {n}" for c, n in sorted(o.classes.items()))
            lines.append(f"| {o.run} | {o.step} | {o.save} | {o.scheduled_class} | {counts} |")
        lines.append("")
    if scheduled:
        lines += [
            f"{len(scheduled)} transitions were left to the bucket lifecycle: tagged now, recorded as scheduled; "
            "the catalog keeps their current class until a tier run sees them moved.",
            "",
            "| run | step | save | to | rule | takes effect |",
            "|---|---|---|---|---|---|",
        ]
        for x in scheduled:
            lines.append(f"| {x.run} | {x.step} | {x.save} | {x.to_class} | {x.rule} | {_day(x.takes_effect)} |")
        lines.append("")
    if not skipped:
        return "\n".join([*lines, "No action of the plan was skipped."])
    lines += [
        f"{len(skipped)} local copies were NOT evicted: re-checked before deleting, they or the store no "
        "longer match the manifest. Nothing of theirs was deleted.",
        "",
        "| run | step | save | local copy | why | files |",
        "|---|---|---|---|---|---|",
    ]
    for c in skipped:
        files = [*(f"store {m}" for m in c.store), *(f"local {m}" for m in c.local)]
        shown = "; ".join(files[:MAX_FILES_SHOWN]) + (
            f"; ... {len(files) - MAX_FILES_SHOWN} more" if len(files) > MAX_FILES_SHOWN else ""
        )
        lines.append(f"| {c.run} | {c.step} | {c.save} | {c.root} | {c.reason} | {_cell(shown)} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
