"""Quality gates evaluated for real with Great Expectations: a corpus of bad checkpoints (one per rule),
good ones, first checkpoints of a run, and the lazy-import guarantee.

The first test that validates pays GX's import (5-9 s); the context is cached per process after that.
"""

from __future__ import annotations

import logging
import math
import random
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptvault.catalog import CheckpointState
from ckptvault.config import ValidationRules
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
    ValidationReport,
)
from ckptvault.ingest.quality import validate_candidate
from tests.unit.test_gates import (
    EVERY_SECONDS,
    EVERY_STEPS,
    RUN,
    T0,
    Files,
    Run,
    candidate,
    dcp_files,
    hf_files,
    hf_metrics,
    jitter,
    loss_at,
    manifest,
    state,
    verdicts,
)

REPO = Path(__file__).resolve().parents[2]
# In-process with the engine cached, so the corpus runs in seconds; the default, isolated path (one
# child process per validation) has its own tests at the end and runs in every flow test.
RULES_DEFAULT = ValidationRules(isolate=False)


def check(run: Run, c: GateSubject, rules: ValidationRules = RULES_DEFAULT) -> ValidationReport:
    return validate_candidate(c, run.history, run.previous, rules)


# --- import cost ----------------------------------------------------------------------------------


def test_importing_quality_does_not_import_great_expectations() -> None:
    code = (
        "import sys, ckptvault.ingest.quality, ckptvault.ingest.gates; "
        "assert 'great_expectations' not in sys.modules, 'great_expectations imported eagerly'; "
        "assert 'pandas' not in sys.modules, 'pandas imported eagerly'"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# --- good checkpoints -----------------------------------------------------------------------------


@pytest.mark.parametrize("make_files", [hf_files, dcp_files], ids=["hf", "dcp"])
def test_good_checkpoint_passes_every_rule(make_files: Callable[[], Files]) -> None:
    run = Run(make_files=make_files)
    c = run.next(make_files(), metrics=hf_metrics(run.next_step) if make_files is hf_files else {})
    report = check(run, c)
    expected = dict.fromkeys(RULES, "pass")
    if make_files is dcp_files:  # DCP records no trainer_state.json: nothing to say about the loss
        expected |= {LOSS_FINITE: "note", LOSS_JUMP: "note"}
    assert verdicts(report) == expected
    assert not report.blocked and not report.warned and report.reasons() == []


def test_fifty_jittered_good_checkpoints_raise_no_alarm() -> None:
    """Sizes +-3% (every shard), intervals +-10%, a noisy decreasing loss: the gates stay quiet from
    the first checkpoint of the run to the fiftieth."""
    rng = random.Random(2026)
    history: list[CheckpointState] = []
    previous = None
    at = T0
    for i in range(1, 51):
        step = i * EVERY_STEPS
        at += EVERY_SECONDS * (1 + rng.uniform(-0.1, 0.1))
        files = jitter(dcp_files(), rng, 0.03)
        metrics = hf_metrics(step, loss_at(step) * (1 + rng.uniform(-0.05, 0.05)))
        report = validate_candidate(candidate(step, files, at, metrics), history, previous, RULES_DEFAULT)
        assert not report.blocked and not report.warned, report.reasons()
        if i > RULES_DEFAULT.min_history + 1:
            assert set(verdicts(report).values()) == {"pass"}, verdicts(report)
        history.append(state(step, files, at, metrics))
        previous = manifest(step, files, at, metrics)


def test_first_checkpoints_of_a_run_pass_with_notes() -> None:
    first = validate_candidate(candidate(500, hf_files(), T0, hf_metrics(500)), [], None, RULES_DEFAULT)
    v = verdicts(first)
    assert not first.blocked and not first.warned
    assert v[LOSS_FINITE] == "pass"
    assert {v[r] for r in RULES if r != LOSS_FINITE} == {"note"}
    for r in first.results:
        if r.verdict == "note":
            assert "no history yet" in r.message or "no previous" in r.message, r.message

    # Two verified checkpoints: structure is compared, the statistics still wait for min_history (3).
    run = Run(n=2)
    second = check(run, run.next())
    v = verdicts(second)
    assert not second.blocked and not second.warned
    assert (v[SHAPE], v[MISSING_RANK], v[STEP_ORDER]) == ("pass", "pass", "pass")
    assert (v[SIZE_BAND], v[LOSS_JUMP], v[INTERVAL]) == ("note", "note", "note")
    # Even a wildly different size is not judged without history.
    odd = check(run, run.next(hf_files(shard=1_000_000_000, optimizer=8_000_000_000)))
    assert verdicts(odd)[SIZE_BAND] == "note"


# --- the corpus of bad checkpoints ---------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    name: str
    rule: str
    verdict: str
    make: Callable[[Run], GateSubject]
    observed: str  # must appear in the reason: the observed value
    threshold: str  # must appear in the reason: the threshold
    files: Callable[[], Files] = hf_files


def _rank_died(run: Run) -> GateSubject:
    # rank 7 crashed before writing: 7 of 8 shards (-12.5% bytes: inside the size band, so only the
    # rank analysis can see it)
    return run.next(tuple(f for f in dcp_files() if f[0] != "__7_0.distcp"), metrics={})


def _rank_gap(run: Run) -> GateSubject:
    return run.next(tuple(f for f in dcp_files() if f[0] != "__3_0.distcp"), metrics={})


CORPUS = [
    Bad(
        "optimizer-state-half-size", SIZE_BAND, "block",
        # optimizer.pt written in bf16 after a config change: -33% in total, same files and shards
        lambda run: run.next(hf_files(optimizer=13_475_000_000)),
        observed="25.1 GiB", threshold="of the last 10 verified ±20%",
    ),
    Bad(
        "shard-size-pattern-changed", SHAPE, "warn",
        # one rank's shard 35% larger (uneven resharding): +4% in total, inside the band
        lambda run: run.next(
            tuple((p, int(s * 1.35) if p == "__2_0.distcp" else s) for p, s in dcp_files()), metrics={}
        ),
        observed="changed: __2_0.distcp", threshold="each shard size within ±10%", files=dcp_files,
    ),
    Bad(
        "extra-file", SHAPE, "warn",
        lambda run: run.next(tuple(sorted([*hf_files(), ("scaler.pt", 1_383)]))),
        observed="13 files", threshold="12 files as at step 6000",
    ),
    Bad(
        "rank-died", MISSING_RANK, "block", _rank_died,
        observed="missing: __7_0.distcp", threshold="every shard of step 6000 present", files=dcp_files,
    ),
    Bad(
        "rank-gap", MISSING_RANK, "block", _rank_gap,
        observed="missing: __3_0.distcp", threshold="every shard of step 6000 present", files=dcp_files,
    ),
    Bad(
        "restart-from-older-step", STEP_ORDER, "warn",
        lambda run: run.next(step=4000, metrics=hf_metrics(4000)),
        observed="step 4000", threshold="> 6000 (last uploaded step)",
    ),
    Bad(
        "same-step-again", STEP_ORDER, "warn",
        lambda run: run.next(step=6000, metrics=hf_metrics(6000)),
        observed="step 6000", threshold="> 6000",
    ),
    Bad(
        "nan-loss", LOSS_FINITE, "block",
        lambda run: run.next(metrics=hf_metrics(run.next_step, math.nan)),
        observed="loss=nan", threshold="finite",
    ),
    Bad(
        "inf-loss", LOSS_FINITE, "block",
        lambda run: run.next(metrics=hf_metrics(run.next_step, math.inf)),
        observed="loss=inf", threshold="finite",
    ),
    Bad(
        "loss-spike", LOSS_JUMP, "warn",
        lambda run: run.next(metrics=hf_metrics(run.next_step, 11.7)),
        observed="loss=11.7", threshold="3 x median",
    ),
    Bad(
        "stalled-run", INTERVAL, "warn",
        # the job hung on a collective for 6 hours before this checkpoint
        lambda run: run.next(created_at=run.next_at + 6 * 3600),
        observed="6.7 h since the previous checkpoint", threshold="3 x median interval",
    ),
]  # fmt: skip


@pytest.mark.parametrize("bad", CORPUS, ids=[b.name for b in CORPUS])
def test_bad_checkpoint_is_caught_by_its_rule(bad: Bad) -> None:
    run = Run(make_files=bad.files)
    c = bad.make(run)
    report = check(run, c)
    v = verdicts(report)
    assert v[bad.rule] == bad.verdict, report.to_markdown()
    others = {r: x for r, x in v.items() if r != bad.rule and x in ("block", "warn")}
    assert others == {}, f"{bad.name} also tripped {others}:\n{report.to_markdown()}"
    assert report.blocked == (bad.verdict == "block")
    assert report.warned == (bad.verdict == "warn")

    (reason,) = report.reasons()
    assert f"{RUN} step {c.step}" in reason  # the checkpoint
    assert f"rule {bad.rule}" in reason  # the rule
    assert bad.observed in reason, reason  # the observed value
    assert bad.threshold in reason, reason  # the threshold
    assert bad.verdict in reason


def test_lower_step_warns_and_never_blocks() -> None:
    run = Run()
    report = check(run, run.next(step=1500, metrics=hf_metrics(1500)))
    assert verdicts(report)[STEP_ORDER] == "warn"
    assert report.warned and not report.blocked


def test_nan_eval_loss_alone_blocks() -> None:
    run = Run()
    metrics = {**hf_metrics(run.next_step), "eval_loss": math.nan}
    report = check(run, run.next(metrics=metrics))
    assert verdicts(report)[LOSS_FINITE] == "block" and report.blocked
    assert "eval_loss=nan" in report.reasons()[0]


def test_severities_follow_the_configuration() -> None:
    run = Run()
    rules = ValidationRules(size_severity="warn", loss_severity="warn", size_band=0.05, isolate=False)
    report = check(run, run.next(hf_files(optimizer=13_475_000_000), metrics=hf_metrics(run.next_step, math.nan)))
    assert report.blocked
    report = check(
        run, run.next(hf_files(optimizer=13_475_000_000), metrics=hf_metrics(run.next_step, math.nan)), rules
    )
    assert verdicts(report)[SIZE_BAND] == "warn" and verdicts(report)[LOSS_FINITE] == "warn"
    assert not report.blocked and "±5%" in report.reasons()[0]


def test_missing_rank_without_previous_is_caught_by_numbering() -> None:
    files = tuple(f for f in hf_files() if f[0] != "model-00004-of-00004.safetensors")
    report = validate_candidate(candidate(500, files, T0, hf_metrics(500)), [], None, RULES_DEFAULT)
    assert verdicts(report)[MISSING_RANK] == "block"
    assert "model-00004-of-00004.safetensors" in report.reasons()[0]


def test_report_round_trips_after_validation() -> None:
    run = Run()
    report = check(run, run.next(metrics=hf_metrics(run.next_step, math.nan)))
    assert ValidationReport.from_json(report.to_json()) == report
    assert "| loss_finite | loss=nan" in report.to_markdown()


def test_disabled_validation_checks_nothing() -> None:
    run = Run()
    report = check(run, run.next(metrics=hf_metrics(run.next_step, math.nan)), ValidationRules(enabled=False))
    assert not report.blocked and [r.verdict for r in report.results] == ["note"]
    assert "disabled" in report.results[0].message


def test_validation_keeps_gx_out_of_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    run = Run()
    with caplog.at_level(logging.DEBUG):
        check(run, run.next())
    assert [r for r in caplog.records if r.name.startswith("great_expectations")] == []


def test_concurrent_validations_from_threads_agree() -> None:
    run = Run()
    bad = run.next(metrics=hf_metrics(run.next_step, math.nan))
    good = run.next()
    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda c: check(run, c), [bad, good] * 4))
    assert [r.blocked for r in reports] == [True, False] * 4


# --- scale ----------------------------------------------------------------------------------------


def test_thousand_files_against_ten_thousand_checkpoints() -> None:
    """The issue's scale: 1,000 files against a history of 10,000 checkpoints. Every rule is judged
    against real history (a pass, not a "no history" note), from the last `history` verified
    checkpoints of the 10,000, and a rank missing among the 1,000 is found by name. How long it takes is
    measured by bench/micro.py validate-wide (`make bench`), not asserted here."""
    rng = random.Random(1)
    files = (*((f"__{r}_0.distcp", 2_000_000_000) for r in range(999)), (".metadata", 48_000_000))
    history = [
        state(i * 100, files, T0 + i * 600.0 * (1 + rng.uniform(-0.1, 0.1) / i), hf_metrics(i * 100))
        for i in range(1, 10_001)
    ]
    previous = manifest(1_000_000, files, T0 + 6_000_000, hf_metrics(1_000_000))
    c = candidate(1_000_100, files, T0 + 6_000_600, hf_metrics(1_000_100))
    report = validate_candidate(c, history, previous, RULES_DEFAULT)
    assert verdicts(report) == dict.fromkeys(RULES, "pass"), report.reasons()
    by_rule = {r.rule: r for r in report.results}
    assert f"of the last {RULES_DEFAULT.history} verified" in by_rule[SIZE_BAND].threshold
    assert by_rule[SHAPE].observed == "1000 files, 999 shards"
    assert by_rule[MISSING_RANK].observed == "999 shards present"
    assert by_rule[STEP_ORDER].threshold.startswith("> 1000000")

    gap = candidate(1_000_100, tuple(f for f in files if f[0] != "__500_0.distcp"), c.created_at, c.metrics)
    report = validate_candidate(gap, history, previous, RULES_DEFAULT)
    assert verdicts(report)[MISSING_RANK] == "block"
    assert "__500_0.distcp" in next(r.message for r in report.results if r.rule == MISSING_RANK)


# --- isolation: Great Expectations in a child process (the default) -------------------------------


def test_isolated_validation_agrees_and_leaves_gx_out_of_the_parent() -> None:
    """In a fresh interpreter: the default rules validate a bad and a good checkpoint in child
    processes; the verdicts match the in-process engine's, and the parent never imported GX or pandas."""
    code = """
import math, sys
from tests.unit.test_gates import Run, hf_metrics
from ckptvault.config import ValidationRules
from ckptvault.ingest.quality import validate_candidate
run = Run()
bad = run.next(metrics=hf_metrics(run.next_step, math.nan))
good = run.next()
assert ValidationRules().isolate
for c in (bad, good):
    r = validate_candidate(c, run.history, run.previous, ValidationRules())
    print(",".join(f"{x.rule}={x.verdict}" for x in r.results))
assert "great_expectations" not in sys.modules, "GX imported in the parent"
assert "pandas" not in sys.modules, "pandas imported in the parent"
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = Run()
    bad = run.next(metrics=hf_metrics(run.next_step, math.nan))
    good = run.next()
    here = [",".join(f"{x.rule}={x.verdict}" for x in check(run, c).results) for c in (bad, good)]
    assert proc.stdout.splitlines() == here
    assert "loss_finite=block" in here[0] and "block" not in here[1]


def test_a_child_that_does_not_finish_is_an_error_not_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptvault.ingest import quality_child
    from ckptvault.ingest.quality_error import QualityError

    monkeypatch.setattr(quality_child, "CHILD_TIMEOUT", 0.05)
    run = Run()
    with pytest.raises(QualityError, match=r"did not finish within 0 s.*isolate = false"):
        validate_candidate(run.next(), run.history, run.previous, ValidationRules())


def test_a_child_that_fails_is_an_error_naming_its_exit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ckptvault.ingest.quality_error import QualityError

    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ImportError: no module named great_expectations' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(broken))  # a broken install, as seen by the child
    run = Run()
    said = r"child process exited with 3: ImportError: no module named.*can `import great_expectations`"
    with pytest.raises(QualityError, match=said):
        validate_candidate(run.next(), run.history, run.previous, ValidationRules())


def test_the_child_leaves_the_optional_dependencies_out_and_agrees() -> None:
    """The gate child blocks pyarrow, sqlalchemy and boto3 (~60 MiB it never needs): it says it ran lean,
    none of them got imported, and its verdicts are the in-process engine's."""
    from ckptvault.ingest import quality_child

    run = Run()
    bad = run.next(metrics=hf_metrics(run.next_step, math.nan))
    isolated = validate_candidate(bad, run.history, run.previous, ValidationRules())
    assert quality_child.last_child["lean"] is True
    assert quality_child.last_child["blocked_loaded"] == ()
    # half of GX's import is altair's and scipy.stats': deferred, and no gate made them load
    assert set(quality_child.last_child["deferred"]) == {"altair", "scipy.stats"}
    assert quality_child.last_child["deferred_loaded"] == ()
    here = check(run, bad)
    assert [(x.rule, x.verdict) for x in isolated.results] == [(x.rule, x.verdict) for x in here.results]


def test_a_lean_import_that_fails_starts_over_with_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a future GX needed a blocked module, the child must start over with the full import, not fail:
    blocking numpy (which GX needs) forces that path."""
    from ckptvault.ingest import quality, quality_child

    monkeypatch.setenv(quality.LEAN_ENV, "numpy")
    run = Run()
    bad = run.next(metrics=hf_metrics(run.next_step, math.nan))
    isolated = validate_candidate(bad, run.history, run.previous, ValidationRules())
    assert quality_child.last_child["lean"] is False
    assert any(x.rule == "loss_finite" and x.verdict == "block" for x in isolated.results)


def test_a_prewarmed_child_is_used_once_and_an_unused_one_is_stopped() -> None:
    from ckptvault.ingest import quality, quality_child

    quality.prewarm()
    quality.prewarm()  # idempotent: still one child
    assert len(quality_child._warm) == 1
    warm = quality_child._warm[0]
    run = Run()
    report = validate_candidate(run.next(), run.history, run.previous, ValidationRules())
    assert quality_child._warm == [] and warm.returncode == 0  # the validation took it and it answered
    assert not report.blocked
    quality.prewarm()
    unused = quality_child._warm[0]
    quality.discard_prewarmed()
    assert quality_child._warm == [] and unused.returncode is not None


def test_a_deferred_module_loads_whole_at_its_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate child's stand-in for a module GX imports but no gate uses: nothing of it runs until an
    attribute is read, then the real module answers, also when the module imports itself by its dotted
    name while it loads (as scipy.stats does), and `from pkg import sub` finds it."""
    from ckptvault.ingest.quality_child_main import _defer, _Deferred, _deferred_loaded

    pkg = tmp_path / "deferpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub.py").write_text(
        "import deferpkg.sub as me\n"  # its own dotted name, mid-load
        "import deferpkg\n"
        "deferpkg.ran = getattr(deferpkg, 'ran', 0) + 1\n"
        "def twice(x):\n    return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert _defer("deferpkg.sub") is True
        assert _defer("deferpkg.sub") is False  # there already
        import deferpkg
        from deferpkg import sub

        assert isinstance(sub, _Deferred) and not hasattr(deferpkg, "ran")  # nothing of it has run
        assert _deferred_loaded(["deferpkg.sub"]) == ()
        assert sub.twice(21) == 42
        assert deferpkg.ran == 1 and _deferred_loaded(["deferpkg.sub"]) == ("deferpkg.sub",)
        assert sys.modules["deferpkg.sub"].twice is sub.twice and deferpkg.sub is sys.modules["deferpkg.sub"]
        assert _defer("no_such_module_here") is False
    finally:
        for name in ("deferpkg.sub", "deferpkg"):
            sys.modules.pop(name, None)


def test_a_submodule_of_a_deferred_package_is_an_import_error_not_a_second_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Importing a deferred package's submodule would run that submodule twice (Python reads the
    stand-in's __path__ only after checking sys.modules): an ImportError instead, which makes the gate
    child start over with the full import. find_spec answers for a deferred module as for a loaded one."""
    import importlib.util

    from ckptvault.ingest.quality_child_main import _defer

    pkg = tmp_path / "deferpkg2"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "inner" / "__init__.py").write_text("from deferpkg2.inner import part\n")
    (pkg / "inner" / "part.py").write_text("import deferpkg2\ndeferpkg2.runs = getattr(deferpkg2, 'runs', 0) + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert _defer("deferpkg2.inner") is True
        assert importlib.util.find_spec("deferpkg2.inner") is not None
        with pytest.raises(ImportError, match=r"deferpkg2\.inner: a submodule imported while it was deferred"):
            import deferpkg2.inner.part
        import deferpkg2

        assert deferpkg2.runs == 1  # the real package's own import of it, once
    finally:
        for name in ("deferpkg2.inner.part", "deferpkg2.inner", "deferpkg2"):
            sys.modules.pop(name, None)
