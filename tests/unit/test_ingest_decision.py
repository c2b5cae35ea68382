"""The ingest decision, every branch, without Prefect or a server; and the saves rules beside it."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from ckptvault.catalog import CheckpointState, Event, fold
from ckptvault.catalog.saves import FileDiff, diff_files, restart_point, superseded_by
from ckptvault.checkpoint.local_files import LocalFile
from ckptvault.checkpoint.manifest import FileEntry
from ckptvault.ingest.decision import (
    FINAL,
    Decision,
    Seen,
    decide,
    gates_wait_for_run,
    present_without_nodes,
    records_rejection,
)


def state(step: int = 300, save: int = 1, *events: str, created: float = 1000.0, **kw: Any) -> CheckpointState:
    """The fold of the named events (default: verified) for (r, step, save)."""
    kinds = events or ("verified",)
    evs = [Event("r", step, k, 2000.0 + i, save=save, created_at=created) for i, k in enumerate(kinds)]
    [s] = fold(evs)
    return replace(s, **kw) if kw else s


FP = "f" * 32


def run_to_end(seen: Seen, answers: dict[str, dict[str, Any]]) -> tuple[Decision, list[str]]:
    """Drive `decide` like the flow: answer each question from `answers`, record what was asked."""
    asked = []
    while not (d := decide(seen)).final:
        asked.append(d.action)
        seen = seen.learn(**answers[d.action])
    return d, asked


NO_COMMIT = {"check_commit": {"committed": False}}
PASSES = {"validate": {"problems": ()}}


def test_not_ready_waits_and_asks_nothing() -> None:
    d, asked = run_to_end(Seen(ready=False, reason="no commit marker"), {})
    assert (d.action, d.message, asked) == ("waiting", "no commit marker", [])


def test_new_step_checks_the_store_then_validates_then_uploads_save_1() -> None:
    d, asked = run_to_end(Seen(ready=True), {**NO_COMMIT, **PASSES})
    assert (d.action, d.save, d.supersedes, asked) == ("upload", 1, None, ["check_commit", "validate"])


def test_new_step_already_committed_by_a_crashed_run_is_recorded_not_resent() -> None:
    d, asked = run_to_end(Seen(ready=True), {"check_commit": {"committed": True}})
    assert (d.action, d.save, asked) == ("record_committed", 1, ["check_commit"])


def test_blocked_by_a_gate_is_invalid_with_every_reason() -> None:
    d, _ = run_to_end(Seen(ready=True), {**NO_COMMIT, "validate": {"problems": ("a: empty", "b: missing")}})
    assert (d.action, d.message) == ("invalid", "a: empty; b: missing")


def test_warnings_upload_with_the_reasons() -> None:
    d, _ = run_to_end(Seen(ready=True), {**NO_COMMIT, "validate": {"problems": (), "warnings": ("loss jumped",)}})
    assert (d.action, d.message) == ("upload", "loss jumped")


def test_accepted_skips_the_gates() -> None:
    d, asked = run_to_end(Seen(ready=True, newest=state(300, 1, "invalid", "accepted")), NO_COMMIT)
    assert (d.action, asked) == ("upload", ["check_commit"])


def test_quarantined_is_validated_again_and_recorded_once() -> None:
    quarantined = state(300, 1, "invalid")
    seen = Seen(ready=True, newest=quarantined)
    d, asked = run_to_end(seen, {**NO_COMMIT, "validate": {"problems": ("x",)}})
    assert (d.action, asked) == ("invalid", ["check_commit", "validate"])
    assert not records_rejection(seen)
    assert records_rejection(Seen(ready=True)) and records_rejection(Seen(ready=True, newest=state()))


def test_unchanged_committed_checkpoint_is_present_without_a_request() -> None:
    seen = Seen(ready=True, newest=state(), local_fingerprint=FP, catalog_fingerprint=FP)
    d, asked = run_to_end(seen, {})
    assert (d.action, d.save, asked) == ("present", 1, [])


@pytest.mark.parametrize("catalog_fp", [None, "0" * 32])
def test_unknown_or_other_fingerprint_reads_the_manifest(catalog_fp: str | None) -> None:
    seen = Seen(ready=True, newest=state(), local_fingerprint=FP, catalog_fingerprint=catalog_fp)
    d, asked = run_to_end(seen, {"load_manifest": {"diff": FileDiff()}})
    assert (d.action, asked) == ("present", ["load_manifest"])


def test_a_rewritten_step_becomes_the_next_save() -> None:
    seen = Seen(ready=True, newest=state(300, 2), local_fingerprint=FP)
    d, asked = run_to_end(
        seen, {"load_manifest": {"diff": FileDiff(changed=("model.safetensors",))}, **NO_COMMIT, **PASSES}
    )
    assert (d.action, d.save, d.supersedes) == ("upload", 3, 2)
    assert "1 changed (model.safetensors)" in d.changes
    assert asked == ["load_manifest", "check_commit", "validate"]


def test_a_new_save_committed_before_a_crash_is_recorded() -> None:
    seen = Seen(ready=True, newest=state(), local_fingerprint=FP)
    d, _ = run_to_end(
        seen, {"load_manifest": {"diff": FileDiff(added=("extra.bin",))}, "check_commit": {"committed": True}}
    )
    assert (d.action, d.save) == ("record_committed", 2)


def test_files_only_missing_locally_are_not_a_new_save() -> None:
    seen = Seen(ready=True, newest=state(), local_fingerprint=FP)
    d, _ = run_to_end(seen, {"load_manifest": {"diff": FileDiff(removed=("shard-2.bin",))}})
    assert (d.action, d.save) == ("present", 1)
    assert "local copy incomplete" in d.message and "shard-2.bin" in d.message


@pytest.mark.parametrize(
    ("events", "why"),
    [(("verified", "evicted_local"), "evicted"), (("verified", "expired"), "retention policy")],
)
def test_evicted_or_expired_is_present_whatever_the_disk_shows(events: tuple[str, ...], why: str) -> None:
    d = decide(Seen(ready=True, newest=state(300, 1, *events), local_fingerprint=FP))
    assert d.action == "present" and why in d.message


def test_every_path_ends_in_a_final_action() -> None:
    """Exhaustive over the inputs that steer the decision: no combination loops or asks twice."""
    newest_options = [
        None,
        state(),
        state(300, 1, "invalid"),
        state(300, 1, "invalid", "accepted"),
        state(300, 2, "verified", "superseded"),
        state(300, 1, "verified", "drilled"),
        state(300, 1, "discovered"),
    ]
    diffs = [FileDiff(), FileDiff(changed=("a",)), FileDiff(removed=("a",))]
    for newest, fp, diff, committed, problems in itertools.product(
        newest_options, [None, FP], diffs, [False, True], [(), ("bad",)]
    ):
        seen = Seen(ready=True, newest=newest, local_fingerprint=FP, catalog_fingerprint=fp)
        answers = {
            "load_manifest": {"diff": diff},
            "check_commit": {"committed": committed},
            "validate": {"problems": problems},
        }
        d, asked = run_to_end(seen, answers)
        assert d.action in FINAL and len(asked) == len(set(asked)), (newest, fp, diff, committed, problems)
        if d.action in ("upload", "record_committed") and newest is not None and newest.verified:
            assert d.save == newest.save + 1  # a committed save is never written over


def local(rel: str, size: int = 10, mtime: float = 5.0) -> LocalFile:
    return LocalFile(rel, f"/x/{rel}", size, mtime)


def entry(rel: str, size: int = 10, mtime: float = 5.0) -> FileEntry:
    return FileEntry(rel, size, mtime, "AAAAAA==")


def test_diff_files_by_path_size_and_mtime() -> None:
    d = diff_files(
        [local("a"), local("b", size=11), local("c", mtime=6.0), local("new")],
        [entry("a"), entry("b"), entry("c"), entry("gone")],
    )
    assert (d.added, d.removed, d.changed) == (("new",), ("gone",), ("b", "c"))
    assert d.is_new_save and not d.same
    # a float mtime through JSON, or a file system's microseconds, is the same mtime
    assert diff_files([local("a", mtime=5.0000004)], [entry("a")]).same


def test_superseded_by_a_resave_and_by_a_restart() -> None:
    run = [
        state(100, created=100.0),
        state(200, created=200.0),
        state(300, created=300.0),
        state(400, created=400.0),
        state(500, created=900.0),  # written after the new save of 300: another branch, left alone
        state(600, 1, "verified", "superseded", created=50.0),  # already superseded
    ]
    out = superseded_by(run, 300, 2, 800.0, "1 changed (w.bin)")
    assert [(x.state.step, x.state.save) for x in out] == [(300, 1), (400, 1)]
    assert "saved again as save 2: 1 changed (w.bin)" in out[0].reason
    assert "restarted from before step 300" in out[1].reason
    # a new step below the newest ("the run's newest step goes down") supersedes the later steps
    assert [x.state.step for x in superseded_by(run[:4], 250, 1, 800.0)] == [300, 400]
    # the normal course: a new step above everything supersedes nothing
    assert superseded_by(run[:4], 500, 1, 800.0) == []
    assert restart_point(run, 300) == 200 and restart_point(run, 100) is None


def test_replay_supersedes_finds_what_the_commits_recorded() -> None:
    """A catalog rebuilt from manifests alone learns again which saves are current."""
    from ckptvault.catalog.saves import replay_supersedes

    history = [
        state(100, created=100.0),
        state(200, created=200.0),
        state(300, 1, created=300.0),
        state(400, created=400.0),
        state(300, 2, created=800.0),  # the restart re-saved 300
        state(400, 2, created=900.0),  # and then 400
    ]
    out = replay_supersedes(history)
    assert sorted((x.state.step, x.state.save, x.by) for x in out) == [(300, 1, (300, 2)), (400, 1, (300, 2))]


def test_a_node_local_checkpoint_a_node_cannot_list_stays_present_only_when_committed() -> None:
    why = "r step 300: no Dask worker for node-2"
    kept = present_without_nodes(state(300, 2), why)
    assert kept is not None and (kept.action, kept.save, kept.final) == ("present", 2, True)
    assert why in kept.message and "committed save 2 holds" in kept.message
    assert present_without_nodes(state(300, 1, "verified", "expired"), why) is not None  # expired: was stored
    # nothing of the step committed (unknown, invalid, or uploaded but never verified): the failure stands
    assert present_without_nodes(None, why) is None
    assert present_without_nodes(state(300, 1, "invalid"), why) is None
    assert present_without_nodes(state(300, 1, "discovered", "uploaded"), why) is None  # never verified


def test_the_gates_of_a_run_wait_for_that_runs_uploads_in_flight_only() -> None:
    # checkpoints 0 and 3 of run a, 2 of run b still uploading; 1 finished (None)
    pending = ["a", None, "b", "a"]
    assert gates_wait_for_run(pending, "a") == [0, 3]  # either may become the newest verified below
    assert gates_wait_for_run(pending, "b") == [2]
    assert gates_wait_for_run(pending, "c") == []  # another run's uploads go on
