"""`ckptvault follow`'s decisions (ckptvault/ingest/follow.py): a scan's committed steps are ingested
once each; a step that waits or failed is looked at again only after its retry time; a finished one
never again. And the scan itself: the commit rule read from the listing, an incomplete save not due."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckptvault.config import SourceConfig
from ckptvault.ingest.follow import FollowState, committed_steps, due, settle
from ckptvault_cli import synthetic
from ckptvault_cli.preflight import UsageError


def test_new_steps_are_due_once_each_in_order_and_done_ones_never_again() -> None:
    state = FollowState()
    assert due(state, {"b": [5], "a": [20, 10, 10]}, 0.0) == [("a", 10), ("a", 20), ("b", 5)]
    settle(state, ("a", 10), "uploaded", 1.0, 30.0)
    settle(state, ("a", 20), "present", 1.0, 30.0)
    settle(state, ("b", 5), "invalid", 1.0, 30.0)  # the same bytes fail the same gate: not retried
    assert due(state, {"a": [10, 20, 30], "b": [5]}, 2.0) == [("a", 30)]


def test_a_waiting_or_failed_step_is_retried_only_after_its_retry_time() -> None:
    state = FollowState()
    settle(state, ("r", 1), "waiting", 100.0, 30.0)
    settle(state, ("r", 2), "failed", 100.0, 5.0)
    assert due(state, {"r": [1, 2]}, 104.9) == []
    assert due(state, {"r": [1, 2]}, 105.0) == [("r", 2)]
    assert due(state, {"r": [1, 2]}, 130.0) == [("r", 1), ("r", 2)]
    settle(state, ("r", 1), "uploaded", 131.0, 30.0)
    assert state.retry_at == {("r", 2): 105.0} and due(state, {"r": [1, 2]}, 200.0) == [("r", 2)]


def test_the_scan_reads_the_commit_rule_and_says_when_the_root_is_not_there(tmp_path: Path) -> None:
    root = tmp_path / "hot"
    src = SourceConfig(run="r", path=root, format="hf", settle_seconds=600.0)
    steps, problems = committed_steps(src)
    assert steps == set() and problems == [f"run 'r': {root} is not a readable directory yet"]
    synthetic.write_checkpoint(root, "hf", 100, 4096)
    synthetic.write_checkpoint(root, "hf", 200, 4096, complete=False)  # no trainer_state.json yet
    steps, problems = committed_steps(src)
    # committed regardless of settle_seconds: the ingest it starts applies the settle time itself
    assert steps == {100} and problems == []


def test_the_command_refuses_a_bad_poll_interval_and_an_unknown_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ckptvault_cli.commands import follow as follow_cmd

    cfg = SimpleNamespace(sources=[SourceConfig(run="alpha", path=tmp_path, format="hf")])
    monkeypatch.setattr(follow_cmd, "preflight", lambda args, need_sources: cfg)
    with pytest.raises(UsageError, match="--poll-seconds 0: give a positive number"):
        follow_cmd.cmd_follow(argparse.Namespace(config=None, run=None, poll_seconds=0.0))
    with pytest.raises(UsageError, match="configured runs: alpha"):
        follow_cmd.cmd_follow(argparse.Namespace(config=None, run="beta", poll_seconds=5.0))
