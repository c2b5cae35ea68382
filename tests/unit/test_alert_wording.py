"""Every alert's words, pinned: each kind built from realistic facts (both sides of every choice in its
wording) must give exactly the alert recorded in alert_wording.json, every field of it.

The wording is written for the on-call engineer (ckptvault/alerts/alert.py) and the dedup reason decides
what is sent again: a change to either is deliberate, so it shows here as a diff of the recorded file.
`python -m tests.unit.test_alert_wording` rewrites the file from the code, for such a change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from ckptvault.alerts.kinds import ALL_RUNS, KINDS, Alert, build
from tests.slack_recorder import T0, URL, sample_alert

RECORDED = Path(__file__).with_name("alert_wording.json")
LONG = [f"shard-{i:05d}.safetensors: no Object Lock retention (ckptvault set 2027-01-02)" for i in range(12)]

# name -> the alert, beside sample_alert's one of each kind
CASES: dict[str, Callable[[], Alert]] = {
    "drill_digest all passed": lambda: build("drill_digest", passed=[("a", 1), ("b", 2)], failed=[]),
    "tier_applied nothing scheduled": lambda: build(
        "tier_applied", run="r", moved={"cold": 2}, bytes_moved=10, saved_usd_per_month=1.0
    ),
    "tier_applied scheduled": lambda: build(
        "tier_applied", run="r", moved={"expired": 1, "cold": 2}, bytes_moved=5_000_000_000,
        saved_usd_per_month=0.25, scheduled={"archive": 4, "cold": 1}, flow_run_url=URL,
    ),
    "evict_skipped the store's copy": lambda: build(
        "evict_skipped", run="r", step=10, save=2, local=["/l/r/a.bin: changed"],
        store=["prefix/a.bin: missing from the store"],
    ),
    "run_stale for days, no step": lambda: build(
        "run_stale", run="r", newest_at=T0, stale_after_hours=6.0, now=T0 + 3 * 86400
    ),
    "run_recovered no step": lambda: build("run_recovered", run="r", stale_since=T0, newest_at=T0 + 1800),
    "budget_exceeded one run": lambda: build(
        "budget_exceeded", monthly_usd=1234.5, budget=1000.0, run="r", flow_run_url=URL
    ),
    "flow_failed a restore's": lambda: build(
        "flow_failed", flow="restore", state="Failed", message="RestoreError: x\ntb", run="r", step=300,
        flow_run_url=URL,
    ),
    "flow_failed no message": lambda: build("flow_failed", flow="tier", state="Crashed", message=""),
    "run_restarted from an unknown step": lambda: build(
        "run_restarted", run="r", step=None, resaved=["step 5 save 1", "step 6 save 1"]
    ),
    "catalog_unreadable message naming its key": lambda: build(
        "catalog_unreadable", run=ALL_RUNS,
        objects={"k/b.parquet": "k/b.parquet: truncated", "k/a.parquet": "not Parquet"},
    ),
    "legal_hold released": lambda: build(
        "legal_hold", run="r", step=10, save=1, on=False, who="ops", why="done", objects=3, flow_run_url=URL
    ),
    "lock_drift many objects": lambda: build("lock_drift", run="r", step=10, save=1, problems=LONG),
    "replicate_failed a whole pass": lambda: build(
        "replicate_failed", replica="dr", run=ALL_RUNS, step=None, save=None, error="no route", flow_run_url=URL
    ),
    "scrub_problem a repair that failed, one object": lambda: build(
        "scrub_problem", store="primary", run="r", step=1, save=2, problems=["a.bin: missing"], repaired=True
    ),
    "scrub_problem no path": lambda: build(
        "scrub_problem", store="dr", run="r", step=1, save=2, problems=[], repaired=False
    ),
    "tamper one key, on a replica": lambda: build(
        "tamper", store="dr", run="r", step=10, save=2, keys=["p/r/step-0000000010.2/a.bin: deleted at "
        "2026-12-07T08:00:00Z (version v2 over v1)"], since="2026-12-07T07:59:59Z", committed="2026-12-01T00:00:00Z",
    ),
    "restore_completed to a path with braces": lambda: build(
        "restore_completed", run="r", step=1, destination="/scratch/{x}", seconds=1234.4
    ),
    "ingest_failed error with braces": lambda: build(
        "ingest_failed", run="r", step=1, error="KeyError: '{step}'", attempts=2
    ),
}  # fmt: skip


def built() -> dict[str, dict[str, object]]:
    """Every case as the code builds it now: sample_alert's one of each kind, then CASES."""
    every = {kind: sample_alert(kind) for kind in KINDS} | {name: make() for name, make in CASES.items()}
    return {name: asdict(alert) for name, alert in every.items()}


def test_every_kind_has_a_recorded_alert() -> None:
    assert {a["kind"] for a in json.loads(RECORDED.read_text()).values()} == set(KINDS)


@pytest.mark.parametrize("name", sorted(built()))
def test_each_alert_reads_as_recorded(name: str) -> None:
    assert built()[name] == json.loads(RECORDED.read_text())[name]


def test_every_recorded_alert_is_still_built() -> None:
    assert sorted(json.loads(RECORDED.read_text())) == sorted(built())


if __name__ == "__main__":
    RECORDED.write_text(json.dumps(built(), indent=1, ensure_ascii=False) + "\n")
