"""Scrub and repair on MemoryStores (ckptvault/replication/scrub.py, repair.py, scrub_pass.py;
docs/FORMAT.md, "Scrub and repair"): every problem of every copy reported, each repaired from a good
copy and checked after, a good object never written over, a locked one never changed (a new version
beside it, or not repairable with the reason), an archived one checked by its HEAD and never thawed,
and the rotation's order and coverage."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from datetime import UTC, datetime

import pytest

from ckptvault.catalog import Catalog, CheckpointState, Event, events
from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.errors import InvalidArgumentError
from ckptvault.replication import replicate
from ckptvault.replication.scrub import (
    COVER_RUNS,
    PRIMARY,
    Copy,
    History,
    check_object,
    history,
    select,
)
from ckptvault.replication.scrub_pass import ScrubReport, run_scrub
from ckptvault.store import ObjectInfo, Retention
from ckptvault.store.memory import MemoryStore
from ckptvault.store.port import TransferConfig

MIB = 1024 * 1024
TRANSFER = TransferConfig(part_size=5 * MIB, multipart_threshold=5 * MIB, max_concurrency=2)
SRC = checkpoint_prefix("ck", "r1", 10)
DST = checkpoint_prefix("dr", "r1", 10)
REPLICA = ReplicaConfig(name="dr", bucket="replica", prefix="dr")
FILES = (("model.bin", 6 * MIB + 5), ("optim.bin", 4000), ("config.json", 300))


class NoChecksums(MemoryStore):
    """A server that keeps no CRC32C of its objects (no checksum header, no metadata): a scrub must
    read each back. Only HEAD differs; the bytes and every rule are the memory store's."""

    def head(self, key: str) -> ObjectInfo | None:
        h = super().head(key)
        return None if h is None else dataclasses.replace(h, server_crc32c=None, metadata={})


def _setup(
    primary: MemoryStore | None = None, replica: MemoryStore | None = None
) -> tuple[MemoryStore, MemoryStore, Catalog, list[Copy]]:
    """One committed save on the primary, replicated to the replica."""
    primary = primary or MemoryStore("primary", transfer=TRANSFER)
    replica = replica or MemoryStore("replica", transfer=TRANSFER)
    rng = random.Random(1)
    files = []
    for name, size in FILES:
        data = rng.randbytes(size)
        primary.put_bytes(SRC + name, data)
        files.append(FileEntry(name, size, 1.0, to_b64(crc32c_update(data))))
    m = Manifest("r1", 10, "hf", tuple(files), 1.0, 2.0, "/hot/r1/step-10")
    primary.put_bytes(SRC + MANIFEST_NAME, m.to_json())
    catalog = Catalog(primary, "ck")
    catalog.append([events.verified(m)])
    done = replicate(primary, "ck", replica, REPLICA, catalog.current(), LockConfig(), catalog=catalog)
    assert len(done.copied) == 1
    return primary, replica, catalog, [Copy(PRIMARY, primary, "ck"), Copy("dr", replica, "dr")]


def _scrub(catalog: Catalog, copies: list[Copy], *, repair: bool = False) -> ScrubReport:
    return run_scrub(
        copies, [c.name for c in copies], catalog.current(), catalog.events(), catalog=catalog, repair=repair
    )


def _same_size_other_bytes(store: MemoryStore, key: str) -> None:
    size = store.head(key).size  # type: ignore[union-attr]
    store.put_bytes(key, bytes(size))


def test_a_clean_save_is_checked_on_both_copies_without_a_read_and_recorded() -> None:
    _, _, catalog, copies = _setup()
    report = _scrub(catalog, copies)
    assert report.ok and report.found == 0
    (save,) = report.saves
    assert [(c.store, c.held, c.counts()) for c in save.copies] == [
        ("primary", True, {"objects": 3, "read": 0, "size_only": 0}),
        ("dr", True, {"objects": 3, "read": 0, "size_only": 0}),
    ]
    ev = [e for e in catalog.events("r1") if e.event == "scrubbed"]
    assert [(json.loads(e.detail)["store"], e.ok) for e in ev] == [("primary", True), ("dr", True)]


def test_every_problem_of_every_copy_is_reported_not_the_first() -> None:
    primary, replica, catalog, copies = _setup()
    _same_size_other_bytes(primary, SRC + "model.bin")
    replica.delete(DST + "optim.bin")
    replica.put_bytes(DST + "config.json", b"short")

    report = _scrub(catalog, copies)

    assert not report.ok
    found = {(p.store, p.path, p.kind) for s in report.saves for c in s.copies for p in c.problems}
    assert found == {("primary", "model.bin", "crc"), ("dr", "optim.bin", "missing"), ("dr", "config.json", "size")}
    why = {p.path: p.why for s in report.saves for c in s.copies for p in c.problems}
    assert why["config.json"] == "size mismatch: 5 bytes, the manifest says 300"
    assert why["model.bin"].startswith("CRC32C mismatch: ")
    ev = {json.loads(e.detail)["store"]: e for e in catalog.events("r1") if e.event == "scrubbed"}
    assert ev["primary"].ok is False and json.loads(ev["primary"].detail)["problems"][0].startswith("model.bin: ")
    assert json.loads(ev["dr"].detail)["found"] == 2


def test_repair_rewrites_each_bad_object_from_the_good_copy_and_never_a_good_one() -> None:
    primary, replica, catalog, copies = _setup()
    good = primary.get_bytes(SRC + "model.bin")
    _same_size_other_bytes(primary, SRC + "model.bin")
    replica.delete(DST + "optim.bin")
    untouched = {k: replica.head(DST + k) for k in ("model.bin", "config.json")}

    report = _scrub(catalog, copies, repair=True)

    assert report.ok and report.found == 2 and report.left == 0
    assert {(r.store, r.path, r.source) for r in report.repairs} == {
        ("primary", "model.bin", "dr"), ("dr", "optim.bin", "primary"),
    }  # fmt: skip
    assert primary.get_bytes(SRC + "model.bin") == good
    assert replica.get_bytes(DST + "optim.bin") == primary.get_bytes(SRC + "optim.bin")
    assert primary.get_tags(SRC + "model.bin") == {"run": "r1", "step": "10", "format": "hf"}
    assert {k: replica.head(DST + k) for k in untouched} == untouched  # the good objects were not written
    rep = [json.loads(e.detail) for e in catalog.events("r1") if e.event == "repaired"]
    assert {(d["store"], d["path"], d["from"]) for d in rep} == {
        ("primary", "model.bin", "dr"),
        ("dr", "optim.bin", "primary"),
    }
    scrubbed = [json.loads(e.detail) for e in catalog.events("r1") if e.event == "scrubbed"]
    assert [(d["store"], d["ok"], d["found"], d["repaired"]) for d in scrubbed] == [
        ("primary", True, 1, 1), ("dr", True, 1, 1),
    ]  # fmt: skip
    assert _scrub(catalog, copies).ok


def test_an_object_bad_on_every_copy_is_not_repairable_and_says_why() -> None:
    primary, replica, catalog, copies = _setup()
    _same_size_other_bytes(primary, SRC + "optim.bin")
    replica.delete(DST + "optim.bin")
    report = _scrub(catalog, copies, repair=True)
    assert not report.ok and report.left == 2 and report.repairs == []
    left = report.saves[0].copies[0].left["optim.bin"]
    assert "not repairable: no other copy holds a good one (dr: missing)" in left


def test_a_locked_object_is_repaired_as_a_new_version_locked_as_long() -> None:
    until = datetime(2099, 1, 1, tzinfo=UTC)
    lock = Retention("COMPLIANCE", until)
    primary = MemoryStore("primary", transfer=TRANSFER, object_lock=True)
    _, replica, catalog, copies = _setup(primary.with_retention(lock))
    _same_size_other_bytes(primary.with_retention(lock), SRC + "model.bin")
    primary.put_legal_hold(SRC + "model.bin", True)

    report = _scrub(catalog, copies, repair=True)

    assert report.ok and [r.path for r in report.repairs] == ["model.bin"]
    head = primary.head(SRC + "model.bin")
    assert head is not None and head.retention == lock and head.legal_hold
    assert primary.get_bytes(SRC + "model.bin") == replica.get_bytes(DST + "model.bin")


def test_a_locked_object_in_a_bucket_without_object_lock_is_not_repairable() -> None:
    primary = MemoryStore("primary", transfer=TRANSFER)  # no Object Lock: no version beside a locked object
    _, _, catalog, copies = _setup(primary)
    locked = primary.with_retention(Retention("GOVERNANCE", datetime(2099, 1, 1, tzinfo=UTC)))
    _same_size_other_bytes(locked, SRC + "model.bin")
    bad = primary.get_bytes(SRC + "model.bin")

    report = _scrub(catalog, copies, repair=True)

    assert not report.ok and report.repairs == []
    left = report.saves[0].copies[0].left["model.bin"]
    assert "not repairable: it is locked and the bucket has no Object Lock" in left
    assert primary.get_bytes(SRC + "model.bin") == bad  # untouched


def test_an_archived_object_is_checked_by_its_head_and_never_thawed() -> None:
    replica = NoChecksums("replica", transfer=TRANSFER)
    _, _, catalog, copies = _setup(replica=replica)
    for name, size in FILES:
        replica.copy_storage_class(DST + name, "DEEP_ARCHIVE", size)
    report = _scrub(catalog, copies)
    dr = report.saves[0].copies[1]
    assert report.ok and dr.counts() == {"objects": 3, "read": 0, "size_only": 3}
    assert all(c.frozen for c in dr.checks)
    assert all(replica.head(DST + n).restore is None for n, _ in FILES)  # type: ignore[union-attr]  # no thaw asked

    replica.delete(DST + "optim.bin")
    replica.put_bytes(DST + "optim.bin", b"x" * 10)
    replica.copy_storage_class(DST + "optim.bin", "DEEP_ARCHIVE", 10)
    again = _scrub(catalog, copies)
    assert {(p.path, p.kind) for c in again.saves[0].copies for p in c.problems} == {("optim.bin", "size")}


def test_where_the_store_keeps_no_checksum_the_object_is_read_and_bit_rot_found() -> None:
    primary = NoChecksums("primary", transfer=TRANSFER)
    _, replica, catalog, copies = _setup(primary)
    obj = primary._objects[SRC + "optim.bin"]  # the disk behind the server flips bits; nothing else knows
    obj.data = bytes([obj.data[0] ^ 1]) + obj.data[1:]

    report = _scrub(catalog, copies, repair=True)

    p = report.saves[0].copies[0]
    assert p.counts() == {"objects": 3, "read": 3, "size_only": 0}
    assert [(x.path, x.kind) for x in p.problems] == [("optim.bin", "crc")] and p.repaired == ["optim.bin"]
    assert primary.get_bytes(SRC + "optim.bin") == replica.get_bytes(DST + "optim.bin")


def test_a_replica_that_lost_its_manifest_is_reported_and_repaired_last() -> None:
    _, replica, catalog, copies = _setup()
    raw = replica.get_bytes(DST + MANIFEST_NAME)
    replica.delete(DST + MANIFEST_NAME)
    replica.delete(DST + "config.json")

    report = _scrub(catalog, copies, repair=True)

    dr = report.saves[0].copies[1]
    assert {(p.path, p.kind) for p in dr.problems} == {(MANIFEST_NAME, "manifest missing"), ("config.json", "missing")}
    assert dr.repaired == ["config.json", MANIFEST_NAME] and dr.ok
    assert replica.get_bytes(DST + MANIFEST_NAME) == raw


def test_a_manifest_that_differs_or_does_not_parse_is_rewritten_from_the_readable_one() -> None:
    primary, replica, catalog, copies = _setup()
    raw = primary.get_bytes(SRC + MANIFEST_NAME)
    primary.put_bytes(SRC + MANIFEST_NAME, b"{not json")  # the primary's own is the one gone bad
    replica.put_bytes(DST + "optim.bin", b"x" * 4000)

    report = _scrub(catalog, copies, repair=True)

    p, dr = report.saves[0].copies
    assert [(x.path, x.kind) for x in p.problems] == [(MANIFEST_NAME, "unreadable")]
    assert [(x.path, x.kind) for x in dr.problems] == [("optim.bin", "crc")]  # checked against the replica's
    assert report.ok and p.repaired == [MANIFEST_NAME] and dr.repaired == ["optim.bin"]
    assert primary.get_bytes(SRC + MANIFEST_NAME) == raw
    replica.put_bytes(DST + MANIFEST_NAME, raw + b" ")
    again = _scrub(catalog, copies, repair=True)
    assert [(x.path, x.kind) for x in again.saves[0].copies[1].problems] == [(MANIFEST_NAME, "manifest differs")]
    assert again.ok and replica.get_bytes(DST + MANIFEST_NAME) == raw


def test_a_replica_that_never_held_the_save_is_not_checked() -> None:
    _, _, catalog, copies = _setup()
    other = MemoryStore("other", transfer=TRANSFER)
    report = run_scrub(
        [*copies, Copy("other", other, "o")], [PRIMARY, "dr", "other"], catalog.current(), catalog.events()
    )
    assert report.ok and [c.store for c in report.saves[0].copies] == ["primary", "dr"]


def test_check_object_says_missing_size_and_crc() -> None:
    s = MemoryStore()
    s.put_bytes("k", b"abc")
    crc = to_b64(crc32c_update(b"abc"))
    assert check_object(s, "p", "k", "k", 3, crc).problem is None
    assert check_object(s, "p", "nope", "nope", 3, crc).problem.kind == "missing"  # type: ignore[union-attr]
    assert check_object(s, "p", "k", "k", 4, crc).problem.kind == "size"  # type: ignore[union-attr]
    assert check_object(s, "p", "k", "k", 3, to_b64(crc32c_update(b"abd"))).problem.kind == "crc"  # type: ignore[union-attr]
    assert check_object(s, "p", "k", "k", 3, None).how == "size only"


# -- the rotation ----------------------------------------------------------------------------------


def _state(step: int, uploaded: float, *, verified: bool = True, expired: bool = False) -> CheckpointState:
    return CheckpointState(
        run="r", step=step, format="hf", last_event="expired" if expired else "verified", bytes=1, files=1,
        storage_class="STANDARD", created_at=None, uploaded_at=uploaded, verified=verified, local_evicted=False,
        last_drill_at=None, last_drill_ok=None, metrics={}, updated_at=uploaded, detail="",
    )  # fmt: skip


def test_the_rotation_takes_never_scrubbed_first_then_least_recent_and_rechecks_failures() -> None:
    states = [_state(i, 100.0 - i) for i in range(6)] + [_state(9, 0.0, expired=True)]
    past = {
        ("r", 0, 1): History({"primary": 50.0}, {"primary": True}, frozenset()),
        ("r", 1, 1): History({"primary": 40.0}, {"primary": True}, frozenset()),
        ("r", 2, 1): History({"primary": 60.0}, {"primary": False}, frozenset()),
    }
    got = select(states, past, ["primary"], 3)
    assert got.rechecked == {("r", 2, 1)}  # its last scrub left a problem: on top of the sample
    assert got.queued == (("r", 5, 1), ("r", 4, 1), ("r", 3, 1))  # never scrubbed, oldest upload first
    assert (got.scrubbable, got.sample, got.window) == (6, 3, 2)
    assert select(states, past, ["primary"], 5).queued[3:] == (("r", 1, 1), ("r", 0, 1))  # least recent first
    assert select(states, {}, ["primary"], None).sample == 1 == math.ceil(6 / COVER_RUNS)
    on_dr = {("r", 3, 1): History({}, {}, frozenset({"dr"}))}
    assert [s.key for s in select(states, on_dr, ["dr"], 3).chosen] == [("r", 3, 1)]  # what dr was given
    with pytest.raises(InvalidArgumentError, match="--sample must be at least 1"):
        select(states, {}, ["primary"], 0)


def test_the_default_sample_covers_every_save_within_cover_runs_scrubs() -> None:
    states = [_state(i, float(i)) for i in range(40)]
    evs: list[Event] = []
    seen: set[tuple[str, int, int]] = set()
    for run in range(COVER_RUNS):
        chosen = select(states, history(evs), ["primary"], None).chosen
        for s in chosen:
            evs.append(dataclasses.replace(
                events.scrubbed(s.run, s.step, s.save, store="primary", ok=True, objects=1, read=0, size_only=0,
                                found=0, repaired=0, problems=[]), at=1000.0 + run,
            ))  # fmt: skip
            seen.add(s.key)
    assert seen == {s.key for s in states}


def test_a_sample_under_one_is_exit_2_before_any_store_is_opened(capsys: pytest.CaptureFixture[str]) -> None:
    from ckptvault_cli.main import main

    assert main(["--config", "/nonexistent.toml", "scrub", "--sample", "0"]) == 2
    err = capsys.readouterr().err
    assert "--sample must be at least 1 (saves per scrub), got 0" in err and "Traceback" not in err


def test_the_scrub_report_alerts_once_per_copy_and_save_left_and_its_markdown_says_what_was_repaired() -> None:
    """ckptvault/replication/scrub_report.py, what the command and the scrub flow say: one scrub_problem
    per save and copy with a problem left, naming copy, save and each path; the dedup key holds them."""
    from ckptvault.replication.replicas import ReplicaUnusable
    from ckptvault.replication.scrub_report import alerts, choose_copies, closing_line, to_markdown

    primary, replica, catalog, copies = _setup()
    replica.delete(DST + "optim.bin")
    replica.put_bytes(DST + "config.json", b"short")
    _same_size_other_bytes(primary, SRC + "model.bin")
    report = _scrub(catalog, copies)
    sent = alerts(report, repair=False, flow_run_url="http://prefect/runs/1")
    assert [(a.kind, a.run, a.step) for a in sent] == [("scrub_problem", "r1", 10)] * 2
    by_copy = {a.summary.split("'")[0]: a for a in sent}
    assert set(by_copy) == {"Scrub: primary", "Scrub: dr"}
    assert by_copy["Scrub: dr"].details == [
        "optim.bin: missing",
        "config.json: size mismatch: 5 bytes, the manifest says 300",
    ]
    assert "--replica dr --repair" in by_copy["Scrub: dr"].next_step
    assert len({a.dedup_key() for a in sent}) == 2 and "store=dr,step=10,save=1," in by_copy["Scrub: dr"].reason
    md = to_markdown(report, repair=False)
    assert "| dr | 1 | 3 | 0 | 0 | 2 | 0 | 2 |" in md and "- dr: r1 step 10: optim.bin: missing" in md
    assert "3 problem(s) found, 0 repaired, 3 left; `ckptvault scrub --repair`" in closing_line(report, False)

    fixed = _scrub(catalog, copies, repair=True)  # the model.bin on the primary from dr, dr's two from the primary
    assert alerts(fixed, repair=True) == [] and fixed.ok
    md = to_markdown(fixed, repair=True)
    assert "### Repaired" in md and "| dr | r1 step 10 save 1 | optim.bin | primary | missing | 4000 |" in md
    assert "### Left" not in md and "Repair: on." in md

    assert choose_copies([REPLICA], None).checked == ["primary", "dr"]
    assert choose_copies([REPLICA], "primary").checked == ["primary"]  # every replica still opened, to repair from
    assert [r.name for r in choose_copies([REPLICA], "primary").replicas] == ["dr"]
    with pytest.raises(ReplicaUnusable, match=r"no \[\[replicas\]\] entry is named 'x' \(copies: primary, dr\)"):
        choose_copies([REPLICA], "x")
