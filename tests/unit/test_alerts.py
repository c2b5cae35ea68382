"""Alert wording and Block Kit: every kind says what happened, where, what next, and links the flow run."""

from __future__ import annotations

import json

import pytest

from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.kinds import KINDS, Alert
from tests.slack_recorder import URL
from tests.slack_recorder import sample_alert as sample


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_says_what_where_next_and_links(kind: str) -> None:
    a = sample(kind)
    assert a.kind == kind
    text = a.text()
    assert a.summary in text
    assert f"Next: {a.next_step}" in text
    assert f"Flow run: {URL}" in text
    if a.run != alerts.ALL_RUNS:
        assert f"run {a.run}" in text
    if a.step is not None:
        assert f"step {a.step}" in text
    # the next step must be a real instruction, not a placeholder
    assert len(a.next_step) > 20


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_are_valid_block_kit_and_carry_the_link(kind: str) -> None:
    blocks = sample(kind).blocks()
    json.dumps(blocks)  # goes over the wire as JSON
    assert 1 <= len(blocks) <= 50
    flat = json.dumps(blocks)
    assert f"<{URL}|Open the flow run>" in flat
    for b in blocks:
        assert b["type"] in ("section", "context")
        texts = [b["text"]] if b["type"] == "section" else b["elements"]
        for t in texts:
            assert t["type"] == "mrkdwn"
            assert 0 < len(t["text"]) <= 3000


def test_without_a_flow_run_there_is_no_dangling_link() -> None:
    a = sample("ingest_failed", url=None)
    assert "Flow run:" not in a.text()
    assert "Open the flow run" not in json.dumps(a.blocks())


def test_mrkdwn_control_characters_are_escaped_in_blocks() -> None:
    a = alerts.build("restore_failed", run="r", step=1, error="expected <dict> & got <list>")
    flat = json.dumps(a.blocks())
    assert "&lt;dict&gt; &amp; got &lt;list&gt;" in flat
    assert "<dict>" not in flat
    assert "<dict>" in a.text()  # plain text stays readable on the console


def test_long_details_are_cut_and_counted() -> None:
    a = alerts.build("validation_blocked", run="r", step=1, problems=[f"problem {i} " + "x" * 1000 for i in range(25)])
    shown = a.shown_details()
    assert len(shown) == alerts.MAX_DETAILS + 1
    assert shown[-1] == "... and 15 more"
    assert all(len(d) <= alerts.MAX_DETAIL_CHARS for d in shown)


def test_dedup_key_is_kind_run_reason() -> None:
    a = alerts.build("ingest_failed", run="r", step=10, error="boom", attempts=3)
    assert a.dedup_key() == alerts.build("ingest_failed", run="r", step=10, error="other error", attempts=5).dedup_key()
    assert a.dedup_key() != alerts.build("ingest_failed", run="r", step=11, error="boom", attempts=3).dedup_key()
    assert a.dedup_key() != alerts.build("ingest_failed", run="q", step=10, error="boom", attempts=3).dedup_key()
    assert a.dedup_key() != alerts.build("restore_failed", run="r", step=10, error="boom").dedup_key()


def test_flow_failures_with_different_errors_are_different_alerts() -> None:
    a = alerts.build("flow_failed", flow="ingest", state="Failed", message="KeyError: 'x'\ntraceback...")
    b = alerts.build("flow_failed", flow="ingest", state="Failed", message="TimeoutError\n...")
    assert a.dedup_key() != b.dedup_key()
    assert (
        a.dedup_key()
        == alerts.build("flow_failed", flow="ingest", state="Failed", message="KeyError: 'x'\nother tail").dedup_key()
    )


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown alert kind 'ingest_fail'"):
        Alert("ingest_fail", "r", 1, "s", [], "n", "error")
    with pytest.raises(ValueError, match="unknown alert kind 'ingest_fail'"):
        alerts.build("ingest_fail", run="r", step=1)


def test_a_fact_missing_or_not_the_kinds_is_refused_where_it_is_given() -> None:
    with pytest.raises(TypeError, match=r"^alert ingest_failed: missing attempts$"):
        alerts.build("ingest_failed", run="r", step=1, error="boom")
    with pytest.raises(TypeError, match=r"^alert restore_failed: missing error; not one of its facts: eror$"):
        alerts.build("restore_failed", run="r", step=1, eror="boom")
    # an optional fact may be left out or given
    assert alerts.build("budget_exceeded", monthly_usd=2.0, budget=1.0).run == alerts.ALL_RUNS
    assert alerts.build("budget_exceeded", monthly_usd=2.0, budget=1.0, run="r").run == "r"


def test_every_kind_names_the_facts_its_words_use() -> None:
    """Each kind built from exactly the facts it takes (sample_alert's) renders without a KeyError: no
    template or formatter reads a fact its entry does not take, derive or default."""
    for kind in KINDS:
        assert sample(kind).kind == kind


T0 = 1_790_000_000.0


def test_stale_message_names_the_gap_and_the_setting() -> None:
    a = alerts.build("run_stale", run="llama-7b", newest_at=T0, stale_after_hours=2.0, now=T0 + 5 * 3600, step=12000)
    assert "no checkpoint for 5.0 h" in a.summary
    assert any("step 12000" in d for d in a.details)
    assert any("stale_after_hours" in d for d in a.details)
    assert a.severity == "warning"


def test_drill_digest_severity_follows_failures() -> None:
    ok = alerts.build("drill_digest", passed=[("a", 1), ("b", 2)], failed=[])
    bad = alerts.build("drill_digest", passed=[("a", 1)], failed=[("b", 2)])
    assert (ok.severity, bad.severity) == ("info", "warning")
    assert ok.summary == "Restore drills: 2 of 2 passed"
    assert bad.summary == "Restore drills: 1 of 2 passed, 1 FAILED"
    assert bad.details[0] == "FAILED: b step 2"


def test_tier_digest_states_the_money_saved() -> None:
    a = sample("tier_applied")
    assert "4 checkpoints moved (48.0 GB)" in a.summary
    assert "$12.50/month" in a.summary


def test_a_failed_restore_names_its_run_and_step_never_all_runs() -> None:
    a = alerts.build(
        "flow_failed",
        flow="restore",
        state="Failed",
        message="RestoreError: 1 of 3 files failed",
        run="llama",
        step=300,
    )
    assert (a.run, a.step) == ("llama", 300)
    assert "llama step 300" in a.summary and "(all runs)" not in a.text()
