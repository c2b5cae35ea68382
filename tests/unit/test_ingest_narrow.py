"""`ingest --run R --step S` (ckptvault/ingest/narrow.py): only that run's source, only that step; the
commit rule judged as always (a hook's word is a hint), settle_seconds skipped only where the format's
commit marker proves the save finished. The pass itself on the in-memory store."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ckptvault.catalog import Catalog, CheckpointState
from ckptvault.config import Config, SourceConfig, StoreConfig, ValidationRules
from ckptvault.ingest import steps
from ckptvault.ingest.ingest_pass import IngestPass
from ckptvault.ingest.narrow import (
    COMMIT_MARKERS,
    SETTLE_WAIT_MAX_SECONDS,
    UnknownRunError,
    commit_time,
    find_step,
    find_step_settled,
    find_steps,
    find_steps_settled,
    named_steps,
    narrow_sources,
    skips_settle,
    waits,
    waits_all,
)
from ckptvault.ingest.steps import Outcome
from ckptvault.store.memory import MemoryStore
from ckptvault_cli import main as cli_main
from ckptvault_cli import running, synthetic
from ckptvault_cli.commands import ingest as ingest_cmd
from ckptvault_cli.parser import build_parser
from ckptvault_cli.preflight import EXIT_OK, EXIT_USAGE, EXIT_WAITING, UsageError
from tests.unit.submitters import Plain

SIZE = 64 << 10
SETTLE = 600.0  # far longer than a test: a checkpoint written just now is never settled by it
PREFIX = "t"


def _source(root: Path, fmt: str, run: str = "r") -> SourceConfig:
    return SourceConfig(run=run, path=root, format=fmt, settle_seconds=SETTLE)


def test_no_run_keeps_every_source_and_a_run_keeps_only_its_own(tmp_path: Path) -> None:
    a, b = _source(tmp_path / "a", "hf", "a"), _source(tmp_path / "b", "hf", "b")
    assert narrow_sources([a, b], None) == [a, b]
    assert narrow_sources([a, b], "b") == [b]


def test_an_unknown_run_is_refused_naming_the_configured_runs(tmp_path: Path) -> None:
    sources = [_source(tmp_path / "a", "hf", "alpha"), _source(tmp_path / "b", "hf", "beta")]
    with pytest.raises(UnknownRunError) as e:
        narrow_sources(sources, "gamma")
    assert "'gamma'" in str(e.value) and "alpha, beta" in str(e.value)


def test_the_formats_that_skip_settle_are_those_whose_marker_is_written_last() -> None:
    assert {f for f in synthetic.FORMATS if skips_settle(f)} == {"hf", "dcp", "megatron", "nemo", "orbax"}
    assert set(COMMIT_MARKERS) <= set(synthetic.FORMATS)
    # deepspeed's `latest` is written with no barrier, lightning's .ckpt has no marker: they settle
    assert not skips_settle("deepspeed") and not skips_settle("lightning")


@pytest.mark.parametrize("fmt", sorted(COMMIT_MARKERS))
def test_a_named_step_with_its_commit_marker_is_ready_at_once(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path, fmt, 100, SIZE)
    synthetic.write_checkpoint(tmp_path, fmt, 200, SIZE)
    now = time.time()
    # the scheduled pass waits for settle_seconds ...
    assert not any(f.ready for f in steps.find_checkpoints(_source(tmp_path, fmt), now).found)
    # ... a named step does not, and only that step is there
    res = find_step(_source(tmp_path, fmt), 200, now)
    assert [(f.step, f.ready, f.reason) for f in res.found] == [(200, True, "")]


@pytest.mark.parametrize("fmt", ["deepspeed", "lightning"])
def test_a_named_step_without_a_marker_format_still_settles(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path, fmt, 300, SIZE)
    (f,) = find_step(_source(tmp_path, fmt), 300, time.time()).found
    assert not f.ready and "settle_seconds" in f.reason
    (f,) = find_step(_source(tmp_path, fmt), 300, time.time() + SETTLE + 1).found
    assert f.ready


class _Clock:
    """A clock that sleeping moves on, from the files' own mtime: what find_step_settled waited is `slept`."""

    def __init__(self, start: float) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _newest(root: Path) -> float:
    return max(p.stat().st_mtime for p in root.rglob("*") if p.is_file())


def test_a_named_lightning_step_is_waited_for_until_it_settles_when_that_is_soon(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "lightning", 300, SIZE)
    clock = _Clock(_newest(tmp_path) + 1)
    source = SourceConfig(run="r", path=tmp_path, format="lightning", settle_seconds=30)
    (f,) = find_step_settled(source, 300, clock, clock.sleep).found
    # one wait, to a tenth past the settle time (29 s left at the first look), then ready
    assert f.ready and f.reason == "" and clock.slept == [pytest.approx(29.1)]


def test_a_named_step_whose_settle_time_is_far_off_is_not_waited_for(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "lightning", 300, SIZE)
    clock = _Clock(_newest(tmp_path))
    source = SourceConfig(run="r", path=tmp_path, format="lightning", settle_seconds=SETTLE_WAIT_MAX_SECONDS + 1)
    (f,) = find_step_settled(source, 300, clock, clock.sleep).found
    assert not f.ready and "settle_seconds" in f.reason and clock.slept == []


@pytest.mark.parametrize("fmt", ["hf", "lightning"])
def test_nothing_is_waited_for_where_the_commit_rule_fails_or_the_marker_is_the_proof(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path / "done", fmt, 100, SIZE)
    synthetic.write_checkpoint(tmp_path / "half", fmt, 100, SIZE, complete=False)
    for root in (tmp_path / "done", tmp_path / "half"):
        clock = _Clock(_newest(root))
        source = SourceConfig(run="r", path=root, format=fmt, settle_seconds=30)
        found = find_step_settled(source, 100, clock, clock.sleep).found
        done = root.name == "done"
        # an unfinished save waits for its writer, not for a clock; hf's marker needs no settle time
        assert bool(clock.slept) == (done and fmt == "lightning")
        assert any(f.ready for f in found) == done


@pytest.mark.parametrize("fmt", synthetic.FORMATS)
def test_a_named_step_whose_commit_rule_fails_waits_however_long_it_is_quiet(tmp_path: Path, fmt: str) -> None:
    synthetic.write_checkpoint(tmp_path, fmt, 400, SIZE, complete=False)
    res = find_step(_source(tmp_path, fmt), 400, time.time() + 10 * SETTLE)
    assert [f.ready for f in res.found if f.step == 400] in ([False], [])


def test_a_step_that_is_not_there_is_a_problem_and_waits(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "hf", 100, SIZE)
    res = find_step(_source(tmp_path, "hf"), 999, time.time())
    assert res.found == []
    assert any("step 999" in p for p in res.problems)
    assert "step 999" in waits([], "r", 999) and "waits" in waits([], "r", 999)


def test_waits_says_why_for_a_waiting_outcome_and_nothing_for_an_uploaded_one() -> None:
    waiting = Outcome("r", 5, "hf", "waiting", message="no trainer_state.json yet")
    assert "no trainer_state.json yet" in waits([waiting], "r", 5)
    assert waits([Outcome("r", 5, "hf", "uploaded")], "r", 5) == ""
    assert waits([Outcome("r", 5, "hf", "present")], "r", 5) == ""


def _narrow_pass(cfg: Config, store: MemoryStore, run: str, step: int | list[int]) -> list[Outcome]:
    """What the ingest flow does with run and step (or steps) given: the narrowed sources, find_step(s),
    one catalog read per source, one pass."""
    catalog = Catalog(store, PREFIX)
    known: dict[str, dict[int, CheckpointState]] = {}
    founds = []
    for source in narrow_sources(cfg.sources, run):
        known[source.run] = steps.known_states(catalog, source.run)
        if isinstance(step, int):
            founds += find_step(source, step, time.time()).found
        else:
            founds += find_steps(source, step, time.time()).found
    return IngestPass(cfg, store, catalog, "flow-run", known, Plain()).run(founds)


def test_the_narrowed_pass_uploads_only_the_named_step_of_the_named_run(tmp_path: Path) -> None:
    for run in ("a", "b"):
        for step in (100, 200):
            synthetic.write_checkpoint(tmp_path / run, "hf", step, SIZE)
    cfg = Config(
        store=StoreConfig(bucket="ckpts", prefix=PREFIX),
        sources=[_source(tmp_path / "a", "hf", "a"), _source(tmp_path / "b", "hf", "b")],
        validation=ValidationRules(enabled=False),
    )
    store = MemoryStore("ckpts")
    outcomes = _narrow_pass(cfg, store, "b", 200)
    assert [(o.run, o.step, o.result) for o in outcomes] == [("b", 200, "uploaded")]
    assert waits(outcomes, "b", 200) == ""
    states = Catalog(store, PREFIX).current("b")
    assert {s.step for s in states} == {200}
    assert Catalog(store, PREFIX).current("a") == []


def test_one_narrowed_pass_over_two_named_steps_uploads_those_two_only(tmp_path: Path) -> None:
    for step in (100, 200, 300, 400):
        synthetic.write_checkpoint(tmp_path / "b", "hf", step, SIZE)
    synthetic.write_checkpoint(tmp_path / "a", "hf", 200, SIZE)
    cfg = Config(
        store=StoreConfig(bucket="ckpts", prefix=PREFIX),
        sources=[_source(tmp_path / "a", "hf", "a"), _source(tmp_path / "b", "hf", "b")],
        validation=ValidationRules(enabled=False),
    )
    store = MemoryStore("ckpts")
    outcomes = _narrow_pass(cfg, store, "b", [300, 200, 300])  # a step named twice is taken once
    assert sorted((o.run, o.step, o.result) for o in outcomes) == [("b", 200, "uploaded"), ("b", 300, "uploaded")]
    assert waits_all(outcomes, "b", [300, 200]) == []
    assert {s.step for s in Catalog(store, PREFIX).current("b")} == {200, 300}
    assert Catalog(store, PREFIX).current("a") == []
    # one of two named steps missing: the other is judged alone and archived, the missing one waits
    outcomes = _narrow_pass(cfg, store, "b", [400, 999])
    assert [(o.step, o.result) for o in outcomes] == [(400, "uploaded")]
    (why,) = waits_all(outcomes, "b", [400, 999])
    assert "step 999" in why and "waits" in why


def test_named_steps_each_keep_their_own_rule_in_one_discovery(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "hf", 100, SIZE)
    synthetic.write_checkpoint(tmp_path, "hf", 200, SIZE, complete=False)
    res = find_steps(_source(tmp_path, "hf"), [100, 200, 300], time.time())
    assert [(f.step, f.ready) for f in res.found] == [(100, True), (200, False)]
    assert any("step 300" in p for p in res.problems)
    assert named_steps(5, [7, 5, 9]) == [5, 7, 9] and named_steps(None, None) == []


def test_several_named_lightning_steps_are_waited_for_once_until_the_last_settles(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "lightning", 300, SIZE)
    synthetic.write_checkpoint(tmp_path, "lightning", 400, SIZE)
    clock = _Clock(_newest(tmp_path) + 1)
    source = SourceConfig(run="r", path=tmp_path, format="lightning", settle_seconds=30)
    res = find_steps_settled(source, [300, 400], clock, clock.sleep)
    assert [(f.step, f.ready) for f in res.found] == [(300, True), (400, True)]
    assert len(clock.slept) == 1 and clock.slept[0] <= 29.1 + 1e-6


def test_the_narrowed_pass_uploads_nothing_of_a_step_whose_marker_is_missing(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "hf", 100, SIZE, complete=False)
    cfg = Config(
        store=StoreConfig(bucket="ckpts", prefix=PREFIX),
        sources=[_source(tmp_path, "hf")],
        validation=ValidationRules(enabled=False),
    )
    store = MemoryStore("ckpts")
    outcomes = _narrow_pass(cfg, store, "r", 100)
    assert [(o.step, o.result) for o in outcomes] == [(100, "waiting")]
    assert "trainer_state.json" in waits(outcomes, "r", 100)
    assert list(store.list(f"{PREFIX}/")) == []


def _cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, result: object, **flags: Any) -> tuple[int, dict[str, Any]]:
    """cmd_ingest with the config's preflight and the flow replaced: what the command makes of them."""
    cfg = SimpleNamespace(sources=[_source(tmp_path, "hf", "alpha")], validation=SimpleNamespace(enabled=False))
    monkeypatch.setattr(ingest_cmd, "preflight_store", lambda args, need_sources, config_read=None: (cfg, None))
    monkeypatch.setattr(ingest_cmd, "preflight_runner", lambda *a, **k: SimpleNamespace(needs_prefect=False))
    monkeypatch.setattr(ingest_cmd, "start_prefect_note", lambda force_prefect=False: None)
    params: dict[str, Any] = {}

    def run_flow(flow: object, workers: int, **kw: Any) -> object:
        params.update(kw)
        return result

    def run_direct(body: object, name: str, workers: int, **kw: Any) -> object:  # no Prefect API: the body
        return run_flow(body, workers, **kw)

    monkeypatch.setattr(running, "run_flow", run_flow)
    monkeypatch.setattr(running, "run_direct", run_direct)
    args = argparse.Namespace(config=None, dask_address=None, dask_workers=None, json=False, **flags)
    return ingest_cmd.cmd_ingest(args), params


def test_the_command_refuses_an_unknown_run_naming_the_configured_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(UsageError, match="configured runs: alpha"):
        _cli(monkeypatch, tmp_path, [], run="beta", step=[5])
    with pytest.raises(UsageError, match="--step needs --run"):
        _cli(monkeypatch, tmp_path, [], run=None, step=[5])


def test_the_command_hands_run_and_step_to_the_flow_and_exits_3_while_the_step_waits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    waiting = Outcome("alpha", 5, "hf", "waiting", message="no trainer_state.json yet")
    code, params = _cli(monkeypatch, tmp_path, [waiting], run="alpha", step=[5])
    assert code == EXIT_WAITING and (params["run"], params["step"]) == ("alpha", 5)
    assert "step 5 waits, nothing uploaded: no trainer_state.json yet" in capsys.readouterr().err
    code, _ = _cli(monkeypatch, tmp_path, [Outcome("alpha", 5, "hf", "uploaded")], run="alpha", step=[5])
    assert code == EXIT_OK


def test_step_is_parsed_once_or_several_times() -> None:
    parser = build_parser()
    assert parser.parse_args(["ingest", "--run", "r", "--step", "5"]).step == [5]
    assert parser.parse_args(["ingest", "--run", "r", "--step", "5", "--step", "7"]).step == [5, 7]
    assert parser.parse_args(["ingest", "--run", "r"]).step is None


@pytest.mark.parametrize("flags", [["--step", "5"], ["--step", "5", "--step", "7"]])
def test_step_without_run_exits_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["ingest", *flags]) == EXIT_USAGE == 2
    assert "--step needs --run" in capsys.readouterr().err


def test_the_command_hands_several_steps_to_the_flow_and_says_which_waits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    done = Outcome("alpha", 5, "hf", "uploaded")
    waiting = Outcome("alpha", 7, "hf", "waiting", message="no trainer_state.json yet")
    code, params = _cli(monkeypatch, tmp_path, [done, waiting], run="alpha", step=[5, 7, 5])
    assert code == EXIT_WAITING and (params["run"], params["step"], params["steps"]) == ("alpha", None, [5, 7])
    out, err = capsys.readouterr()
    assert "alpha step 5" in out and "alpha step 7" in out  # one line per step
    assert "step 7 waits, nothing uploaded: no trainer_state.json yet" in err and "step 5 " not in err
    code, params = _cli(monkeypatch, tmp_path, [done, Outcome("alpha", 7, "hf", "present")], run="alpha", step=[5, 7])
    assert code == EXIT_OK
    code, params = _cli(monkeypatch, tmp_path, [done], run="alpha", step=[5])
    assert code == EXIT_OK and params["step"] == 5 and "steps" not in params  # one step: as before


def test_the_verified_event_records_the_rpo_from_the_commit_marker_to_the_manifest(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "hf", 100, SIZE)
    ckpt = next(p for p in tmp_path.iterdir() if p.is_dir())
    marker = ckpt / "trainer_state.json"
    hour_ago = time.time() - 3600
    # the marker committed an hour ago; a file touched since (not part of the save's commit) is newer
    os.utime(marker, (hour_ago, hour_ago))
    (found,) = find_step(_source(tmp_path, "hf"), 100, time.time()).found
    assert commit_time(found) == marker.stat().st_mtime < found.newest_mtime
    cfg = Config(
        store=StoreConfig(bucket="ckpts", prefix=PREFIX),
        sources=[_source(tmp_path, "hf")],
        validation=ValidationRules(enabled=False),
    )
    store = MemoryStore("ckpts")
    assert [o.result for o in _narrow_pass(cfg, store, "r", 100)] == ["uploaded"]
    (ev,) = [e for e in Catalog(store, PREFIX).events("r") if e.event == "verified"]
    detail = json.loads(ev.detail)
    assert detail["rpo_seconds"] == round(detail["uploaded_at"] - marker.stat().st_mtime, 3)
    assert detail["rpo_seconds"] >= 3600
    # the upload's share of it: from the first file's sending to the commit, this pass's seconds only
    assert 0 <= detail["upload_seconds"] < 3600 and detail["upload_seconds"] <= detail["rpo_seconds"]


def test_without_a_marker_file_the_commit_time_is_the_newest_file(tmp_path: Path) -> None:
    synthetic.write_checkpoint(tmp_path, "deepspeed", 100, SIZE)
    (found,) = find_step(_source(tmp_path, "deepspeed"), 100, time.time() + SETTLE + 1).found
    assert commit_time(found) == found.newest_mtime == max(f.mtime for f in found.files)
