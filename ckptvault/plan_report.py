"""A tiering plan as text an operator reads before saying --apply: what moves, why, and the money."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptvault.catalog import CheckpointState
from ckptvault.policy import Action, Plan
from ckptvault.tiering import EvictionCheck

# files named per skipped checkpoint in the artifact; the flow's report and the catalog event have more
MAX_FILES_SHOWN = 10


@dataclass(frozen=True)
class RunDigest:
    """What an applied plan did to one run: for the tier-applied alert."""

    run: str
    moved: dict[str, int]  # tier (or "expire", "evict_local") -> checkpoints
    bytes: int
    saved_per_month: float


def applied_by_run(
    plan: Plan,
    states: Sequence[CheckpointState],
    tier_of: Mapping[str, str],
    done: Sequence[Action] | None = None,
) -> list[RunDigest]:
    """`done`: the actions carried out (default: all of the plan's); a skipped eviction is not one."""
    size = {s.key: s.bytes for s in states}
    moved: dict[str, dict[str, int]] = {}
    nbytes: dict[str, int] = {}
    for a in plan.actions if done is None else done:
        if a.kind not in ("transition", "expire", "evict_local"):
            continue
        label = tier_of.get(a.to_class or "", a.to_class or "") if a.kind == "transition" else a.kind
        per_run = moved.setdefault(a.run, {})
        per_run[label] = per_run.get(label, 0) + 1
        nbytes[a.run] = nbytes.get(a.run, 0) + size.get((a.run, a.step, a.save), 0)
    s = plan.summary
    return [
        RunDigest(r, m, nbytes[r], sum(s.monthly_before.get(r, {}).values()) - sum(s.monthly_after.get(r, {}).values()))
        for r, m in sorted(moved.items())
    ]


def _usd(x: float) -> str:
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.4f}"


def render_markdown(plan: Plan) -> str:
    s = plan.summary
    lines = [
        "### Tiering plan",
        "",
        f"- monthly storage: {_usd(s.total_before)} now, {_usd(s.total_after)} after the plan "
        f"(saves {_usd(s.monthly_saving)}/month)",
        f"- one-time fees (requests, early deletion): {_usd(s.one_time_fees_usd)}",
        f"- against keeping it all on the parallel file system: {_usd(s.hot_fs_monthly_usd)}/month "
        f"(saves {_usd(s.saving_vs_hot_fs)}/month)",
        "",
        "| run | step | action | to | reason |",
        "|---|---|---|---|---|",
    ]
    for a in plan.actions:
        lines.append(f"| {a.run} | {a.step} | {a.kind} | {a.to_class or ''} | {a.reason} |")
    lines += ["", "| run | class | $/month before | $/month after |", "|---|---|---|---|"]
    for run in sorted(set(s.monthly_before) | set(s.monthly_after)):
        before, after = s.monthly_before.get(run, {}), s.monthly_after.get(run, {})
        for cls in sorted(set(before) | set(after)):
            lines.append(f"| {run} | {cls} | {_usd(before.get(cls, 0.0))} | {_usd(after.get(cls, 0.0))} |")
    return "\n".join(lines)


def render_text(plan: Plan) -> str:
    s = plan.summary
    out = []
    for a in plan.actions:
        if a.kind == "keep":
            continue
        to = f" -> {a.to_class}" if a.to_class else ""
        out.append(f"{a.kind:11} {a.run} step {a.step}{to}: {a.reason}")
    kept = sum(1 for a in plan.actions if a.kind == "keep")
    out.append(f"({kept} checkpoints kept as they are)")
    out.append(
        f"monthly: {_usd(s.total_before)} -> {_usd(s.total_after)}; one-time fees {_usd(s.one_time_fees_usd)}; "
        f"vs parallel file system {_usd(s.hot_fs_monthly_usd)}/month"
    )
    return "\n".join(out)


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


def render_applied(skipped: Sequence[EvictionCheck]) -> str:
    """What an apply left undone and why: the checkpoints whose eviction the re-check stopped."""
    lines = ["### Tiering applied", ""]
    if not skipped:
        return "\n".join([*lines, "Every action of the plan was carried out."])
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
