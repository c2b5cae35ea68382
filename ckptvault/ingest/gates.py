"""Quality gates, the pure half: what is validated, the thresholds derived from a run's history, and
the report. No Great Expectations here (quality.py evaluates the plan with it), so the CLI, the
catalog and tests can read and render reports without paying its import time.

Flow: `GateSubject` + history + previous manifest -> `plan_gates` (thresholds, applicability, shard
table) -> quality.py asks GX which checks failed -> `judge` turns that into a `ValidationReport`.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast, get_args

from ckptvault import humanize
from ckptvault.errors import InvalidArgumentError
from ckptvault.formats import counts_for_shape

if TYPE_CHECKING:
    from ckptvault.catalog import CheckpointState
    from ckptvault.config import ValidationRules
    from ckptvault.ingest.discovery import Found
    from ckptvault.manifest import Manifest

Verdict = Literal["pass", "warn", "block", "note"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
REPORT_SCHEMA = "ckptvault.validation/1"

# Rule names, in report order. The shape rule is two rules (a change warns, a missing rank blocks)
# and rule 4 is two (not finite, jump) because each half has its own severity.
SIZE_BAND = "size_band"
SHAPE = "shape"
MISSING_RANK = "missing_rank"
STEP_ORDER = "step_order"
LOSS_FINITE = "loss_finite"
LOSS_JUMP = "loss_jump"
INTERVAL = "interval"
RULES = (SIZE_BAND, SHAPE, MISSING_RANK, STEP_ORDER, LOSS_FINITE, LOSS_JUMP, INTERVAL)

LOSS_KEYS = ("loss", "eval_loss")  # as formats.read_metrics reports them (HF trainer_state.json, Orbax metrics)


# --- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateSubject:
    """What we know about the checkpoint about to be uploaded."""

    run: str
    step: int
    total_bytes: int
    files: tuple[tuple[str, int], ...]  # (relative path, size)
    created_at: float
    metrics: dict[str, float]
    format: str = ""  # the layout name: which files count for the shape gate (formats.counts_for_shape)

    @classmethod
    def from_found(cls, found: Found, metrics: dict[str, float]) -> GateSubject:
        return cls(
            run=found.run,
            step=found.step,
            total_bytes=found.total_bytes,
            files=tuple((f.rel, f.size) for f in found.files),
            created_at=found.newest_mtime,
            metrics=dict(metrics),
            format=found.format,
        )

    @property
    def shape_files(self) -> tuple[tuple[str, int], ...]:
        """The files the shape gate counts and compares (all but those whose number the format says
        changes between healthy saves)."""
        return tuple((p, s) for p, s in self.files if counts_for_shape(self.format, p))


# --- shard / rank analysis ----------------------------------------------------------------------

# Each pattern names the rank (or shard index) and, optionally, an `aux` number that is not a rank
# (DCP's per-rank file counter, Megatron's pipeline index). Order matters: DeepSpeed ZeRO names also
# contain `mp_rank_00`, so they are tried first.
_SHARD_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("deepspeed-zero", re.compile(r"(?:^|/)(?:\w+_)?zero_pp_rank_(?P<rank>\d+)_mp_rank_\d+_optim_states\.pt$")),
    ("deepspeed-model", re.compile(r"(?:^|/)mp_rank_(?P<rank>\d+)_model_states\.pt$")),
    ("megatron", re.compile(r"(?:^|/)mp_rank_(?P<rank>\d+)(?:_(?P<aux>\d+))?/")),
    ("dcp", re.compile(r"(?:^|/)__(?P<rank>\d+)_(?P<aux>\d+)\.distcp$")),
    ("hf", re.compile(r"-(?P<rank>\d+)-of-(?P<total>\d+)\.(?:safetensors|bin)$")),
)


@dataclass(frozen=True)
class ShardName:
    """A file recognized as one rank's (or one index's) shard."""

    kind: str  # key of _SHARD_PATTERNS
    family: str  # the path with the rank as `{rank}` and any aux number as `*`: ranks of one family
    rank: int
    width: int  # digits of the rank as written, to rebuild a missing name
    total: int | None  # HF `-of-N`: how many shards the family must have


def parse_shard(path: str) -> ShardName | None:
    for kind, pattern in _SHARD_PATTERNS:
        m = pattern.search(path)
        if m is None:
            continue
        groups = m.groupdict()
        spans = sorted((m.span(g), g) for g in ("rank", "aux") if groups.get(g) is not None)
        family, last = "", 0
        for (start, end), g in spans:
            family += path[last:start] + ("{rank}" if g == "rank" else "*")
            last = end
        family += path[last:]
        total = groups.get("total")
        return ShardName(kind, family, int(m.group("rank")), len(m.group("rank")), int(total) if total else None)
    return None


def missing_in_family(paths: Iterable[str]) -> list[str]:
    """Ranks absent from a checkpoint judged by its own names: a gap in 0..max (HF: in 1..N of
    `-of-N`). A missing *last* rank is invisible here; the comparison with the previous checkpoint
    catches that. Returned as display names, `*` standing for a number that is not a rank."""
    families: dict[str, tuple[ShardName, set[int]]] = {}
    for p in paths:
        s = parse_shard(p)
        if s is not None:
            families.setdefault(s.family, (s, set()))[1].add(s.rank)
    out: list[str] = []
    for family, (sample, ranks) in sorted(families.items()):
        expected = range(1, sample.total + 1) if sample.total is not None else range(0, max(ranks) + 1)
        for r in expected:
            if r not in ranks:
                out.append(family.replace("{rank}", f"{r:0{sample.width}d}"))
    return out


@dataclass(frozen=True)
class ShardRow:
    """One shard of the previous or current checkpoint (or one inferred missing from the current)."""

    path: str
    in_previous: bool | None  # None: no previous checkpoint to compare with
    in_current: bool
    previous_size: int | None
    current_size: int | None

    @property
    def size_ratio(self) -> float | None:
        if self.previous_size and self.current_size is not None:
            return self.current_size / self.previous_size
        return None


def shard_table(current: Sequence[tuple[str, int]], previous: Sequence[tuple[str, int]] | None) -> list[ShardRow]:
    cur = {p: s for p, s in current if parse_shard(p) is not None}
    prev = {p: s for p, s in previous if parse_shard(p) is not None} if previous is not None else None
    rows: list[ShardRow] = []
    for p in sorted(set(cur) | set(prev or {})):
        rows.append(
            ShardRow(
                path=p,
                in_previous=None if prev is None else p in prev,
                in_current=p in cur,
                previous_size=None if prev is None else prev.get(p),
                current_size=cur.get(p),
            )
        )
    known = {r.path for r in rows}
    for name in missing_in_family(cur):
        # A gap already listed (by exact name, from the previous checkpoint) is not reported twice;
        # DCP gap names carry a `*` and never collide, so skip those whose rank is listed anyway.
        if name in known or any(_same_rank(name, k) for k in known if k not in cur):
            continue
        rows.append(ShardRow(path=name, in_previous=None, in_current=False, previous_size=None, current_size=None))
    return rows


def _same_rank(pattern_name: str, path: str) -> bool:
    return re.fullmatch(re.escape(pattern_name).replace(r"\*", r"\d+"), path) is not None


# --- the plan: thresholds from history ----------------------------------------------------------


@dataclass(frozen=True)
class LossObs:
    key: str  # "loss" or "eval_loss"
    value: float
    median: float | None  # of the recent verified checkpoints that recorded it
    samples: int
    limit: float | None  # loss_jump_factor x median; None: too little history to judge a jump


@dataclass(frozen=True)
class GatePlan:
    """Everything the gates compare, computed before any evaluation: quality.py feeds these numbers to
    Great Expectations, `judge` words the outcome. A None threshold means "not applicable"."""

    candidate: GateSubject
    rules: ValidationRules
    history_steps: tuple[int, ...]  # the verified checkpoints used as the baseline, by step
    size_median: float | None
    size_min: float | None
    size_max: float | None
    previous_step: int | None
    current_files: int  # the candidate's files that count for the shape gate (GateSubject.shape_files)
    previous_files: int | None
    # previous_files less the previous shards now missing: those are missing_rank's to report, and
    # counting them again here would warn twice about one dead rank.
    expected_files: int | None
    shards: tuple[ShardRow, ...]
    last_uploaded_step: int | None
    losses: tuple[LossObs, ...]
    gap_seconds: float | None  # since the newest earlier checkpoint of the baseline
    interval_median: float | None
    interval_samples: int
    gap_limit: float | None


def _baseline(history: Sequence[CheckpointState], candidate: GateSubject, k: int) -> list[CheckpointState]:
    # The candidate's own step is excluded: a re-validated step must not vouch for itself.
    verified = [s for s in history if s.verified and s.run == candidate.run and s.step != candidate.step]
    return sorted(verified, key=lambda s: s.step)[-k:]


def plan_gates(
    candidate: GateSubject,
    history: Sequence[CheckpointState],
    previous: Manifest | None,
    rules: ValidationRules,
) -> GatePlan:
    base = _baseline(history, candidate, rules.history)
    enough = rules.min_history

    sizes = [s.bytes for s in base if s.bytes > 0]
    size_median = float(statistics.median(sizes)) if len(sizes) >= enough else None
    size_min = size_median * (1 - rules.size_band) if size_median is not None else None
    size_max = size_median * (1 + rules.size_band) if size_median is not None else None

    prev_files = (
        [(f.path, f.size) for f in previous.files if counts_for_shape(previous.format, f.path)]
        if previous is not None
        else None
    )
    current = candidate.shape_files
    shards = tuple(shard_table(current, prev_files))

    # "Uploaded" includes checkpoints since expired: a step that went backwards is a restart even if
    # the checkpoint it went back from is gone.
    uploaded = [s.step for s in history if s.run == candidate.run and (s.verified or s.uploaded_at is not None)]
    last_uploaded = max(uploaded) if uploaded else None

    losses: list[LossObs] = []
    for key in LOSS_KEYS:
        if key not in candidate.metrics:
            continue
        past = [s.metrics[key] for s in base if key in s.metrics and math.isfinite(s.metrics[key])]
        median = float(statistics.median(past)) if past else None
        # A jump is relative to a positive level; a median <= 0 (an unusual objective) has no ratio.
        judge_jump = median is not None and median > 0 and len(past) >= enough
        limit = rules.loss_jump_factor * median if judge_jump and median is not None else None
        losses.append(LossObs(key, float(candidate.metrics[key]), median, len(past), limit))

    times = sorted(s.created_at for s in base if s.created_at is not None)
    intervals = [b - a for a, b in itertools.pairwise(times) if b > a]
    earlier = [t for t in times if t < candidate.created_at]
    gap = candidate.created_at - earlier[-1] if earlier else None
    interval_median = float(statistics.median(intervals)) if len(intervals) >= enough else None
    gap_limit = rules.interval_factor * interval_median if interval_median is not None else None

    return GatePlan(
        candidate=candidate,
        rules=rules,
        history_steps=tuple(s.step for s in base),
        size_median=size_median,
        size_min=size_min,
        size_max=size_max,
        previous_step=previous.step if previous is not None else None,
        current_files=len(current),
        previous_files=len(prev_files) if prev_files is not None else None,
        expected_files=(
            len(prev_files) - sum(1 for r in shards if r.in_previous and not r.in_current)
            if prev_files is not None
            else None
        ),
        shards=shards,
        last_uploaded_step=last_uploaded,
        losses=tuple(losses),
        gap_seconds=gap,
        interval_median=interval_median,
        interval_samples=len(intervals),
        gap_limit=gap_limit,
    )


# --- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleResult:
    rule: str
    verdict: Verdict
    observed: str
    threshold: str
    message: str


@dataclass(frozen=True)
class ValidationReport:
    run: str
    step: int
    results: tuple[RuleResult, ...]

    @property
    def blocked(self) -> bool:
        return any(r.verdict == "block" for r in self.results)

    @property
    def warned(self) -> bool:
        return any(r.verdict == "warn" for r in self.results)

    def to_json(self) -> bytes:
        doc = {
            "schema": REPORT_SCHEMA,
            "run": self.run,
            "step": self.step,
            "blocked": self.blocked,
            "warned": self.warned,
            "results": [
                {"rule": r.rule, "verdict": r.verdict, "observed": r.observed, "threshold": r.threshold,
                 "message": r.message}
                for r in self.results
            ],
        }  # fmt: skip
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, origin: str = "validation report") -> ValidationReport:
        try:
            d = json.loads(data)
            if not isinstance(d, dict) or d.get("schema") != REPORT_SCHEMA:
                raise InvalidArgumentError(f"not a ckptvault validation report (schema {REPORT_SCHEMA!r} expected)")
            results = []
            for r in d["results"]:
                if r["verdict"] not in VERDICTS:
                    raise InvalidArgumentError(f"unknown verdict {r['verdict']!r}")
                results.append(
                    RuleResult(
                        rule=str(r["rule"]),
                        verdict=cast(Verdict, r["verdict"]),
                        observed=str(r["observed"]),
                        threshold=str(r["threshold"]),
                        message=str(r["message"]),
                    )
                )
            return cls(run=str(d["run"]), step=int(d["step"]), results=tuple(results))
        except (UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
            raise InvalidArgumentError(f"{origin}: {e}") from None

    def to_markdown(self) -> str:
        status = "BLOCKED" if self.blocked else ("passed with warnings" if self.warned else "passed")
        lines = [
            f"### Validation of {self.run} step {self.step}: {status}",
            "",
            "| rule | observed | threshold | verdict |",
            "| --- | --- | --- | --- |",
        ]
        for r in self.results:
            verdict = f"**{r.verdict}**" if r.verdict in ("block", "warn") else r.verdict
            lines.append(f"| {_md(r.rule)} | {_md(r.observed)} | {_md(r.threshold)} | {verdict} |")
        notes = [r for r in self.results if r.verdict != "pass"]
        if notes:
            lines.append("")
            lines.extend(f"- {r.verdict}: {_md(r.message)}" for r in notes)
        return "\n".join(lines) + "\n"

    def reasons(self) -> list[str]:
        """One line per block/warn result, always naming the checkpoint, the rule, the verdict, the
        observed value and the threshold (messages from `judge` already start with the first two)."""
        out = []
        for r in self.results:
            if r.verdict not in ("block", "warn"):
                continue
            head = f"{self.run} step {self.step}: rule {r.rule}"
            text = r.message if r.message.startswith(head) else f"{head}: {r.message}"
            out.append(f"{text} [{r.verdict}; observed {r.observed}; threshold {r.threshold}]")
        return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- judging: GX outcomes -> rule results -------------------------------------------------------


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
