"""The ingest pass (ckptvault/ingest/ingest_pass.py, ingest/uploads.py) on the in-memory store, each
call a plain call through the test submitter (tests/unit/submitters.py): the order of a checkpoint's
steps, the slot scheduling (everything submitted before anything is awaited; a run's pending
checkpoints committed before its gates; inline calls committing at once), the abort of every split
upload a failed checkpoint leaves open, and the supersede bookkeeping. Each test fails if the step it
names is removed from the pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptvault.catalog import Catalog, CheckpointState
from ckptvault.config import Config, ScaleConfig, SourceConfig, StoreConfig, ValidationRules
from ckptvault.ingest import steps
from ckptvault.ingest.discovery import Found
from ckptvault.ingest.gates import ValidationReport
from ckptvault.ingest.ingest_pass import IngestPass
from ckptvault.ingest.steps import Outcome
from ckptvault.store import TransferConfig
from ckptvault.store.memory import MemoryStore
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Call, Plain

PREFIX = "t"
MiB = 2**20


def _store() -> MemoryStore:
    # 5 MiB parts, so that the synthetic checkpoint's bigger files go up as split uploads
    return MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB))


def _cfg(roots: dict[str, Path], *, split_mb: int = 0, gates: bool = False) -> Config:
    return Config(
        store=StoreConfig(bucket="ckpts", prefix=PREFIX),
        sources=[SourceConfig(run=run, path=root, format="hf", settle_seconds=0) for run, root in roots.items()],
        validation=ValidationRules(enabled=gates),
        scale=ScaleConfig(split_size_mb=split_mb),
    )


def _pass(cfg: Config, store: MemoryStore, submit: Plain) -> tuple[IngestPass, list[Outcome]]:
    """What the ingest flow does around the pass: each run's catalog state, then discovery."""
    catalog = Catalog(store, PREFIX)
    known: dict[str, dict[int, CheckpointState]] = {}
    founds: list[Found] = []
    for source in cfg.sources:
        known[source.run] = steps.known_states(catalog, source.run)
        founds += steps.find_checkpoints(source).found
    ingest_pass = IngestPass(cfg, store, catalog, "flow-run", known, submit)
    return ingest_pass, ingest_pass.run(founds)


def _step(call: Call) -> int:
    """The step a call works on, from its Found argument (-1: none)."""
    return next((a.step for a in call.args if isinstance(a, Found)), -1)


def _index(submit: Plain, name: str, step: int, kind: str = "ran") -> list[int]:
    return [i for i, (k, c) in enumerate(submit.timeline) if k == kind and c.name == name and _step(c) == step]


def test_a_checkpoint_goes_data_first_then_its_manifest_then_its_catalog_events(tmp_path: Path) -> None:
    store, submit = _store(), Plain()
    write_checkpoint(tmp_path / "r", "hf", 100, 2 * MiB, shards=1, seed=1)
    _, [outcome] = _pass(_cfg({"r": tmp_path / "r"}), store, submit)
    assert outcome.result == "uploaded", outcome.message
    names = submit.names()
    uploads = [i for i, n in enumerate(names) if n == "upload_one"]
    assert uploads and max(uploads) < names.index("commit_manifest") < names.index("append")
    assert names.index("plan_upload") < min(uploads)
    [state] = Catalog(store, PREFIX).current("r")
    assert state.verified and state.step == 100


def test_every_checkpoint_is_submitted_before_any_is_awaited_and_each_commits_after_its_own(tmp_path: Path) -> None:
    store, submit = _store(), Plain(inline=False)
    write_checkpoint(tmp_path / "a", "hf", 100, 2 * MiB, shards=1, seed=1)
    write_checkpoint(tmp_path / "b", "hf", 200, 2 * MiB, shards=1, seed=2)
    _, outcomes = _pass(_cfg({"a": tmp_path / "a", "b": tmp_path / "b"}), store, submit)
    assert [o.result for o in outcomes] == ["uploaded", "uploaded"]
    handed_out = [i for i, (k, c) in enumerate(submit.timeline) if k == "submitted" and c.name == "upload_one"]
    commits = [i for i, (k, c) in enumerate(submit.timeline) if k == "ran" and c.name == "commit_manifest"]
    assert len(commits) == 2 and max(handed_out) < min(commits)  # both checkpoints' uploads overlap
    for step in (100, 200):
        assert max(_index(submit, "upload_one", step)) < min(_index(submit, "commit_manifest", step))


def test_inline_calls_commit_each_checkpoint_before_the_next_is_planned(tmp_path: Path) -> None:
    store, submit = _store(), Plain(inline=True)
    for step in (100, 200):
        write_checkpoint(tmp_path / "r", "hf", step, 2 * MiB, shards=1, seed=step)
    _pass(_cfg({"r": tmp_path / "r"}), store, submit)
    assert _index(submit, "commit_manifest", 100) < _index(submit, "plan_upload", 200)


def test_the_gates_of_a_checkpoint_wait_for_the_runs_checkpoints_in_flight_and_see_them(tmp_path: Path) -> None:
    """The gate of step 200 judges it against the run's verified history: step 100, still in flight
    when 200 is prepared, is committed and recorded first."""
    seen_by_gate: dict[int, list[int]] = {}

    def gate(found: Found, known: dict[int, CheckpointState], previous: Any, rules: Any) -> ValidationReport:
        seen_by_gate[found.step] = sorted(s for s, st in known.items() if st.verified)
        return ValidationReport(found.run, found.step, ())

    store, submit = _store(), Plain(inline=False, instead={"quality_gate": gate})
    for step in (100, 200):
        write_checkpoint(tmp_path / "r", "hf", step, 2 * MiB, shards=1, seed=step)
    ingest_pass, outcomes = _pass(_cfg({"r": tmp_path / "r"}, gates=True), store, submit)
    assert [o.result for o in outcomes] == ["uploaded", "uploaded"]
    assert _index(submit, "commit_manifest", 100) < _index(submit, "quality_gate", 200)
    assert seen_by_gate == {100: [], 200: [100]}
    assert [r.step for r in ingest_pass.reports] == [100, 200]


def _split_checkpoint(tmp_path: Path) -> Path:
    # optimizer.pt ~11 MiB (3 parts) and model.safetensors ~5.6 MiB (2 parts): both split at 5 MiB
    write_checkpoint(tmp_path / "r", "hf", 100, 16 * MiB, shards=1, seed=1)
    return tmp_path / "r"


def _rel(call: Call) -> str:
    return next(a.file.rel for a in call.args if isinstance(a, steps.FileJob))


def test_a_failed_range_fails_the_checkpoint_and_aborts_every_split_upload(tmp_path: Path) -> None:
    store = _store()
    submit = Plain(fail=lambda c: c.name == "send_range" and _rel(c) == "optimizer.pt" and c.args[3] == 2)
    _, [outcome] = _pass(_cfg({"r": _split_checkpoint(tmp_path)}, split_mb=5), store, submit)
    assert outcome.result == "failed" and "injected: send_range failed" in outcome.message
    assert outcome.error == "Injected"  # its error class, which the metrics' ledger counts failures by
    assert submit.names().count("begin_split") == 2 and submit.names().count("abort_split") == 2
    assert store.uploads.list("") == ()  # nothing left open
    assert "commit_manifest" not in submit.names()
    assert Catalog(store, PREFIX).current("r") == []


def test_a_failed_completion_aborts_its_upload_and_the_ones_after_it(tmp_path: Path) -> None:
    store = _store()
    submit = Plain(fail=lambda c: c.name == "finish_split" and _rel(c) == "optimizer.pt")  # the first completed
    _, [outcome] = _pass(_cfg({"r": _split_checkpoint(tmp_path)}, split_mb=5), store, submit)
    assert outcome.result == "failed" and "injected: finish_split failed" in outcome.message
    aborted = [_rel_of_upload(c) for c in submit.ran if c.name == "abort_split"]
    assert aborted == ["optimizer.pt", "model.safetensors"]
    assert store.uploads.list("") == ()
    assert "commit_manifest" not in submit.names()


def _rel_of_upload(call: Call) -> str:
    return Path(call.args[1].path).name


def test_a_failed_begin_settles_and_aborts_the_split_uploads_already_begun(tmp_path: Path) -> None:
    store = _store()
    submit = Plain(inline=False, fail=lambda c: c.name == "begin_split" and _rel(c) == "model.safetensors")
    _, [outcome] = _pass(_cfg({"r": _split_checkpoint(tmp_path)}, split_mb=5), store, submit)
    assert outcome.result == "failed" and "injected: begin_split failed" in outcome.message
    ranges = [i for i, (k, c) in enumerate(submit.timeline) if k == "ran" and c.name == "send_range"]
    [abort] = [i for i, (k, c) in enumerate(submit.timeline) if k == "ran" and c.name == "abort_split"]
    assert ranges and max(ranges) < abort  # the begun upload's ranges all finished before it was aborted
    assert store.uploads.list("") == ()


def test_a_new_save_of_a_step_supersedes_the_old_one_and_says_so(tmp_path: Path) -> None:
    store = _store()
    ckpt = write_checkpoint(tmp_path / "r", "hf", 100, 2 * MiB, shards=1, seed=1)
    cfg = _cfg({"r": tmp_path / "r"})
    _pass(cfg, store, Plain())
    changed = ckpt / "config.json"
    changed.write_text('{"model_type": "changed"}')

    submit = Plain()
    ingest_pass, [outcome] = _pass(cfg, store, submit)
    assert outcome.result == "uploaded" and outcome.save == 2
    assert outcome.message.startswith("new save 2 of step 100 (") and outcome.message.endswith(
        "); save 1 kept, superseded"
    )
    [recorded] = [c.args[1] for c in submit.ran if c.name == "append"]
    assert [(e.event, e.step, e.save) for e in recorded] == [("verified", 100, 2), ("superseded", 100, 1)]
    assert ingest_pass.known["r"][100].save == 2 and ingest_pass.known["r"][100].verified
    assert [(x.state.step, x.state.save) for x in ingest_pass.restarts["r"]] == [(100, 1)]
    assert ingest_pass.recorded == recorded  # what the flow tells Prefect (ckptvault_prefect/runtime/events.py)


def test_a_quarantined_checkpoint_is_recorded_once_not_on_every_pass(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "r", "hf", 100, 1 * MiB, shards=1, seed=1)
    (ckpt / "model.safetensors").write_bytes(b"\x10" * 20)  # not a safetensors file: structurally invalid
    store, cfg = _store(), _cfg({"r": tmp_path / "r"})
    first, [outcome] = _pass(cfg, store, Plain())
    assert outcome.result == "invalid" and "model.safetensors" in outcome.message
    assert [(e.event, e.step, e.save) for e in first.recorded] == [("invalid", 100, 1)]
    again, [outcome] = _pass(cfg, store, Plain())
    assert outcome.result == "invalid" and again.recorded == []  # still blocked; nothing new to record or emit


def test_a_restart_supersedes_the_abandoned_branch_and_raises_its_alert(tmp_path: Path) -> None:
    store = _store()
    cfg = _cfg({"r": tmp_path / "r"})
    for step in (100, 200):
        write_checkpoint(tmp_path / "r", "hf", step, 2 * MiB, shards=1, seed=step)
    _pass(cfg, store, Plain())
    # the job went back to step 100 and saved step 150: its step 200 belongs to the abandoned branch
    for f in (tmp_path / "r" / "checkpoint-200").iterdir():
        f.unlink()
    (tmp_path / "r" / "checkpoint-200").rmdir()
    write_checkpoint(tmp_path / "r", "hf", 150, 2 * MiB, shards=1, seed=150)

    submit = Plain()
    ingest_pass, outcomes = _pass(cfg, store, submit)
    assert [(o.step, o.result) for o in outcomes] == [(100, "present"), (150, "uploaded")]
    superseded = [e for c in submit.ran if c.name == "append" for e in c.args[1] if e.event == "superseded"]
    assert [(e.step, e.save) for e in superseded] == [(200, 1)]
    assert ingest_pass.known["r"][200].superseded
    [alert] = ingest_pass.alerts(outcomes, None, 4)
    assert alert.kind == "run_restarted" and alert.step == 100
    assert alert.details == [f"step 200 save 1: {ingest_pass.restarts['r'][0].reason}"]


def test_the_alerts_name_each_failed_checkpoint_with_its_attempts(tmp_path: Path) -> None:
    store = _store()
    write_checkpoint(tmp_path / "r", "hf", 100, 2 * MiB, shards=1, seed=1)
    submit = Plain(fail=lambda c: c.name == "upload_one")
    ingest_pass, outcomes = _pass(_cfg({"r": tmp_path / "r"}), store, submit)
    assert [o.result for o in outcomes] == ["failed"]
    [alert] = ingest_pass.alerts(outcomes, "http://ui/run", 4)
    assert alert.kind == "ingest_failed" and alert.step == 100 and alert.flow_run_url == "http://ui/run"
    assert "commit_manifest" not in submit.names()


def test_every_library_call_the_pass_makes_has_its_task_in_the_flows_steps(tmp_path: Path) -> None:
    """The flow's submitter runs each call as the task STEPS names for it: a call missing there would
    fail only in a flow."""
    from ckptvault.ingest import nodes
    from ckptvault_prefect.tasks.ingest import STEPS

    def gate(found: Found, known: Any, previous: Any, rules: Any) -> ValidationReport:
        return ValidationReport(found.run, found.step, ())

    store, cfg = _store(), _cfg({"r": _split_checkpoint(tmp_path)}, split_mb=5, gates=True)
    asked = set()
    for fail in ("", "", "finish_split"):  # a new pass, a pass after a change, one whose completion fails
        submit = Plain(inline=False, instead={"quality_gate": gate}, fail=lambda c, f=fail: c.name == f)
        _pass(cfg, store, submit)
        asked |= {c.fn for c in submit.ran}
        (tmp_path / "r" / "checkpoint-100" / "config.json").write_text(f'{{"changed": "{fail}"}}')
    assert {steps.commit_manifest, steps.begin_split, steps.abort_split, steps.quality_gate} <= asked
    assert asked <= STEPS.keys(), asked - STEPS.keys()
    assert {nodes.list_node, nodes.validate_gathered} <= STEPS.keys()  # node-local only
