"""Judging: what the evaluation said about each rule of a `GatePlan`, turned into the results of a
`ValidationReport`, with the configured severities and messages that name the checkpoint, the rule,
the observed value and the threshold. Pure: quality.py asks Great Expectations, this decides."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ckptvault import humanize
from ckptvault.ingest.gates import (
    INTERVAL,
    LOSS_FINITE,
    LOSS_JUMP,
    LOSS_KEYS,
    MISSING_RANK,
    SHAPE,
    SIZE_BAND,
    STEP_ORDER,
    GatePlan,
    RuleResult,
    ValidationReport,
)


@dataclass(frozen=True)
class RuleOutcome:
    """What the evaluation said about one rule: did every check of it hold, and which items failed
    (shard paths, loss keys) for the message."""

    ok: bool
    failed_items: tuple[str, ...] = ()


def judge(plan: GatePlan, outcomes: Mapping[str, RuleOutcome]) -> ValidationReport:
    """Turn per-rule outcomes into results with the configured severities and messages naming the
    checkpoint, the rule, the observed value and the threshold. A rule missing from `outcomes` is an
    evaluation bug and raises."""
    c = plan.candidate
    who = f"{c.run} step {c.step}"
    nhist = len(plan.history_steps)
    results = [
        _size(plan, outcomes[SIZE_BAND], who, nhist),
        *_shape(plan, outcomes[SHAPE], outcomes[MISSING_RANK], who),
        _step(plan, outcomes[STEP_ORDER], who),
        *_loss(plan, outcomes[LOSS_FINITE], outcomes[LOSS_JUMP], who),
        _interval(plan, outcomes[INTERVAL], who),
    ]
    return ValidationReport(run=c.run, step=c.step, results=tuple(results))


def _no_history(rule: str, observed: str, who: str, have: int, need: int, what: str) -> RuleResult:
    return RuleResult(
        rule, "note", observed, f"needs {need} verified checkpoints of history",
        f"{who}: no history yet for {rule} ({have} of {need} {what}); passed without comparison",
    )  # fmt: skip


def _size(plan: GatePlan, out: RuleOutcome, who: str, nhist: int) -> RuleResult:
    c, rules = plan.candidate, plan.rules
    observed = f"{c.total_bytes} B ({humanize.size(c.total_bytes)})"
    if plan.size_median is None or plan.size_min is None or plan.size_max is None:
        return _no_history(SIZE_BAND, observed, who, nhist, rules.min_history, "verified checkpoints")
    band = f"{rules.size_band:.0%}"
    threshold = (
        f"{humanize.size(plan.size_min)} to {humanize.size(plan.size_max)} (median {humanize.size(plan.size_median)} "
        f"of the last {nhist} verified ±{band})"
    )
    if out.ok:
        return RuleResult(SIZE_BAND, "pass", observed, threshold, f"{who}: total size within ±{band} of the median")
    off = c.total_bytes / plan.size_median - 1
    msg = (
        f"{who}: rule {SIZE_BAND}: total size {humanize.size(c.total_bytes)} is {off:+.0%} from the median "
        f"{humanize.size(plan.size_median)} of the last {nhist} verified checkpoints, outside ±{band} "
        f"({humanize.size(plan.size_min)} to {humanize.size(plan.size_max)})"
    )
    return RuleResult(SIZE_BAND, plan.rules.size_severity, observed, threshold, msg)


def _list(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _shape(plan: GatePlan, shape: RuleOutcome, missing: RuleOutcome, who: str) -> list[RuleResult]:
    c, rules = plan.candidate, plan.rules
    n_cur = sum(1 for r in plan.shards if r.in_current)
    tol = f"±{rules.shard_size_tolerance:.0%}"

    # missing ranks
    m_obs = f"{n_cur} shards present" + (f"; missing: {_list(missing.failed_items)}" if not missing.ok else "")
    if plan.previous_step is None:
        m_thr = "no gap in the ranks/shard indices of this checkpoint"
    else:
        m_thr = f"every shard of step {plan.previous_step} present, no gap in ranks"
    if not missing.ok:
        was_there = {r.path for r in plan.shards if r.in_previous}
        lost = [p for p in missing.failed_items if p in was_there]
        gaps = [p for p in missing.failed_items if p not in was_there]
        parts = []
        if lost:
            parts.append(f"{len(lost)} shard(s) of step {plan.previous_step} absent: {_list(lost)}")
        if gaps:
            parts.append(f"{len(gaps)} shard(s) implied by the shard numbering absent: {_list(gaps)}")
        m_msg = f"{who}: rule {MISSING_RANK}: a rank did not write its shard: " + "; ".join(parts)
        m_res = RuleResult(MISSING_RANK, rules.missing_rank_severity, m_obs, m_thr, m_msg)
    elif plan.previous_step is None:
        m_res = RuleResult(
            MISSING_RANK, "note", m_obs, m_thr,
            f"{who}: no previous verified checkpoint to compare ranks with; its own shard numbering has no gap",
        )  # fmt: skip
    else:
        m_res = RuleResult(
            MISSING_RANK, "pass", m_obs, m_thr, f"{who}: every shard of step {plan.previous_step} present"
        )

    # file count and per-shard size pattern
    left_out = len(c.files) - plan.current_files
    s_obs = f"{plan.current_files} files, {n_cur} shards" + (
        f" ({left_out} {c.format} chunk files not counted: their number changes from save to save)" if left_out else ""
    )
    if plan.previous_step is None or plan.expected_files is None:
        s_res = RuleResult(
            SHAPE, "note", s_obs, "same file count and shard sizes as the previous verified checkpoint",
            f"{who}: no history yet for {SHAPE}: no previous verified checkpoint to compare with",
        )  # fmt: skip
        return [s_res, m_res]
    gone = (plan.previous_files or 0) - plan.expected_files
    count_thr = f"{plan.previous_files} files as at step {plan.previous_step}"
    if gone:
        count_thr = f"{plan.expected_files} files ({count_thr}, less {gone} missing shard(s))"
    s_thr = f"{count_thr}; each shard size within {tol}"
    count_changed = plan.current_files != plan.expected_files
    if shape.ok:
        return [
            RuleResult(SHAPE, "pass", s_obs, s_thr, f"{who}: same file and shard layout as step {plan.previous_step}"),
            m_res,
        ]
    parts = []
    if count_changed:
        parts.append(f"file count {plan.current_files} differs from {count_thr}")
    changed = list(shape.failed_items)
    if changed:
        parts.append(f"shards changed against step {plan.previous_step} (new, or size beyond {tol}): {_list(changed)}")
        s_obs += f"; changed: {_list(changed, 3)}"
    msg = f"{who}: rule {SHAPE}: " + "; ".join(parts or [f"layout differs from step {plan.previous_step}"])
    return [RuleResult(SHAPE, rules.shape_severity, s_obs, s_thr, msg), m_res]


def _step(plan: GatePlan, out: RuleOutcome, who: str) -> RuleResult:
    c = plan.candidate
    observed = f"step {c.step}"
    if plan.last_uploaded_step is None:
        return RuleResult(
            STEP_ORDER, "note", observed, "greater than the last uploaded step",
            f"{who}: no history yet for {STEP_ORDER}: first upload of the run",
        )  # fmt: skip
    threshold = f"> {plan.last_uploaded_step} (last uploaded step)"
    if out.ok:
        return RuleResult(
            STEP_ORDER, "pass", observed, threshold, f"{who}: step advances past {plan.last_uploaded_step}"
        )
    what = "equals" if c.step == plan.last_uploaded_step else "is below"
    msg = (
        f"{who}: rule {STEP_ORDER}: step {c.step} {what} the last uploaded step {plan.last_uploaded_step} "
        "(a restart from an older checkpoint?)"
    )
    return RuleResult(STEP_ORDER, plan.rules.step_severity, observed, threshold, msg)


def _fmt_loss(v: float) -> str:
    return f"{v:.6g}"


def _loss(plan: GatePlan, finite: RuleOutcome, jump: RuleOutcome, who: str) -> list[RuleResult]:
    rules = plan.rules
    if not plan.losses:
        none = f"no {' or '.join(LOSS_KEYS)} recorded"
        msg = (
            f"{who}: no loss in the checkpoint's metrics (HF trainer_state.json, Orbax metrics or a Lightning "
            "ModelCheckpoint(monitor=...*loss) absent or without loss; DeepSpeed, DCP, Megatron and NeMo keep "
            "theirs in client state inside pickles, which are not read); not checked"
        )
        return [
            RuleResult(LOSS_FINITE, "note", none, "finite", msg),
            RuleResult(LOSS_JUMP, "note", none, f"<= {rules.loss_jump_factor:g} x median of recent losses", msg),
        ]
    observed = ", ".join(f"{lo.key}={_fmt_loss(lo.value)}" for lo in plan.losses)
    if finite.ok:
        f_res = RuleResult(LOSS_FINITE, "pass", observed, "finite", f"{who}: loss is finite")
    else:
        bad = ", ".join(f"{lo.key}={_fmt_loss(lo.value)}" for lo in plan.losses if lo.key in finite.failed_items)
        f_res = RuleResult(
            LOSS_FINITE, rules.loss_severity, observed, "finite",
            f"{who}: rule {LOSS_FINITE}: {bad or observed} is not finite (NaN or infinite): training has diverged",
        )  # fmt: skip

    judged = [lo for lo in plan.losses if lo.limit is not None]
    if not judged:
        have = max((lo.samples for lo in plan.losses), default=0)
        j_res = _no_history(LOSS_JUMP, observed, who, have, rules.min_history, "recent losses")
        return [f_res, j_res]
    if not any(math.isfinite(lo.value) for lo in judged):
        # quality.py does not compare a NaN/inf with the limit: loss_finite has already said it
        j_res = RuleResult(
            LOSS_JUMP, "note", observed, f"<= {rules.loss_jump_factor:g} x median of recent losses",
            f"{who}: loss is not finite; no jump to measure (see {LOSS_FINITE})",
        )  # fmt: skip
        return [f_res, j_res]
    threshold = ", ".join(
        f"{lo.key} <= {_fmt_loss(lo.limit)} ({rules.loss_jump_factor:g} x median {_fmt_loss(lo.median or 0)})"
        for lo in judged
        if lo.limit is not None
    )
    if jump.ok:
        return [f_res, RuleResult(LOSS_JUMP, "pass", observed, threshold, f"{who}: loss within the jump limit")]
    bad_losses = [lo for lo in judged if lo.key in jump.failed_items]
    detail = "; ".join(
        f"{lo.key} {_fmt_loss(lo.value)} is {lo.value / (lo.median or 1):.1f}x the median {_fmt_loss(lo.median or 0)} "
        f"of the last {lo.samples} verified checkpoints (limit {_fmt_loss(lo.limit or 0)})"
        for lo in bad_losses
    )
    msg = f"{who}: rule {LOSS_JUMP}: {detail or 'loss jumped beyond ' + threshold}"
    return [f_res, RuleResult(LOSS_JUMP, rules.loss_jump_severity, observed, threshold, msg)]


def _interval(plan: GatePlan, out: RuleOutcome, who: str) -> RuleResult:
    rules = plan.rules
    gap = plan.gap_seconds
    observed = f"{humanize.duration(gap)} since the previous checkpoint" if gap is not None else "no earlier checkpoint"
    if plan.gap_limit is None or plan.interval_median is None or gap is None:
        return _no_history(INTERVAL, observed, who, plan.interval_samples, rules.min_history, "intervals")
    threshold = (
        f"<= {humanize.duration(plan.gap_limit)} ({rules.interval_factor:g} x median interval "
        f"{humanize.duration(plan.interval_median)})"
    )
    if out.ok:
        return RuleResult(INTERVAL, "pass", observed, threshold, f"{who}: checkpoint interval regular")
    msg = (
        f"{who}: rule {INTERVAL}: {humanize.duration(gap)} since the previous checkpoint is "
        f"{gap / plan.interval_median:.1f}x the median interval {humanize.duration(plan.interval_median)} "
        f"(limit {humanize.duration(plan.gap_limit)}): the run may have stalled"
    )
    return RuleResult(INTERVAL, rules.interval_severity, observed, threshold, msg)
