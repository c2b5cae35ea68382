"""Quality gates, the pure half: what is validated, the thresholds derived from a run's history, and
the report. No Great Expectations here (quality.py evaluates the plan with it), so the CLI, the
catalog and tests can read and render reports without paying its import time.

Flow: `GateSubject` + history + previous manifest -> `plan_gates` (thresholds, applicability, shard
table) -> quality.py asks GX which checks failed -> `judging.judge` turns that into a `ValidationReport`.
Shard names are read in `shards`.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast, get_args

from ckptvault.errors import InvalidArgumentError
from ckptvault.formats import counts_for_shape
from ckptvault.ingest.shards import ShardRow, shard_table

if TYPE_CHECKING:
    from ckptvault.catalog import CheckpointState
    from ckptvault.checkpoint.manifest import Manifest
    from ckptvault.config import ValidationRules
    from ckptvault.ingest.discovery import Found

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
