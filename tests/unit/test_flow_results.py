"""The records the drill, restore, tier and watch flows return: their `as_dict` is the `--json` document
each command prints, so its keys, their order and the values' JSON types are docs/commands.md's schemas."""

from __future__ import annotations

import json
from dataclasses import replace

from ckptvault.alerts.alert import Alert
from ckptvault.alerts.watch import AlertState
from ckptvault.alerts.watch_inputs import WatchReport, WatchResult
from ckptvault.restore.drill import Coverage, DrillFailed, DrillReport, DrillResult
from ckptvault.restore.result import RestoreResult
from ckptvault.tiering.apply import Observation, Scheduled
from ckptvault.tiering.eviction import EvictionCheck, Mismatch
from ckptvault.tiering.result import TierResult


def test_tier_result_a_dry_run_has_only_the_plan_keys_and_an_apply_lists_what_it_did() -> None:
    dry = TierResult(False, ("transition", "skip"), 1.5, 0.25)
    assert json.dumps(dry.as_dict()) == (
        '{"applied": false, "actions": ["transition", "skip"], "monthly_before": 1.5, "monthly_after": 0.25, '
        '"expire_postponed": [], "lock_extended": [], "waits_for_replica": []}'
    )  # a dry run lists what the plan postpones or holds for a replica and the locks it would raise, nothing it did
    skip = EvictionCheck("r", 10, 1, "/hot/r/checkpoint-10", local=(Mismatch("/hot/r/checkpoint-10/a", "size"),))
    sched = Scheduled("r", 20, 1, "ckptvault-tier-cold-t", "COLD", 1000.0, 3, 4096)
    seen = Observation("r", 30, 2, "COLD", {"COLD": 3})
    doc = TierResult(True, ("evict_local",), 1.5, 0.25, evict_skipped=(skip,), scheduled=(sched,),
                     observed=(seen,), catalog_files_compacted=4).as_dict()  # fmt: skip
    assert list(doc) == [
        "applied", "actions", "monthly_before", "monthly_after", "expire_postponed", "lock_extended",
        "waits_for_replica", "evict_skipped", "scheduled", "observed", "catalog_files_compacted",
    ]  # fmt: skip
    assert doc["expire_postponed"] == [] and doc["lock_extended"] == []
    assert doc["evict_skipped"] == [
        {"run": "r", "step": 10, "save": 1, "path": "/hot/r/checkpoint-10", "reason": skip.reason,
         "local": ["/hot/r/checkpoint-10/a: size"], "store": []}
    ]  # fmt: skip
    assert doc["scheduled"] == [
        {"run": "r", "step": 20, "save": 1, "to_class": "COLD", "rule": "ckptvault-tier-cold-t",
         "takes_effect": 1000.0, "objects": 3}
    ]  # fmt: skip
    assert doc["observed"] == [{"run": "r", "step": 30, "save": 2, "storage_class": "COLD", "objects": {"COLD": 3}}]
    assert doc["catalog_files_compacted"] == 4


def test_restore_result_restored_and_thawing_documents() -> None:
    begun = RestoreResult("r", 200, 1, ("n",), "/d", "3 objects", {"objects": 3}, status="thawing")
    fell = {"path": "a.bin", "from": "ceph-dr", "because": "crc32c mismatch on primary"}
    done = replace(begun, status="restored", pointer="latest", replaced=None, bytes=10, files=2, fallbacks=(fell,))
    assert list(done.as_dict()) == [
        "run", "step", "save", "notes", "dest", "estimate", "estimate_detail",
        "status", "pointer", "replaced", "bytes", "files", "fallbacks", "message", "source", "copies", "partial",
    ]  # fmt: skip
    assert done.as_dict()["notes"] == ["n"] and done.as_dict()["replaced"] is None
    assert done.as_dict()["fallbacks"] == [fell] and done.as_dict()["source"] == "primary"
    doc = replace(begun, frozen=2, message="2 of 3 objects still frozen").as_dict()
    assert list(doc)[7:] == ["status", "frozen", "message", "source", "copies", "partial"]
    assert (doc["status"], doc["frozen"], doc["message"]) == ("thawing", 2, "2 of 3 objects still frozen")


def test_drill_report_document_and_the_failure_that_carries_it() -> None:
    cov = Coverage(2, 0, 1, 0.5, 1, 2, None, 7.0)
    good = DrillResult("r", 10, 1, True, 1.234, 100, checks=("model: loaded",))
    bad = DrillResult("r", 20, 2, False, 2.0, 100, ("model.safetensors: CRC32C mismatch",))
    report = DrillReport((good, bad), (("q", 5, 1),), cov)
    doc = report.as_dict()
    assert list(doc) == ["drilled", "pending", "coverage", "lock_drift"] and doc["lock_drift"] == []
    assert doc["drilled"][0] == {"run": "r", "step": 10, "save": 1, "ok": True, "seconds": 1.23, "problems": [],
                                 "checks": ["model: loaded"], "not_run": [], "store": "primary",
                                 "verify": None}  # fmt: skip
    assert doc["pending"] == [{"run": "q", "step": 5, "save": 1}]
    assert doc["coverage"] == cov.as_dict()
    assert report.failed == (bad,)
    err = DrillFailed(report)
    assert err.report is report
    assert str(err) == (
        "1 of 2 drilled checkpoint(s) FAILED:\n  r step 20 save 2: ['model.safetensors: CRC32C mismatch']"
    )


def test_watch_report_names_the_kinds_found() -> None:
    stale = Alert("run_stale", "r", 10, "r stopped checkpointing", [], "look at the job", "warning")
    found = WatchResult([stale], AlertState(), 12.5)
    report = WatchReport.of(found, 1)
    assert report.alerts == ("run_stale",)
    assert json.dumps(report.as_dict()) == '{"alerts": ["run_stale"], "delivered": 1, "monthly_usd": 12.5}'
