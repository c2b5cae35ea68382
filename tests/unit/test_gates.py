"""The pure half of the quality gates: shard/rank analysis, thresholds from history, report rendering.

No Great Expectations here (tests/unit/test_quality.py runs the real evaluation). The builders at the
top make realistic runs (a 7B model: HF with 4 safetensors shards + optimizer, or DCP with 8 ranks;
a checkpoint every 500 steps, ~40 min apart) and are shared with test_quality.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptvault.catalog import CheckpointState
from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.checkpoint.manifest import FileEntry, Manifest
from ckptvault.config import ValidationRules, parse_config
from ckptvault.formats.base import Candidate as LayoutCandidate
from ckptvault.ingest.discovery import Found
from ckptvault.ingest.gates import (
    INTERVAL,
    LOSS_FINITE,
    LOSS_JUMP,
    MISSING_RANK,
    RULES,
    SHAPE,
    SIZE_BAND,
    STEP_ORDER,
    GateSubject,
    RuleResult,
    ValidationReport,
    plan_gates,
    shard_table,
)
from ckptvault.ingest.judging import RuleOutcome, judge
from ckptvault.ingest.shards import missing_in_family, parse_shard

# --- builders (shared with test_quality.py) -------------------------------------------------------

RUN = "llama7b-pretrain"
T0 = 1_764_400_000.0  # 2025-11-29
EVERY_STEPS = 500
EVERY_SECONDS = 2400.0  # a checkpoint every 40 min
Files = tuple[tuple[str, int], ...]


def hf_files(shard: int = 3_370_000_000, optimizer: int = 26_950_000_000, shards: int = 4) -> Files:
    """A Trainer checkpoint of a 7B model: bf16 weights in 4 safetensors shards, fp32 Adam state."""
    model = tuple((f"model-{i:05d}-of-{shards:05d}.safetensors", shard) for i in range(1, shards + 1))
    rest = (
        ("config.json", 712),
        ("generation_config.json", 183),
        ("model.safetensors.index.json", 23_950),
        ("optimizer.pt", optimizer),
        ("rng_state.pth", 14_308),
        ("scheduler.pt", 1_064),
        ("trainer_state.json", 41_210),
        ("training_args.bin", 5_304),
    )
    return tuple(sorted(model + rest))


def dcp_files(rank: int = 10_110_000_000, ranks: int = 8) -> Files:
    """A torchtitan DCP checkpoint: one `__<rank>_0.distcp` per rank plus `.metadata`."""
    return tuple(sorted([(".metadata", 1_912_344), *((f"__{r}_0.distcp", rank) for r in range(ranks))]))


def loss_at(step: int) -> float:
    return round(1.85 + 2.6 / math.sqrt(1 + step / 1000), 4)


def jitter(files: Files, rng: random.Random, frac: float) -> Files:
    return tuple((p, int(s * (1 + rng.uniform(-frac, frac)))) for p, s in files)


def state(
    step: int, files: Files, created_at: float, metrics: dict[str, float] | None = None, *, verified: bool = True,
    run: str = RUN, state_name: str = "verified",
) -> CheckpointState:  # fmt: skip
    return CheckpointState(
        run=run, step=step, format="hf", last_event=state_name, bytes=sum(s for _, s in files), files=len(files),
        storage_class="STANDARD", created_at=created_at, uploaded_at=created_at + 300 if verified else None,
        verified=verified, local_evicted=False, last_drill_at=None, last_drill_ok=None, metrics=metrics or {},
        updated_at=created_at + 310,detail="",
    )  # fmt: skip


def manifest(step: int, files: Files, created_at: float, metrics: dict[str, float] | None = None) -> Manifest:
    return Manifest(
        run=RUN, step=step, format="hf",
        files=tuple(FileEntry(path=p, size=s, mtime=created_at, crc32c="AAAAAA==") for p, s in files),
        created_at=created_at, uploaded_at=created_at + 300, source=f"/scratch/{RUN}/checkpoint-{step}",
        metrics=metrics or {},
    )  # fmt: skip


def candidate(step: int, files: Files, created_at: float, metrics: dict[str, float] | None = None) -> GateSubject:
    return GateSubject(
        run=RUN, step=step, total_bytes=sum(s for _, s in files), files=files, created_at=created_at,
        metrics=dict(metrics or {}),
    )  # fmt: skip


def hf_metrics(step: int, loss: float | None = None) -> dict[str, float]:
    value = loss_at(step) if loss is None else loss
    return {"loss": value, "eval_loss": value * 1.04, "learning_rate": 3e-4, "grad_norm": 0.9, "global_step": step}


class Run:
    """A run with `n` verified checkpoints and the next (good) one ready to validate."""

    def __init__(self, n: int = 12, make_files: Callable[[], Files] = hf_files, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.history: list[CheckpointState] = []
        self.previous: Manifest | None = None
        at = T0
        for i in range(1, n + 1):
            step, at = i * EVERY_STEPS, at + EVERY_SECONDS * (1 + rng.uniform(-0.1, 0.1))
            files = jitter(make_files(), rng, 0.01)
            self.history.append(state(step, files, at, hf_metrics(step)))
            self.previous = manifest(step, files, at, hf_metrics(step))
        self.next_step = (n + 1) * EVERY_STEPS
        last = self.history[-1].created_at if self.history else T0
        self.next_at = (last or T0) + EVERY_SECONDS
        self.make_files = make_files

    def next(
        self, files: Files | None = None, *, step: int | None = None, created_at: float | None = None,
        metrics: dict[str, float] | None = None,
    ) -> GateSubject:  # fmt: skip
        step = self.next_step if step is None else step
        at = self.next_at if created_at is None else created_at
        return candidate(
            step,
            files if files is not None else self.make_files(),
            at,
            hf_metrics(step) if metrics is None else metrics,
        )


ALL_OK = {r: RuleOutcome(True) for r in RULES}
RULES_DEFAULT = ValidationRules()


def verdicts(report: ValidationReport) -> dict[str, str]:
    return {r.rule: r.verdict for r in report.results}


# --- shard / rank names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "kind", "family", "rank"),
    [
        ("__3_0.distcp", "dcp", "__{rank}_*.distcp", 3),
        ("weights/__12_1.distcp", "dcp", "weights/__{rank}_*.distcp", 12),
        ("mp_rank_01/model_optim_rng.pt", "megatron", "mp_rank_{rank}/model_optim_rng.pt", 1),
        ("mp_rank_01_003/model_optim_rng.pt", "megatron", "mp_rank_{rank}_*/model_optim_rng.pt", 1),
        ("zero_pp_rank_5_mp_rank_00_optim_states.pt", "deepspeed-zero",
         "zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", 5),
        ("bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "deepspeed-zero",
         "bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", 2),
        ("mp_rank_00_model_states.pt", "deepspeed-model", "mp_rank_{rank}_model_states.pt", 0),
        ("model-00002-of-00004.safetensors", "hf", "model-{rank}-of-00004.safetensors", 2),
        ("pytorch_model-00001-of-00002.bin", "hf", "pytorch_model-{rank}-of-00002.bin", 1),
    ],
)  # fmt: skip
def test_parse_shard_recognizes_each_layout(path: str, kind: str, family: str, rank: int) -> None:
    s = parse_shard(path)
    assert s is not None
    assert (s.kind, s.family, s.rank) == (kind, family, rank)


@pytest.mark.parametrize("path", ["optimizer.pt", ".metadata", "model.safetensors", "trainer_state.json", "common.pt"])
def test_parse_shard_ignores_other_files(path: str) -> None:
    assert parse_shard(path) is None


def test_missing_in_family_finds_gaps_by_numbering() -> None:
    assert missing_in_family(["__0_0.distcp", "__1_0.distcp", "__3_0.distcp"]) == ["__2_*.distcp"]
    # HF says how many shards there must be: a missing last one is visible too.
    assert missing_in_family(["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]) == [
        "model-00003-of-00003.safetensors"
    ]
    assert missing_in_family([p for p, _ in dcp_files()]) == []
    assert missing_in_family([p for p, _ in hf_files()]) == []


def test_shard_table_compares_with_previous() -> None:
    prev = dcp_files()
    cur = tuple((p, int(s * 1.4) if p == "__2_0.distcp" else s) for p, s in prev if p != "__7_0.distcp")
    rows = {r.path: r for r in shard_table(cur, prev)}
    assert rows["__7_0.distcp"].in_current is False and rows["__7_0.distcp"].in_previous is True
    assert rows["__2_0.distcp"].size_ratio == pytest.approx(1.4, rel=1e-6)
    assert ".metadata" not in rows  # not a shard: covered by the file count
    # Without a previous checkpoint nothing is "new" or "changed", but a numbering gap is still missing.
    rows2 = {r.path: r for r in shard_table(tuple(x for x in prev if x[0] != "__4_0.distcp"), None)}
    assert rows2["__4_*.distcp"].in_current is False
    assert all(r.in_previous is None and r.size_ratio is None for r in rows2.values())


def test_shard_table_reports_a_gap_once() -> None:
    prev = dcp_files()
    cur = tuple(x for x in prev if x[0] != "__4_0.distcp")
    missing = [r.path for r in shard_table(cur, prev) if not r.in_current]
    assert missing == ["__4_0.distcp"]


# --- the plan --------------------------------------------------------------------------------------


def test_plan_uses_last_k_verified_and_excludes_own_step() -> None:
    run = Run(n=15)
    rogue = state(run.next_step, hf_files(shard=1), T0, verified=True)  # the candidate's own step
    unverified = state(8000, hf_files(shard=1), T0, verified=False, state_name="invalid")
    plan = plan_gates(run.next(), [*run.history, rogue, unverified], run.previous, RULES_DEFAULT)
    assert plan.history_steps == tuple(range(6 * EVERY_STEPS, 16 * EVERY_STEPS, EVERY_STEPS))
    assert plan.size_median is not None
    assert plan.size_min == pytest.approx(plan.size_median * 0.8)
    assert plan.last_uploaded_step == run.next_step  # its own step was uploaded: step_order will say so


def test_plan_has_no_thresholds_without_enough_history() -> None:
    run = Run(n=2)
    plan = plan_gates(run.next(), run.history, run.previous, RULES_DEFAULT)
    assert plan.size_median is None and plan.gap_limit is None
    assert all(lo.limit is None for lo in plan.losses)
    assert plan.previous_step == 2 * EVERY_STEPS  # structure is compared from the first predecessor on


def test_plan_counts_expired_checkpoints_as_uploaded() -> None:
    expired = state(9000, hf_files(), T0, verified=False, state_name="expired")
    expired = CheckpointState(**{**expired.__dict__, "uploaded_at": T0 + 300})
    plan = plan_gates(candidate(4000, hf_files(), T0 + 9e4), [expired], None, RULES_DEFAULT)
    assert plan.last_uploaded_step == 9000


def test_plan_ignores_non_finite_and_missing_losses_in_history() -> None:
    run = Run(n=6)
    poisoned = [CheckpointState(**{**s.__dict__, "metrics": {"loss": math.nan}}) for s in run.history[:3]]
    plan = plan_gates(run.next(), poisoned + run.history[3:], run.previous, RULES_DEFAULT)
    loss = next(lo for lo in plan.losses if lo.key == "loss")
    assert loss.samples == 3 and loss.median is not None and math.isfinite(loss.median)


def test_rules_config_section_accepts_new_knobs() -> None:
    cfg = parse_config(
        '[store]\nbucket = "ckpts"\n[validation]\nsize_band = 0.1\nmin_history = 5\n'
        'interval_severity = "block"\nloss_jump_severity = "block"\nshard_size_tolerance = 0.02\n'
    )
    assert cfg.validation.min_history == 5 and cfg.validation.interval_severity == "block"


# --- judging and the report -----------------------------------------------------------------------


def test_judge_all_ok_passes_every_rule() -> None:
    run = Run()
    report = judge(plan_gates(run.next(), run.history, run.previous, RULES_DEFAULT), ALL_OK)
    assert verdicts(report) == dict.fromkeys(RULES, "pass")
    assert not report.blocked and not report.warned and report.reasons() == []


def test_judge_first_checkpoint_gives_notes() -> None:
    report = judge(plan_gates(candidate(500, hf_files(), T0, hf_metrics(500)), [], None, RULES_DEFAULT), ALL_OK)
    v = verdicts(report)
    assert v[LOSS_FINITE] == "pass"  # finiteness needs no history
    assert {v[r] for r in RULES if r != LOSS_FINITE} == {"note"}
    assert all(
        "no history yet" in r.message or "no previous" in r.message for r in report.results if r.verdict == "note"
    )


@pytest.mark.parametrize(
    ("rule", "severity_field", "severity"),
    [
        (SIZE_BAND, "size_severity", "block"),
        (SHAPE, "shape_severity", "warn"),
        (MISSING_RANK, "missing_rank_severity", "block"),
        (STEP_ORDER, "step_severity", "warn"),
        (LOSS_FINITE, "loss_severity", "block"),
        (LOSS_JUMP, "loss_jump_severity", "warn"),
        (INTERVAL, "interval_severity", "warn"),
    ],
)
def test_judge_failed_rule_takes_its_configured_severity(rule: str, severity_field: str, severity: str) -> None:
    run = Run()
    plan = plan_gates(run.next(), run.history, run.previous, RULES_DEFAULT)
    report = judge(plan, {**ALL_OK, rule: RuleOutcome(False, ("loss",))})
    assert verdicts(report)[rule] == severity
    flipped = "warn" if severity == "block" else "block"
    rules = ValidationRules.model_validate({severity_field: flipped})
    report2 = judge(plan_gates(run.next(), run.history, run.previous, rules), {**ALL_OK, rule: RuleOutcome(False)})
    assert verdicts(report2)[rule] == flipped


def _sample_report() -> ValidationReport:
    return ValidationReport(
        run=RUN,
        step=6500,
        results=(
            RuleResult(SIZE_BAND, "block", "20 B (20 B)", "30 B to 50 B | median", "half the size"),
            RuleResult(STEP_ORDER, "warn", "step 6500", "> 7000 (last uploaded step)", "went back"),
            RuleResult(INTERVAL, "note", "no earlier checkpoint", "needs 3", "no history yet"),
            RuleResult(LOSS_FINITE, "pass", "loss=2.1", "finite", "ok"),
        ),
    )


def test_report_json_round_trip() -> None:
    report = _sample_report()
    data = report.to_json()
    doc = json.loads(data)
    assert doc["schema"] == "ckptvault.validation/1" and doc["blocked"] is True and doc["warned"] is True
    assert ValidationReport.from_json(data) == report
    with pytest.raises(ValueError, match=r"_VALIDATION\.json"):
        ValidationReport.from_json(b'{"schema": "other"}', "_VALIDATION.json")
    with pytest.raises(ValueError, match="verdict"):
        ValidationReport.from_json(data.replace(b'"note"', b'"maybe"'))


def test_report_markdown_table() -> None:
    md = _sample_report().to_markdown()
    assert "| rule | observed | threshold | verdict |" in md
    assert "| size_band | 20 B (20 B) | 30 B to 50 B \\| median | **block** |" in md
    assert "BLOCKED" in md.splitlines()[0] and "llama7b-pretrain step 6500" in md


def test_reasons_name_checkpoint_rule_observed_threshold() -> None:
    reasons = _sample_report().reasons()
    assert len(reasons) == 2  # block and warn only
    assert reasons[0].startswith(f"{RUN} step 6500: rule size_band: half the size [block;")
    assert "observed 20 B (20 B)" in reasons[0] and "threshold 30 B to 50 B" in reasons[0]


def test_reasons_from_judge_name_the_checkpoint_once() -> None:
    run = Run()
    report = judge(
        plan_gates(run.next(), run.history, run.previous, RULES_DEFAULT), {**ALL_OK, SIZE_BAND: RuleOutcome(False)}
    )
    (reason,) = report.reasons()
    assert reason.count(f"{RUN} step {run.next_step}") == 1 and "rule size_band" in reason


def test_candidate_from_found(tmp_path: Path) -> None:
    files = (LocalFile("__0_0.distcp", tmp_path / "__0_0.distcp", 100, 10.0), LocalFile(".metadata", tmp_path, 5, 12.0))
    found = Found(RUN, LayoutCandidate("dcp", 300, tmp_path, True), files, True, "", 12.5)
    c = GateSubject.from_found(found, {"loss": 2.0})
    assert c == GateSubject(RUN, 300, 105, (("__0_0.distcp", 100), (".metadata", 5)), 12.5, {"loss": 2.0}, "dcp")


def _orbax_files(chunks: int, base: int) -> Files:
    fixed = [("_CHECKPOINT_METADATA", 366), ("commit_success.txt", 52), ("default/_METADATA", 1995),
             ("default/_sharding", 721), ("default/array_metadatas/process_0", 961),
             ("default/commit_success.txt", 77), ("default/manifest.ocdbt", 115),
             ("default/ocdbt.process_0/manifest.ocdbt", 310)]  # fmt: skip
    blobs = [(f"default/ocdbt.process_0/d/{base + i:032x}", 70_000 if i == 0 else 300) for i in range(chunks)]
    return tuple(fixed + blobs)


def test_orbax_chunk_files_coming_and_going_is_a_healthy_shape() -> None:
    """Orbax's OCDBT writes as many content-addressed chunk files (`d/<hex>`) as it needs, so a healthy
    run has 14, 17, 16, 16 files: the shape gate compares the rest (evaluated by Great Expectations)."""
    from ckptvault.ingest.quality import validate_candidate

    rules = ValidationRules(isolate=False)
    prev_files = _orbax_files(6, 0)
    previous = dataclasses.replace(manifest(100, prev_files, T0), format="orbax")
    history = [state(100, prev_files, T0)]
    for chunks in (4, 9):
        files = _orbax_files(chunks, 1000)
        c = GateSubject(RUN, 200, sum(s for _, s in files), files, T0 + 60, {}, "orbax")
        plan = plan_gates(c, history, previous, rules)
        assert (plan.current_files, plan.expected_files, plan.previous_files) == (8, 8, 8)
        shape = next(r for r in validate_candidate(c, history, previous, rules).results if r.rule == SHAPE)
        assert shape.verdict == "pass", shape
        assert f"({chunks} orbax chunk files not counted" in shape.observed
    # a file that does count (an item's metadata) going missing still changes the shape
    files = tuple(f for f in _orbax_files(6, 0) if f[0] != "default/_sharding")
    c = GateSubject(RUN, 200, sum(s for _, s in files), files, T0 + 60, {}, "orbax")
    shape = next(r for r in validate_candidate(c, history, previous, rules).results if r.rule == SHAPE)
    assert shape.verdict == "warn" and "file count 7 differs" in shape.message, shape
