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

from ckptvault.alerts import kinds as alerts
from ckptvault.alerts.kinds import ALL_RUNS, KINDS, Alert
from tests.slack_recorder import T0, URL, sample_alert

RECORDED = Path(__file__).with_name("alert_wording.json")
LONG = [f"shard-{i:05d}.safetensors: no Object Lock retention (ckptvault set 2027-01-02)" for i in range(12)]

# name -> the alert, beside sample_alert's one of each kind
CASES: dict[str, Callable[[], Alert]] = {
    "drill_digest all passed": lambda: alerts.drill_digest([("a", 1), ("b", 2)], []),
    "tier_applied nothing scheduled": lambda: alerts.tier_applied("r", {"cold": 2}, 10, 1.0),
    "tier_applied scheduled": lambda: alerts.tier_applied(
        "r", {"expired": 1, "cold": 2}, 5_000_000_000, 0.25, URL, {"archive": 4, "cold": 1}
    ),
    "evict_skipped the store's copy": lambda: alerts.evict_skipped(
        "r", 10, 2, ["/l/r/a.bin: changed"], ["prefix/a.bin: missing from the store"]
    ),
    "run_stale for days, no step": lambda: alerts.run_stale("r", T0, 6.0, T0 + 3 * 86400),
    "run_recovered no step": lambda: alerts.run_recovered("r", T0, T0 + 1800),
    "budget_exceeded one run": lambda: alerts.budget_exceeded(1234.5, 1000.0, "r", URL),
    "flow_failed a restore's": lambda: alerts.flow_failed("restore", "Failed", "RestoreError: x\ntb", "r", URL, 300),
    "flow_failed no message": lambda: alerts.flow_failed("tier", "Crashed", ""),
    "run_restarted from an unknown step": lambda: alerts.run_restarted("r", None, ["step 5 save 1", "step 6 save 1"]),
    "catalog_unreadable message naming its key": lambda: alerts.catalog_unreadable(
        ALL_RUNS, {"k/b.parquet": "k/b.parquet: truncated", "k/a.parquet": "not Parquet"}
    ),
    "legal_hold released": lambda: alerts.legal_hold("r", 10, 1, False, "ops", "done", 3, URL),
    "lock_drift many objects": lambda: alerts.lock_drift("r", 10, 1, LONG),
    "replicate_failed a whole pass": lambda: alerts.replicate_failed("dr", ALL_RUNS, None, None, "no route", URL),
    "scrub_problem a repair that failed, one object": lambda: alerts.scrub_problem(
        "primary", "r", 1, 2, ["a.bin: missing"], True
    ),
    "scrub_problem no path": lambda: alerts.scrub_problem("dr", "r", 1, 2, [], False),
    "restore_completed to a path with braces": lambda: alerts.restore_completed("r", 1, "/scratch/{x}", 1234.4),
    "ingest_failed error with braces": lambda: alerts.ingest_failed("r", 1, "KeyError: '{step}'", 2),
}


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
