"""Object Lock (docs/FORMAT.md, "Object Lock") on the in-memory store: the retain-until date of a
save, the objects the commit must raise, the bucket check, and an ingest pass that writes every
object of a save and its manifest locked, and nothing else."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptvault.catalog import Catalog, fold
from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault.config import Config, LockConfig, ScaleConfig, SourceConfig, StoreConfig, ValidationRules
from ckptvault.ingest import steps
from ckptvault.ingest.ingest_pass import IngestPass
from ckptvault.objectlock.save_lock import DAY, lock_problem, retain_until, save_retention, to_extend
from ckptvault.store import LockStatus, Retention, StoreError, TransferConfig
from ckptvault.store.memory import MemoryStore
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Plain

MiB = 2**20
PREFIX = "t"


@given(start=st.floats(min_value=1.6e9, max_value=2.5e9), days=st.integers(min_value=0, max_value=3650))
def test_the_retain_until_date_is_a_utc_midnight_between_days_plus_one_and_days_plus_two(
    start: float, days: int
) -> None:
    until = retain_until(start, days)
    assert until.tzinfo is not None and (until.hour, until.minute, until.second, until.microsecond) == (0, 0, 0, 0)
    assert start + (days + 1) * DAY <= until.timestamp() < start + (days + 2) * DAY


def test_no_retention_when_lock_is_off_or_locks_nothing_at_upload() -> None:
    assert save_retention(LockConfig(), 1.7e9) is None
    assert save_retention(LockConfig(mode="compliance", days=0), 1.7e9) is None
    r = save_retention(LockConfig(mode="governance", days=30), 1.7e9)
    assert r is not None and r.mode == "GOVERNANCE" and r.until == retain_until(1.7e9, 30)


def test_the_commit_raises_reused_objects_and_all_of_them_after_a_long_upload() -> None:
    r = Retention.of("compliance", datetime.fromtimestamp(1.7e9, UTC) + timedelta(days=3))
    assert to_extend(r, 1, 1.7e9 + DAY, ["old"], ["new"]) == ["old"]  # the margin still covers the commit
    assert to_extend(r, 1, 1.7e9 + 2.5 * DAY, ["old"], ["new"]) == ["old", "new"]  # the upload outlasted it


def test_a_naive_date_or_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="time zone"):
        Retention("COMPLIANCE", datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="GOVERNANCE or COMPLIANCE"):
        Retention.of("strict", datetime(2030, 1, 1, tzinfo=UTC))


def test_a_bucket_without_object_lock_is_named_with_the_fix() -> None:
    lock = LockConfig(mode="compliance", days=1)
    problem = lock_problem(lock, MemoryStore("plain"))
    assert problem is not None
    assert "bucket plain has no Object Lock" in problem and "--object-lock-enabled-for-bucket" in problem
    assert lock_problem(lock, MemoryStore("locked", object_lock=True)) is None
    assert lock_problem(LockConfig(), MemoryStore("plain")) is None  # off: nothing to check


def _ingest(tmp_path: Path, store: MemoryStore, lock: LockConfig, steps_: tuple[int, ...] = (100,)) -> None:
    for step in steps_:
        write_checkpoint(tmp_path / "r", "hf", step, 12 * MiB, shards=2, seed=step)
    cfg = Config(
        store=StoreConfig(bucket=store.bucket, prefix=PREFIX),
        sources=[SourceConfig(run="r", path=tmp_path / "r", format="hf", settle_seconds=0)],
        validation=ValidationRules(enabled=True, isolate=False),
        scale=ScaleConfig(split_size_mb=5),
        lock=lock,
    )
    catalog = Catalog(store, PREFIX)
    source = cfg.sources[0]
    known = {"r": steps.known_states(catalog, "r")}
    outcomes = IngestPass(cfg, store, catalog, "flow-run", known, Plain()).run(steps.find_checkpoints(source).found)
    assert [o.result for o in outcomes] == ["uploaded"] * len(steps_), [o.message for o in outcomes]


def test_ingest_locks_every_object_of_the_save_and_its_manifest_and_nothing_else(tmp_path: Path) -> None:
    # 5 MiB parts and 5 MiB ranges: single PUTs, multipart uploads and split uploads all carry the lock
    store = MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB),
                        object_lock=True)  # fmt: skip
    _ingest(tmp_path, store, LockConfig(mode="compliance", days=7))
    save = checkpoint_prefix(PREFIX, "r", 100)
    data = [o.key for o in store.list(save) if not o.key.endswith("_VALIDATION.json")]
    assert save + MANIFEST_NAME in data and len(data) >= 3
    floor = datetime.now(UTC) + timedelta(days=7)
    for key in data:
        info = store.head(key)
        assert info is not None and info.retention is not None, f"{key} is not locked"
        assert info.retention.mode == "COMPLIANCE" and info.retention.until >= floor, key
    unlocked = [o.key for o in store.list(PREFIX + "/") if o.key not in data]
    assert unlocked and all(store.head(k).retention is None for k in unlocked)  # type: ignore[union-attr]
    with pytest.raises(StoreError, match="locked until"):
        store.delete(save + MANIFEST_NAME)
    assert store.delete_many(data).keys() == set(data)  # every one refused, none gone
    assert len([o for o in store.list(save)]) == len(data) + 1


def test_ingest_without_lock_writes_nothing_locked(tmp_path: Path) -> None:
    store = MemoryStore("ckpts", object_lock=True)
    _ingest(tmp_path, store, LockConfig())
    assert all(store.head(o.key).retention is None for o in store.list(PREFIX + "/"))  # type: ignore[union-attr]


def test_the_commit_raises_the_lock_of_objects_a_killed_pass_left(tmp_path: Path) -> None:
    store = MemoryStore("ckpts", object_lock=True)
    write_checkpoint(tmp_path / "r", "hf", 100, 2 * MiB, shards=1, seed=1)
    found = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "r", format="hf", settle_seconds=0)).found[0]
    early = Retention.of("governance", datetime.now(UTC) + timedelta(hours=1))  # a killed pass's, too short
    first = found.files[0]
    store.with_retention(early).upload_file(first.path, checkpoint_prefix(PREFIX, "r", 100) + first.rel)
    jobs = steps.plan_upload(store, PREFIX, found)
    assert [j.upload for j in jobs].count(False) == 1
    wanted = save_retention(LockConfig(mode="governance", days=2), datetime.now(UTC).timestamp())
    assert wanted is not None
    assert steps.lock_save(store, wanted, 2, jobs) == 1
    info = store.head(checkpoint_prefix(PREFIX, "r", 100) + first.rel)
    assert info is not None and info.retention == wanted
    assert steps.lock_save(store, wanted, 2, jobs) == 0  # never lowered, never rewritten


def test_an_expiry_of_a_locked_save_is_postponed_and_deletes_nothing(tmp_path: Path) -> None:
    from ckptvault.tiering.apply import expire

    store = MemoryStore("ckpts", object_lock=True)
    _ingest(tmp_path, store, LockConfig(mode="governance", days=1))
    before = sorted(o.key for o in store.list(PREFIX + "/"))
    r = expire(store, PREFIX, "r", 100)
    assert r.kind == "postponed" and r.objects == 0
    assert re.fullmatch(r"expiry postponed: locked until \d{4}-\d\d-\d\d 00:00 UTC \(GOVERNANCE\)", r.detail), r.detail
    assert sorted(o.key for o in store.list(PREFIX + "/")) == before

    unlocked = MemoryStore("ckpts")
    _ingest(tmp_path / "again", unlocked, LockConfig())
    assert expire(unlocked, PREFIX, "r", 100).kind == "expire"
    assert unlocked.head(checkpoint_prefix(PREFIX, "r", 100) + MANIFEST_NAME) is None


def test_a_legal_hold_covers_every_object_stops_expiry_and_is_recorded(tmp_path: Path) -> None:
    from ckptvault.catalog import events
    from ckptvault.objectlock.legal_hold import HoldError, set_legal_hold
    from ckptvault.tiering.apply import expire

    store = MemoryStore("ckpts", object_lock=True)
    _ingest(tmp_path, store, LockConfig())  # no retention: only the hold protects it
    save = checkpoint_prefix(PREFIX, "r", 100)
    n = set_legal_hold(store, PREFIX, "r", 100, 1, True)
    assert n == len(list(store.list(save))) >= 3
    assert all(store.head(o.key).legal_hold for o in store.list(save))  # type: ignore[union-attr]
    r = expire(store, PREFIX, "r", 100)
    assert (r.kind, r.detail) == ("postponed", "expiry postponed: under a legal hold")
    catalog = Catalog(store, PREFIX)
    catalog.append([events.held("r", 100, 1, "hf", "alice", "litigation 42", n)])
    [state] = catalog.current("r")
    assert state.state == "verified" and state.good and state.last_event == "held"  # a hold changes no state

    assert set_legal_hold(store, PREFIX, "r", 100, 1, False) == n
    assert expire(store, PREFIX, "r", 100).kind == "expire"
    with pytest.raises(HoldError, match="not committed"):
        set_legal_hold(store, PREFIX, "r", 100, 1, True)
    with pytest.raises(HoldError, match="no Object Lock"):
        plain = MemoryStore("plain")
        _ingest(tmp_path / "plain", plain, LockConfig())
        set_legal_hold(plain, PREFIX, "r", 100, 1, True)


def test_a_storage_class_move_keeps_the_lock_and_the_hold() -> None:
    # The S3 side of the same contract: tests/integration/test_object_lock.py (client-mode tier, multipart copy).
    store = MemoryStore(object_lock=True)
    until = datetime(2030, 1, 1, tzinfo=UTC)
    store.with_retention(Retention("COMPLIANCE", until)).put_bytes("k", b"x" * 10)
    store.put_legal_hold("k", True)
    store.copy_storage_class("k", "GLACIER_IR", 10)
    info = store.head("k")
    assert info is not None and info.storage_class == "GLACIER_IR"
    assert (info.retention, info.legal_hold) == (Retention("COMPLIANCE", until), True)
    with pytest.raises(StoreError, match="locked"):
        store.delete("k")


def test_a_milestone_lock_is_extended_once_every_object_the_manifest_last(tmp_path: Path) -> None:
    from ckptvault.config import PolicyConfig
    from ckptvault.tiering import milestone_lock

    store = MemoryStore("ckpts", object_lock=True)
    lock = LockConfig(mode="governance", days=1)
    _ingest(tmp_path, store, lock)
    states = Catalog(store, PREFIX).current("r")
    policy = PolicyConfig(milestone_every_steps=100, milestone_lock_days=3650)
    [ext] = milestone_lock.extend_all(store, PREFIX, states, policy, lock)
    save = checkpoint_prefix(PREFIX, "r", 100)
    locked = [o.key for o in store.list(save) if not o.key.endswith("_VALIDATION.json")]
    # the block sidecar is locked with the save and raised with it, but not counted: the plan counts
    # the save's files and its manifest from the catalog alone
    assert save + "_BLOCKS.json" in locked
    assert ext.objects == len(locked) - 1 >= 3 and ext.days == 3650
    assert ext.retention.until >= datetime.now(UTC) + timedelta(days=3650)
    assert all(store.head(k).retention == ext.retention for k in locked)  # type: ignore[union-attr]
    assert store.head(save + "_VALIDATION.json").retention is None  # type: ignore[union-attr]
    assert milestone_lock.extend_all(store, PREFIX, states, policy, lock) == []  # the manifest says: done
    not_a_milestone = PolicyConfig(milestone_every_steps=7, milestone_lock_days=3650)
    assert milestone_lock.wanted(states, not_a_milestone, lock) == []


def test_milestone_lock_days_without_a_lock_is_a_config_error_naming_both_keys() -> None:
    from ckptvault.config import ConfigError, parse_config

    text = '[store]\nbucket = "ckpts"\n[policy]\nmilestone_lock_days = 30\n'
    with pytest.raises(ConfigError, match=r'\[policy\] milestone_lock_days is set, but \[lock\] mode is "off"'):
        parse_config(text)
    assert parse_config(text + '[lock]\nmode = "governance"\n').policy.milestone_lock_days == 30


def test_lock_drift_names_each_object_whose_lock_or_hold_is_weaker_than_recorded(tmp_path: Path) -> None:
    from ckptvault.objectlock.drift import lock_drift

    store = MemoryStore("ckpts", object_lock=True)
    _ingest(tmp_path, store, LockConfig(mode="governance", days=1))
    [state] = Catalog(store, PREFIX).current("r")
    assert state.locked_until is not None and lock_drift(store, PREFIX, state) == []
    save = checkpoint_prefix(PREFIX, "r", 100)
    data = sorted(o.key for o in store.list(save) if not o.key.endswith("_VALIDATION.json"))
    # what someone with s3:BypassGovernanceRetention can do: shorten one lock, remove another
    store._objects[data[0]].retention = Retention("GOVERNANCE", datetime.now(UTC) + timedelta(hours=1))
    store._objects[data[1]].retention = None
    problems = lock_drift(store, PREFIX, state)
    assert len(problems) == 2, problems
    assert problems[0].startswith(data[0][len(save) :] + ": locked until ") and "shorter than" in problems[0]
    assert problems[1] == f"{data[1][len(save) :]}: no Object Lock retention (ckptvault set " + (
        f"{datetime.fromtimestamp(state.locked_until, UTC):%Y-%m-%d %H:%M} UTC)"
    )
    held = replace(state, legal_hold=True)
    assert sum("no legal hold" in p for p in lock_drift(store, PREFIX, held)) == len(data)
    assert lock_drift(store, PREFIX, replace(state, locked_until=None)) == []  # nothing recorded: nothing to drift
    assert lock_drift(store, PREFIX, state, now=state.locked_until + 1) == []  # the date has passed: nothing in force


def test_the_manifest_records_the_lock_it_was_committed_with_and_a_plain_save_has_no_key(tmp_path: Path) -> None:
    from ckptvault.store.manifest_load import load_manifest

    store = MemoryStore("ckpts", object_lock=True)
    _ingest(tmp_path / "a", store, LockConfig(mode="governance", days=3))
    key = checkpoint_prefix(PREFIX, "r", 100) + MANIFEST_NAME
    head = store.head(key)
    assert head is not None and head.retention is not None
    m = load_manifest(store, PREFIX, "r", 100)
    assert m.lock is not None and (m.lock.mode, m.lock.retain_until) == ("GOVERNANCE", head.retention.until_ts)
    [state] = Catalog(store, PREFIX).current("r")
    assert state.locked_until == m.lock.retain_until  # the verified event takes it from the manifest

    plain = MemoryStore("plain", object_lock=True)
    _ingest(tmp_path / "b", plain, LockConfig())
    assert b'"lock"' not in plain.get_bytes(key)  # written as before the key existed
    assert load_manifest(plain, PREFIX, "r", 100).lock is None


def test_a_manifest_lock_reads_back_and_a_malformed_one_is_refused() -> None:
    import json

    from ckptvault.checkpoint.manifest import Manifest, ManifestError, SaveLock

    m = Manifest(run="r", step=1, format="hf", files=(), created_at=1.0, uploaded_at=2.0, source="/x",
                 lock=SaveLock("COMPLIANCE", 1.8e9))  # fmt: skip
    doc = json.loads(m.to_json())
    assert doc["lock"] == {"mode": "COMPLIANCE", "retain_until": 1.8e9}
    assert Manifest.from_json(m.to_json()) == m
    # an older reader's view: every key it does not know is ignored, so a newer key is harmless here too
    assert Manifest.from_json(json.dumps({**doc, "from_the_future": {"x": 1}}).encode()) == m
    for bad in (
        {"mode": "STRICT", "retain_until": 1.8e9},
        {"mode": "COMPLIANCE"},
        "COMPLIANCE",
        {"mode": "GOVERNANCE", "retain_until": True},
    ):
        with pytest.raises(ManifestError, match="lock"):
            Manifest.from_json(json.dumps({**doc, "lock": bad}).encode(), origin="lock")


def test_a_rebuilt_catalog_knows_each_lock_its_extension_and_a_hold(tmp_path: Path) -> None:
    from ckptvault.config import PolicyConfig
    from ckptvault.tiering import milestone_lock

    store = MemoryStore("ckpts", object_lock=True)
    lock = LockConfig(mode="governance", days=1)
    _ingest(tmp_path, store, lock, (100, 200))
    catalog = Catalog(store, PREFIX)
    policy = PolicyConfig(milestone_every_steps=200, milestone_lock_days=30)
    [ext] = milestone_lock.extend_all(store, PREFIX, catalog.current("r"), policy, lock)
    store.put_legal_hold(checkpoint_prefix(PREFIX, "r", 100) + MANIFEST_NAME, True)
    recorded = {s.step: (s.locked_until, s.legal_hold) for s in catalog.current("r")}

    rebuilt = {s.step: (s.locked_until, s.legal_hold) for s in fold(catalog.rebuild_from_manifests())}
    assert rebuilt[200] == (ext.retention.until_ts, False)  # the extension, from the manifest's HEAD
    assert rebuilt[100][0] == recorded[100][0] and rebuilt[100][1]  # the manifest's own lock, and the hold
    assert recorded[100][1] is False  # (the hold was set behind ckptvault's back: only the HEAD shows it)
    cheap = {s.step: (s.locked_until, s.legal_hold) for s in fold(catalog.rebuild_from_manifests(lock_heads=False))}
    assert cheap == {100: (recorded[100][0], False), 200: (recorded[200][0], False)}  # the manifests alone


def test_raising_a_retention_never_shortens_it_nor_weakens_compliance_to_governance() -> None:
    soon, later = (datetime(2030, 1, d, tzinfo=UTC) for d in (1, 2))
    gov, comp = Retention("GOVERNANCE", later), Retention("COMPLIANCE", later)
    assert gov.over(None) == gov and gov.over(Retention("GOVERNANCE", soon)) == gov
    assert gov.over(Retention("COMPLIANCE", soon)) == comp  # S3 refuses COMPLIANCE -> GOVERNANCE
    assert comp.over(Retention("GOVERNANCE", soon)) == comp  # strengthening is the config's to ask
    assert gov.over(Retention("COMPLIANCE", later)) is None and comp.over(Retention("GOVERNANCE", later)) is None


def test_a_milestone_saved_in_compliance_is_extended_in_compliance_after_the_config_says_governance(
    tmp_path: Path,
) -> None:
    from ckptvault.config import PolicyConfig
    from ckptvault.tiering import milestone_lock

    store = MemoryStore("ckpts", object_lock=True)
    _ingest(tmp_path, store, LockConfig(mode="compliance", days=1))
    save = checkpoint_prefix(PREFIX, "r", 100)
    keys = [o.key for o in store.list(save) if not o.key.endswith("_VALIDATION.json")]
    first = store.head(keys[0])
    assert first is not None and first.retention is not None
    # The store refuses the weakening as S3 does, so an extension that asked for GOVERNANCE would fail here
    with pytest.raises(StoreError, match="would weaken it"):
        store._put_retention(keys[0], store._objects[keys[0]], Retention("GOVERNANCE", first.retention.until))
    # the port's contract, which the ingest's commit (lock_save) relies on too: the mode is kept
    longer = Retention("GOVERNANCE", first.retention.until + timedelta(days=1))
    assert store.extend_retention(keys[0], longer)
    assert store.head(keys[0]).retention == Retention("COMPLIANCE", longer.until)  # type: ignore[union-attr]
    governance = LockConfig(mode="governance", days=1)
    policy = PolicyConfig(milestone_every_steps=100, milestone_lock_days=30)
    [ext] = milestone_lock.extend_all(store, PREFIX, Catalog(store, PREFIX).current("r"), policy, governance)
    assert ext.retention.mode == "COMPLIANCE" and ext.objects == len(keys) - 1  # what was set, the sidecar uncounted
    assert ext.as_dict()["mode"] == "COMPLIANCE"
    for key in keys:
        info = store.head(key)
        assert info is not None and info.retention == ext.retention, key
        assert info.retention.until >= datetime.now(UTC) + timedelta(days=30)


def test_the_dry_run_lists_the_milestone_locks_the_apply_would_raise_from_the_catalog_alone(tmp_path: Path) -> None:
    from ckptvault.config import PolicyConfig
    from ckptvault.pricing import load_prices
    from ckptvault.tiering import milestone_lock
    from ckptvault.tiering.policy import plan
    from ckptvault.tiering.report import plan_record, render_markdown, render_text

    store = MemoryStore("ckpts", object_lock=True)
    lock = LockConfig(mode="governance", days=1)
    _ingest(tmp_path, store, lock)
    catalog = Catalog(store, PREFIX)
    states = catalog.current("r")
    policy = PolicyConfig(milestone_every_steps=100, milestone_lock_days=3650)
    [would] = milestone_lock.would_extend(states, policy, lock)  # no store: the catalog's states only
    [done] = milestone_lock.extend_all(store, PREFIX, states, policy, lock)
    assert (would.run, would.step, would.save, would.retention, would.days) == (
        done.run, done.step, done.save, done.retention, done.days
    )  # fmt: skip
    assert would.objects == done.objects  # the save's files and its manifest
    p = plan(states, policy, load_prices({}), "aws", datetime.now(UTC).timestamp())
    until = f"{would.retention.until:%Y-%m-%d %H:%M} UTC"
    assert f"would lock r step 100 save 1 (GOVERNANCE) until {until}, 3650 days after its commit" in render_text(
        p, [would]
    )
    assert plan_record(p, [would])["lock_extended"] == [would.as_dict()]
    assert f"- {would.would()}" in render_markdown(p, [would])  # the tier flow's plan artifact
    catalog.append([done.event()])  # what the tier flow records: the catalog now knows the date
    assert milestone_lock.would_extend(catalog.current("r"), policy, lock) == []
    assert milestone_lock.would_extend(states, policy, LockConfig()) == []  # [lock] off: nothing is locked


def test_the_bucket_default_retention_is_reported_and_locks_what_ckptvault_writes_unlocked(tmp_path: Path) -> None:
    from ckptvault.objectlock.save_lock import bucket_lock
    from ckptvault.tiering.apply import expire
    from ckptvault.tiering.report import bucket_lock_line, bucket_lock_record

    store = MemoryStore("ckpts", object_lock=True, default_retention=("governance", 30))
    status = bucket_lock(store)
    assert status == LockStatus(True, "GOVERNANCE", 30)
    assert bucket_lock_line("ckpts", status) == "bucket ckpts: Object Lock on, default retention GOVERNANCE 30 days"
    assert bucket_lock_record("ckpts", status) == {
        "bucket": "ckpts", "object_lock": "on", "default_retention": {"mode": "GOVERNANCE", "days": 30, "years": None}
    }  # fmt: skip
    # [lock] off: the catalog records no lock, the default retention locks every object all the same;
    # so the plan has the expiry, and the apply's HEAD of the manifest postpones it, with the mode
    _ingest(tmp_path, store, LockConfig())
    [state] = Catalog(store, PREFIX).current("r")
    assert state.locked_until is None
    r = expire(store, PREFIX, "r", 100)
    assert r.kind == "postponed" and r.detail.endswith(" UTC (GOVERNANCE)"), r.detail
    assert store.head(checkpoint_prefix(PREFIX, "r", 100) + MANIFEST_NAME) is not None

    assert bucket_lock_line("plain", bucket_lock(MemoryStore("plain"))) == "bucket plain: Object Lock off"
    assert bucket_lock_line("x", LockStatus(True)) == "bucket x: Object Lock on, no default retention"
    years = LockStatus(True, "COMPLIANCE", None, 2)
    assert bucket_lock_line("x", years).endswith("default retention COMPLIANCE 2 years")
    with pytest.raises(ValueError, match="needs a bucket with Object Lock"):
        MemoryStore("plain", default_retention=("governance", 1))


class _Refusing(MemoryStore):
    def lock_status(self) -> LockStatus:  # what S3Store raises on an error it does not translate
        raise StoreError("reading the Object Lock configuration of s3://b: AccessDenied")


def test_a_bucket_lock_the_server_cannot_report_is_unknown_never_an_error() -> None:
    import boto3
    from botocore.stub import Stubber

    from ckptvault.objectlock.save_lock import bucket_lock
    from ckptvault.store import object_lock
    from ckptvault.tiering.report import bucket_lock_line, bucket_lock_record

    status = bucket_lock(_Refusing("b", object_lock=True))
    assert bucket_lock_record("b", status)["object_lock"] == "unknown"
    assert "Object Lock unknown" in bucket_lock_line("b", status)
    # the S3 adapter: a server without GetObjectLockConfiguration is unknown; one without a
    # configuration is off; a default given in years is kept in years
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="k", aws_secret_access_key="s")
    with Stubber(client) as stub:
        op = "get_object_lock_configuration"
        stub.add_client_error(op, "NotImplemented", http_status_code=501)
        stub.add_client_error(op, "ObjectLockConfigurationNotFoundError", http_status_code=404)
        # moto's answer: the period not given as 0
        conf = {
            "ObjectLockEnabled": "Enabled",
            "Rule": {"DefaultRetention": {"Mode": "COMPLIANCE", "Years": 1, "Days": 0}},
        }
        stub.add_response(op, {"ObjectLockConfiguration": conf})
        assert object_lock.status(client, "b") == LockStatus(False, known=False)
        assert object_lock.status(client, "b") == LockStatus(False)
        assert object_lock.status(client, "b") == LockStatus(True, "COMPLIANCE", None, 1)


class _RecordingS3:
    """Stands in for the boto3 client (the server, not our code): records each request's name and
    arguments; its HEAD reports a completed two-part object without a lock, as Ceph RGW 16.2 does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    def head_object(self, **kw: object) -> dict[str, object]:
        self.calls.append(("head_object", kw))
        return {"ContentLength": 12 * MiB, "ETag": '"abc-2"'}

    def put_object_tagging(self, **kw: object) -> dict[str, object]:
        self.calls.append(("put_object_tagging", kw))
        return {}

    def put_object_retention(self, **kw: object) -> dict[str, object]:
        self.calls.append(("put_object_retention", kw))
        return {}


@pytest.mark.parametrize(("validated", "parts"), [(False, 2), (True, 2), (False, 0)])
def test_an_upload_records_the_crc32c_tag_before_the_lock_where_the_server_keeps_no_crc32c(
    validated: bool, parts: int
) -> None:
    """A kill between the lock and the tag left a locked object a rerun could not recognise: it sent
    the file again and the killed version stayed behind, locked and billed until its date (found by
    tests/reliability/test_crash_lock.py on Ceph RGW). The tag goes first, and only where it is the
    rerun's one record of the CRC32C: a multipart object on a server that keeps none."""
    from typing import Any

    from ckptvault.store import Capabilities
    from ckptvault.store.multipart import retag
    from ckptvault.store.object_lock import put_args
    from ckptvault.store.upload_request import UploadRequest, verify

    client = _RecordingS3()
    until = datetime(2031, 1, 2, tzinfo=UTC)
    caps = Capabilities(checksums_validated=validated, conditional_writes=True, restore_object=False,
                        lifecycle_transitions=True, kind="ceph")  # fmt: skip
    s3: Any = client
    req = UploadRequest(
        client=s3, bucket="b", key="k", path=Path("f"), transfer=TransferConfig(), caps=caps,
        put_args=put_args(Retention("GOVERNANCE", until)), tags={"run": "r", "step": "100"},
        sha256=False, progress=None, endpoint=None,
    )  # fmt: skip
    verify(req, size=12 * MiB, parts=parts, crc="AAAAAA==", composite=None)
    names = [name for name, _ in client.calls]
    if parts and not validated:
        assert names == ["head_object", "put_object_tagging", "put_object_retention"]
        tagset = client.calls[1][1]["Tagging"]
        assert tagset == {"TagSet": [{"Key": "run", "Value": "r"}, {"Key": "step", "Value": "100"},
                                     {"Key": "crc32c", "Value": "AAAAAA=="}]}  # fmt: skip
    else:
        assert names == ["head_object", "put_object_retention"]
    assert client.calls[-1][1]["Retention"] == {"Mode": "GOVERNANCE", "RetainUntilDate": until}
    # the tags put again after a completion (Ceph drops CreateMultipartUpload's) go with the CRC32C
    # tag where there is one, so that only the verifying HEAD comes between the completion and it
    client.calls.clear()
    retag(req)
    assert [name for name, _ in client.calls] == (["put_object_tagging"] if validated else [])


def test_content_md5_goes_with_a_locked_write_only_where_no_validated_crc32c_does() -> None:
    from ckptvault.store import object_lock
    from ckptvault.store.memory import CAPABILITIES

    lock = Retention("GOVERNANCE", datetime(2027, 1, 1, tzinfo=UTC))
    unvalidated = replace(CAPABILITIES, checksums_validated=False)  # Ceph RGW 16.2, moto
    defaulted = replace(unvalidated, integrity_header=True)  # moto with a bucket default retention
    assert object_lock.needs_content_md5(unvalidated, lock)
    assert object_lock.needs_content_md5(defaulted, None)
    # never paid where nothing asks for it, nor where every body carries x-amz-checksum-crc32c
    assert not object_lock.needs_content_md5(unvalidated, None)
    assert not object_lock.needs_content_md5(CAPABILITIES, lock)
    assert not object_lock.needs_content_md5(replace(CAPABILITIES, integrity_header=True), None)


def test_a_bucket_default_retention_dates_a_write_days_or_years_after_it() -> None:
    from ckptvault.store.object_lock import default_retention

    written = datetime(2028, 2, 29, 13, 5, tzinfo=UTC)
    assert default_retention(LockStatus(True, "GOVERNANCE", 30), written) == Retention(
        "GOVERNANCE", datetime(2028, 3, 30, 13, 5, tzinfo=UTC)
    )
    assert default_retention(LockStatus(True, "COMPLIANCE", None, 1), written) == Retention(
        "COMPLIANCE", datetime(2029, 2, 28, 13, 5, tzinfo=UTC)
    )  # no 29 February in 2029
    assert default_retention(LockStatus(True, "compliance", None, 4), written) == Retention(
        "COMPLIANCE", datetime(2032, 2, 29, 13, 5, tzinfo=UTC)
    )
    assert default_retention(LockStatus(True), written) is None
    assert default_retention(LockStatus(False), written) is None


def test_what_the_probe_learnt_travels_with_the_store_to_a_split_uploads_range_tasks(tmp_path: Path) -> None:
    """A split upload's ranges run on Dask workers, each with the store unpickled there: the capabilities
    and the bucket's lock configuration go with it, so a range sends Content-MD5 without probing again.
    No request is sent (an unroutable endpoint: any request would fail the test)."""
    import pickle

    from ckptvault.store.memory import CAPABILITIES
    from ckptvault.store.s3 import S3Store

    store = S3Store(StoreConfig(bucket="bkt", endpoint_url="http://127.0.0.1:9", kind="moto"))
    store._caps = replace(CAPABILITIES, checksums_validated=False, integrity_header=True)
    store._bucket_lock = LockStatus(True, "GOVERNANCE", 2)  # what the flow's store read once
    worker = pickle.loads(pickle.dumps(store))
    req = worker._upload_request(tmp_path / "f", "k")
    assert req.content_md5 and req.bucket_lock == LockStatus(True, "GOVERNANCE", 2)
    # our own lock takes over: it is set by verify, the bucket's default is not read
    locked = worker.with_retention(Retention("COMPLIANCE", datetime(2027, 1, 1, tzinfo=UTC)))
    assert locked._upload_request(tmp_path / "f", "k").bucket_lock is None
    plain = pickle.loads(pickle.dumps(store))
    plain._caps = replace(CAPABILITIES, checksums_validated=False)
    req = plain._upload_request(tmp_path / "f", "k")
    assert not req.content_md5 and req.bucket_lock is None
