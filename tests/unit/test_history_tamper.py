"""The tamper check's decision (ckptvault/history/tamper.py): over a versions listing and a save's first
manifest version, which keys read differently from what the commit wrote; and what scrub, its alert and
its gauge make of it where the bucket keeps no versions."""

from __future__ import annotations

import json

from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.history.tamper import (
    TamperedKey,
    TamperedSave,
    changed_since_commit,
    judge_key,
    judge_save,
    recover_since,
    saves_in,
)
from ckptvault.history.versions import by_key
from ckptvault.observe import ledger
from ckptvault.observe.metrics import ledger_families
from ckptvault.replication.scrub import PRIMARY, Copy
from ckptvault.replication.scrub_pass import ScrubReport, run_scrub
from ckptvault.replication.scrub_report import closing_line, tamper_alerts, tamper_lines, tampered_saves
from ckptvault.store.memory import MemoryStore
from ckptvault.store.port import ObjectVersion

T0 = 1_800_000_000.0  # the commit
SAVE = checkpoint_prefix("ck", "r", 10)
MKEY = SAVE + MANIFEST_NAME
M = Manifest("r", 10, "hf", (FileEntry("a.bin", 100, 1.0, "AAAAAA=="), FileEntry("b.bin", 50, 1.0, "BBBBBB==")),
             1.0, 2.0, "/hot/r/step-10")  # fmt: skip
M_CRC = "MMMMMM=="


def v(key: str, vid: str, at: float, size: int = 0, etag: str = "", *, marker: bool = False) -> ObjectVersion:
    return ObjectVersion(key, vid, at, 0 if marker else size, "" if marker else etag, marker)


def committed() -> list[ObjectVersion]:
    """The save as its commit left it: each object, then the manifest."""
    return [
        v(SAVE + "a.bin", "a1", T0 - 2, 100, '"ea1"'),
        v(SAVE + "b.bin", "b1", T0 - 1, 50, '"eb1"'),
        v(MKEY, "m1", T0, 700, '"em1"'),
    ]


class Settles:
    """A `Settle` that answers as told and remembers what it was asked (the reads a scrub would make)."""

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str | None, str]] = []

    def __call__(self, newer: ObjectVersion, crc: str | None, reference: ObjectVersion) -> bool | None:
        self.asked.append((newer.version_id, crc, reference.version_id))
        return self.answer


def judge(versions: list[ObjectVersion], settle: Settles | None = None) -> list[TamperedKey]:
    grouped = by_key(versions)
    first = grouped[MKEY][-1]
    return judge_save(grouped, SAVE, first, M, M_CRC, settle or Settles(False))


def test_a_save_as_its_commit_left_it_is_not_tampered_and_nothing_is_read() -> None:
    s = Settles(False)
    assert judge(committed(), s) == [] and s.asked == []
    assert not changed_since_commit(by_key(committed()), T0)


def test_a_delete_marker_on_a_data_object_or_the_manifest_is_tampering_dated_by_the_marker() -> None:
    attacked = [*committed(), v(SAVE + "b.bin", "bx", T0 + 50, marker=True), v(MKEY, "mx", T0 + 60, marker=True)]
    found = judge(attacked)
    assert [(k.key, k.change, k.at, k.version_id, k.reference) for k in found] == [
        (MKEY, "deleted", T0 + 60, "mx", "m1"),
        (SAVE + "b.bin", "deleted", T0 + 50, "bx", "b1"),
    ]
    assert changed_since_commit(by_key(attacked), T0)
    assert found[1].text() == f"{SAVE}b.bin: deleted at 2027-01-15T08:00:50Z (version bx over b1)"


def test_a_newer_version_of_another_size_is_tampering_without_reading_it() -> None:
    s = Settles(True)
    found = judge([*committed(), v(SAVE + "a.bin", "a2", T0 + 5, 4, '"junk"')], s)
    assert [(k.key, k.change, k.version_id) for k in found] == [(SAVE + "a.bin", "overwritten", "a2")]
    assert s.asked == []  # the listing decided


def test_a_newer_version_with_the_same_etag_is_the_same_bytes_without_reading_it() -> None:
    s = Settles(False)
    assert judge([*committed(), v(SAVE + "a.bin", "a2", T0 + 5, 100, '"ea1"')], s) == []
    assert s.asked == []


def test_same_size_and_another_etag_is_settled_by_the_bytes_against_the_manifests_crc() -> None:
    newer = [*committed(), v(SAVE + "a.bin", "a2", T0 + 5, 100, '"ea1-2"')]
    put_back = Settles(True)  # a recovery's or a repair's copy: other parts, the same bytes
    assert judge(newer, put_back) == []
    assert put_back.asked == [("a2", "AAAAAA==", "a1")]
    junk = Settles(False)  # same size, other bytes
    assert [k.version_id for k in judge(newer, junk)] == ["a2"]
    archived = Settles(None)  # an archived copy that keeps no checksum: a read cannot settle it, no alarm
    assert judge(newer, archived) == []


def test_the_reference_is_the_first_manifest_version_never_the_current_one() -> None:
    # the attacker's manifest names other objects (and would match junk put beside it): it is judged
    # against the commit's, and the objects against what that manifest says
    rewritten = [*committed(), v(MKEY, "m2", T0 + 30, 650, '"evil"'), v(SAVE + "a.bin", "a2", T0 + 31, 7, '"j"')]
    found = judge(rewritten)
    assert [(k.key, k.change, k.reference) for k in found] == [
        (MKEY, "overwritten", "m1"),
        (SAVE + "a.bin", "overwritten", "a1"),
    ]
    same_bytes_again = [*committed(), v(MKEY, "m2", T0 + 30, 700, '"em1"')]  # a repair's rewrite: same ETag
    assert judge(same_bytes_again) == []


def test_versions_written_before_the_commit_are_not_the_reference() -> None:
    # an upload retried before the commit: its first version was never what the manifest covered
    retried = [v(SAVE + "a.bin", "a0", T0 - 9, 3, '"bad"'), *committed()]
    assert judge(retried) == []


def test_a_key_the_manifest_does_not_name_and_an_object_absent_at_the_commit_are_not_judged() -> None:
    extra = [*committed(), v(SAVE + "_VALIDATION.json", "x1", T0 + 5, 9, '"x"'), v(SAVE + "new.bin", "n", T0 + 6, 1)]
    assert judge(extra) == []
    late = [v(SAVE + "a.bin", "a1", T0 - 2, 100, '"ea1"'), v(MKEY, "m1", T0, 700, '"em1"'),
            v(SAVE + "b.bin", "b1", T0 + 9, 50, '"eb1"'), v(SAVE + "b.bin", "bx", T0 + 10, marker=True)]  # fmt: skip
    assert judge(late) == []  # absent when committed: the scrub's `missing`, not tampering


def test_a_replicas_lifecycle_expiry_is_not_tampering_but_an_earlier_delete_is() -> None:
    a = [v(SAVE + "a.bin", "a1", T0, 100, '"ea1"')]
    day = 86400.0
    expired = [v(SAVE + "a.bin", "ax", T0 + 7 * day + 30, marker=True), *a]
    assert judge_key(expired, a[0], 100, "AAAAAA==", Settles(False), expires_after=7 * day) is None
    early = [v(SAVE + "a.bin", "ax", T0 + day, marker=True), *a]
    assert judge_key(early, a[0], 100, "AAAAAA==", Settles(False), expires_after=7 * day) is not None
    assert judge_key(expired, a[0], 100, "AAAAAA==", Settles(False)) is not None  # no expiry configured


def test_saves_in_a_listing_are_those_with_a_manifest_version_by_run_step_and_save() -> None:
    second = checkpoint_prefix("ck", "r", 10, 2)
    never = checkpoint_prefix("ck", "q", 5)
    listing = [
        *committed(),
        v(second + "a.bin", "s1", T0, 1), v(second + MANIFEST_NAME, "s2", T0 + 1, 9),
        v(second + MANIFEST_NAME, "s3", T0 + 2, marker=True),
        v(never + "a.bin", "n1", T0, 1),  # uploaded, never committed
        v(never + MANIFEST_NAME, "n2", T0 + 1, marker=True),
        v("ck/_catalog/r/events-1.parquet", "c1", T0, 5),
    ]  # fmt: skip
    found = saves_in(listing, "ck")
    assert [(s.run, s.step, s.save, s.save_dir, s.manifest_first.version_id) for s in found] == [
        ("r", 10, 1, SAVE, "m1"),
        ("r", 10, 2, second, "s2"),
    ]
    assert sorted(found[0].entries) == [MKEY, SAVE + "a.bin", SAVE + "b.bin"]
    assert saves_in([v("r/step-0000000010/_MANIFEST.json", "x", T0, 3)], "")[0].run == "r"  # no store prefix


def test_recover_since_names_the_second_before_the_first_change() -> None:
    keys = (TamperedKey(MKEY, "deleted", T0 + 60.4, "mx", "m1"),
            TamperedKey(SAVE + "a.bin", "overwritten", T0 + 20.9, "a2", "a1"))  # fmt: skip
    t = TamperedSave("primary", "r", 10, 1, T0, keys)
    assert t.first_at == T0 + 20.9
    assert recover_since(t.first_at) == "2027-01-15T08:00:19Z"
    assert t.as_dict()["keys"][0] == {"key": MKEY, "change": "deleted", "at": "2027-01-15T08:01:00Z",
                                      "version_id": "mx", "reference": "m1"}  # fmt: skip


def _report_with(tampered: list[TamperedSave]) -> ScrubReport:
    from ckptvault.history.tamper import TamperSurvey
    from ckptvault.replication.scrub import Selection

    sel = Selection((), frozenset(), (), 0, 1, 1)
    return ScrubReport(sel, [PRIMARY], tamper=[TamperSurvey(PRIMARY, list(tampered), checked=3, read=1)])


def test_a_tampered_save_fails_the_scrub_and_is_one_alert_per_save_named_with_its_keys_and_since() -> None:
    t = TamperedSave("primary", "r", 10, 1, T0, (TamperedKey(MKEY, "deleted", T0 + 60, "mx", "m1"),))
    report = _report_with([t])
    assert not report.ok and tampered_saves(report) == 1
    (alert,) = tamper_alerts(report)
    assert alert.kind == "tamper" and (alert.run, alert.step) == ("r", 10)
    assert alert.details == [f"{MKEY}: deleted at 2027-01-15T08:01:00Z (version mx over m1)"]
    assert "recover --since 2027-01-15T08:00:59Z" in alert.next_step
    assert tamper_lines(report) == [(True, f"primary: r step 10: TAMPERED: {alert.details[0]}")]
    assert "TAMPERED: 1 of 3 committed saves (primary: r step 10)" in closing_line(report, False)
    doc = json.loads(json.dumps(report.as_dict()))
    assert doc["ok"] is False and doc["tampered"][0]["keys"][0]["version_id"] == "mx"
    assert doc["tamper_check"] == {"primary": {"checked": 3, "read": 1, "unjudged": {}}}
    clean = _report_with([])
    assert clean.ok and tampered_saves(clean) == 0 and tamper_alerts(clean) == []
    assert closing_line(clean, False).endswith("; tamper check (primary): 3 committed saves, none tampered")


def test_a_store_without_versions_skips_the_check_and_says_so_once_never_an_error() -> None:
    store = MemoryStore("plain")
    report = run_scrub([Copy(PRIMARY, store, "ck")], [PRIMARY], [], [])
    assert report.ok and report.tamper == [] and tampered_saves(report) is None
    assert report.tamper_skipped == {PRIMARY: "s3://plain keeps no versions (versioning never turned on); the "
                                     "tamper check needs a versioned bucket (Object Lock implies one)"}  # fmt: skip
    lines = tamper_lines(report)
    assert lines == [(False, f"primary: tamper check skipped: {report.tamper_skipped[PRIMARY]}")]
    assert report.as_dict()["tamper_check"] == {PRIMARY: {"skipped": report.tamper_skipped[PRIMARY]}}
    assert "tamper" not in closing_line(report, False)


def test_the_tampered_saves_gauge_is_the_latest_a_scrub_set_and_absent_before_any() -> None:
    store = MemoryStore("b")
    assert not any(m.name == "ckptvault_tampered_saves" for m in ledger_families(ledger.load(store, "ck")))
    ledger.record_ledger(store, "ck", gauges={"tampered_saves": 2}, delete=True, now=T0)
    ledger.record_ledger(store, "ck", succeeded="scrub", delete=False, now=T0 + 5)  # sets no gauge: kept
    ledger.record_ledger(store, "ck", gauges={"tampered_saves": 0}, delete=False, now=T0 + 10)
    older = ledger.Ledger(gauges={"tampered_saves": (7.0, T0 + 1)})
    merged = ledger.merge([older, ledger.load(store, "ck")])
    assert merged.gauges == {"tampered_saves": (0.0, T0 + 10)}  # the latest setting, in any order
    assert ledger.Ledger.from_json(merged.to_json()).gauges == merged.gauges
    (g,) = [m for m in ledger_families(merged) if m.name == "ckptvault_tampered_saves"]
    assert [s.value for s in g.samples] == [0.0]
