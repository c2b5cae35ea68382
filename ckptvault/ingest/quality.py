"""Quality gates evaluated with Great Expectations 1.x over a run's catalog history.

This is the only module that imports great_expectations, and only inside `validate_candidate`:
the import costs 5-9 s (scipy, pandas, altair), which `ckptvault ls`, `plan` and `restore` must not
pay. `gates.py` computes the thresholds from history (pure Python); here the candidate's observed
values become three small dataframes checked by three cached, parameterized expectation suites, and
each expectation's result becomes part of a `RuleResult` (gates.judge).

Where it runs: by default (`[validation] isolate = true`) in a short-lived child process,
`python -m ckptvault.ingest.quality_child_main`, one per validation, fed the pickled GatePlan on stdin and answering
the outcomes on stdout. GX with pandas, scipy and altair adds ~250 MiB to a process and Python never
gives imported modules back: in the worker that would stay for its whole life and sit on top of the
upload buffers. The child exits before the upload starts (ingest validates, then uploads), so the
two never add up. It costs the cold start (~3 s of CPU) per validated checkpoint, which arrive hours
apart. `isolate = false` evaluates in-process with the engine cached (~0.1 s warm): for tests and
for validating many checkpoints in one go.

The child builds its engine before it reads the plan, so a caller can start it ahead (`prewarm`: the
CLI does, beside Prefect's start-up) and the import is paid while the parent works. It imports lean:
GX's and pandas' optional pyarrow, sqlalchemy and boto3 are blocked (LEAN_BLOCKED, ~60 MiB less).

Why parameterized suites: the thresholds change per candidate, but building a context, data source,
suites and validation definitions is the slow part after the import. They are built once per process
and the thresholds travel as `expectation_parameters` to each run (~0.1 s warm).
"Not applicable" (no history yet) is expressed in the data, not the suite: the column is null, and
column-map expectations skip nulls; gates.judge then reports a note.
"""

from __future__ import annotations

import logging
import math
import numbers
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptvault.ingest import quality_child
from ckptvault.ingest.gates import (
    INTERVAL,
    LOSS_FINITE,
    LOSS_JUMP,
    MISSING_RANK,
    RULES,
    SHAPE,
    SIZE_BAND,
    STEP_ORDER,
    GatePlan,
    GateSubject,
    RuleResult,
    ValidationReport,
    plan_gates,
)
from ckptvault.ingest.judging import RuleOutcome, judge
from ckptvault.ingest.quality_child import LEAN_ENV as LEAN_ENV
from ckptvault.ingest.quality_child import discard_prewarmed as discard_prewarmed
from ckptvault.ingest.quality_child import prewarm as prewarm
from ckptvault.ingest.quality_error import QualityError

if TYPE_CHECKING:
    from ckptvault.catalog import CheckpointState
    from ckptvault.checkpoint.manifest import Manifest
    from ckptvault.config import ValidationRules

__all__ = ["discard_prewarmed", "prewarm", "validate_candidate"]

_FLOAT_MAX = sys.float_info.max  # a finite bound: +-inf fall outside it, which is the point


@dataclass
class _Engine:
    context: Any
    candidate_vd: Any
    losses_vd: Any
    shards_vd: Any


_engine: _Engine | None = None
# The GX context and its validation definitions are not safe to share between threads (Prefect runs
# sync tasks in a thread pool); one validation at a time is cheap enough (~0.1 s each).
_lock = threading.Lock()


def _quiet_gx_logging() -> None:
    """GX logs INFO/DEBUG chatter per run, and some of its modules pin their own logger to INFO at
    import (so the parent's level alone does not silence them): raise every GX logger to WARNING."""
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or not name.startswith("great_expectations."):
            continue  # a PlaceHolder has no level of its own
        if logging.NOTSET < logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def _build_engine() -> _Engine:
    _quiet_gx_logging()
    import great_expectations as gx
    import great_expectations.expectations as gx_expectations
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # The package re-exports its expectation classes implicitly, which mypy --strict rejects.
    gxe: Any = gx_expectations
    _quiet_gx_logging()  # again: importing GX may reset levels of the loggers it creates
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    _quiet_gx_logging()  # and once more for the modules the context imported lazily
    source = context.data_sources.add_pandas("ckptvault")

    def vd(name: str, expectations: Sequence[Any]) -> Any:
        batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("whole")
        suite = context.suites.add(gx.ExpectationSuite(name=f"ckptvault-{name}"))
        for e in expectations:
            suite.add_expectation(e)
        return context.validation_definitions.add(
            gx.ValidationDefinition(name=f"ckptvault-{name}", data=batch, suite=suite)
        )

    def p(name: str) -> dict[str, str]:
        return {"$PARAMETER": name}

    def meta(rule: str, check: str) -> dict[str, str]:
        return {"rule": rule, "check": check}

    # One row: the candidate's scalar observations. A null cell = rule not applicable.
    candidate_vd = vd(
        "candidate",
        [
            gxe.ExpectColumnValuesToBeBetween(
                column="total_bytes", min_value=p("size_min"), max_value=p("size_max"), meta=meta(SIZE_BAND, "band")
            ),
            gxe.ExpectColumnValuesToBeBetween(
                column="file_count", min_value=p("files"), max_value=p("files"), meta=meta(SHAPE, "file_count")
            ),
            gxe.ExpectColumnValuesToBeBetween(column="step", min_value=p("step_min"), meta=meta(STEP_ORDER, "advance")),
            gxe.ExpectColumnValuesToBeBetween(column="gap_seconds", max_value=p("gap_max"), meta=meta(INTERVAL, "gap")),
        ],
    )
    # One row per recorded loss (loss, eval_loss); no rows when the checkpoint records none.
    losses_vd = vd(
        "losses",
        [
            gxe.ExpectColumnValuesToNotBeNull(column="value", meta=meta(LOSS_FINITE, "not_nan")),
            gxe.ExpectColumnValuesToBeBetween(
                column="value", min_value=-_FLOAT_MAX, max_value=_FLOAT_MAX, meta=meta(LOSS_FINITE, "not_inf")
            ),
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="jump_limit", column_B="value", or_equal=True, ignore_row_if="either_value_is_missing",
                meta=meta(LOSS_JUMP, "jump"),
            ),
        ],
    )  # fmt: skip
    # One row per shard of the previous or current checkpoint, plus shards implied missing by numbering.
    shards_vd = vd(
        "shards",
        [
            gxe.ExpectColumnValuesToBeInSet(column="in_current", value_set=[True], meta=meta(MISSING_RANK, "present")),
            gxe.ExpectColumnValuesToBeInSet(column="in_previous", value_set=[True], meta=meta(SHAPE, "new_shard")),
            gxe.ExpectColumnValuesToBeBetween(
                column="size_ratio", min_value=p("ratio_min"), max_value=p("ratio_max"), meta=meta(SHAPE, "shard_size")
            ),
        ],
    )
    return _Engine(context, candidate_vd, losses_vd, shards_vd)


def get_engine() -> _Engine:
    global _engine
    if _engine is None:
        _engine = _build_engine()
    return _engine


def _frames(plan: GatePlan) -> tuple[Any, Any, Any, dict[str, float]]:
    import pandas as pd

    c = plan.candidate

    def opt(v: float | None) -> float | None:
        return None if v is None else float(v)

    candidate = pd.DataFrame(
        {
            "total_bytes": [opt(c.total_bytes) if plan.size_median is not None else None],
            "file_count": [opt(plan.current_files) if plan.expected_files is not None else None],
            "step": [opt(c.step) if plan.last_uploaded_step is not None else None],
            "gap_seconds": [plan.gap_seconds if plan.gap_limit is not None else None],
        },
        dtype="float64",
    )
    losses = pd.DataFrame(
        {
            "metric": pd.Series([lo.key for lo in plan.losses], dtype="object"),
            "value": pd.Series([lo.value for lo in plan.losses], dtype="float64"),
            # A non-finite loss is loss_finite's to report; comparing inf with a limit would warn twice.
            "jump_limit": pd.Series(
                [lo.limit if math.isfinite(lo.value) else None for lo in plan.losses], dtype="float64"
            ),
        }
    )
    shards = pd.DataFrame(
        {
            "path": pd.Series([r.path for r in plan.shards], dtype="object"),
            "in_previous": pd.Series([r.in_previous for r in plan.shards], dtype="object"),
            "in_current": pd.Series([r.in_current for r in plan.shards], dtype="object"),
            "size_ratio": pd.Series([r.size_ratio for r in plan.shards], dtype="float64"),
        }
    )
    tol = plan.rules.shard_size_tolerance
    # Unused bounds still need a value (GX resolves every parameter); their column is null then.
    params = {
        "size_min": plan.size_min if plan.size_min is not None else 0.0,
        "size_max": plan.size_max if plan.size_max is not None else 0.0,
        "files": float(plan.expected_files) if plan.expected_files is not None else 0.0,
        "step_min": float(plan.last_uploaded_step + 1) if plan.last_uploaded_step is not None else 0.0,
        "gap_max": plan.gap_limit if plan.gap_limit is not None else 0.0,
        "ratio_min": 1.0 - tol,
        "ratio_max": 1.0 + tol,
    }
    return candidate, losses, shards, params


def _raised(info: Any) -> str | None:
    """The exception message if GX caught one while evaluating (it reports instead of raising)."""
    if not isinstance(info, dict):
        return None
    if "raised_exception" in info:
        return str(info.get("exception_message") or "unknown error") if info["raised_exception"] else None
    for v in info.values():
        msg = _raised(v)
        if msg is not None:
            return msg
    return None


def _collect(
    run_result: Any, frame: Any, label_column: str | None, into: dict[str, list[bool]], items: dict[str, list[str]]
) -> None:
    """Each expectation's success under its rule, and the labels (shard path, loss key) of the rows it
    rejected, from the COMPLETE result's `unexpected_index_list` (row positions: the frames have a
    RangeIndex)."""
    for res in run_result.results:
        cfg = res.expectation_config
        rule = cfg.meta["rule"]
        err = _raised(res.exception_info)
        if err is not None:
            raise QualityError(f"Great Expectations could not evaluate {cfg.type} for rule {rule}: {err}")
        into.setdefault(rule, []).append(bool(res.success))
        if not res.success and label_column is not None:
            for idx in res.result.get("unexpected_index_list") or []:
                if isinstance(idx, numbers.Integral):
                    items.setdefault(rule, []).append(str(frame[label_column].iloc[int(idx)]))


def evaluate(plan: GatePlan) -> dict[str, RuleOutcome]:
    candidate, losses, shards, params = _frames(plan)
    engine = get_engine()
    checks: dict[str, list[bool]] = {}
    items: dict[str, list[str]] = {}
    for vd, frame, label in (
        (engine.candidate_vd, candidate, None),
        (engine.losses_vd, losses, "metric"),
        (engine.shards_vd, shards, "path"),
    ):
        result = vd.run(batch_parameters={"dataframe": frame}, expectation_parameters=params, result_format="COMPLETE")
        _collect(result, frame, label, checks, items)
    missing = [r for r in RULES if r not in checks]
    if missing:
        raise QualityError(f"no expectation evaluated rule(s) {missing}; the suites are out of date")
    return {r: RuleOutcome(all(checks[r]), tuple(dict.fromkeys(items.get(r, [])))) for r in RULES}


def validate_candidate(
    candidate: GateSubject,
    history: Sequence[CheckpointState],
    previous: Manifest | None,
    rules: ValidationRules,
) -> ValidationReport:
    """Judge `candidate` against its run's catalog history (`history`: the run's states; the verified
    ones are the baseline, the last `rules.history` by step) and `previous`, the manifest of the run's
    newest verified checkpoint below the candidate's step (None if there is none).
    Raises QualityError if Great Expectations fails to evaluate (never a silent pass)."""
    if not rules.enabled:
        # Said in the report rather than by an empty one, so _VALIDATION.json shows why nothing ran.
        off = RuleResult(
            "validation", "note", "disabled", "[validation] enabled = true",
            f"{candidate.run} step {candidate.step}: validation is disabled in [validation]; nothing checked",
        )  # fmt: skip
        return ValidationReport(candidate.run, candidate.step, (off,))
    plan = plan_gates(candidate, history, previous, rules)
    with _lock:  # one evaluation at a time per process: also bounds the children's memory
        outcomes = quality_child.evaluate_in_child(plan) if rules.isolate else evaluate(plan)
    return judge(plan, outcomes)
