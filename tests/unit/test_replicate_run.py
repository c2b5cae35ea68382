"""A replicate run around the pass (ckptvault/replication/replicas.py and result.py), the calls
`ckptvault replicate` and the replicate flow share: which replicas, each one's store refused with its
name, and what a run reports, publishes (the flow's markdown artifact) and alerts. On MemoryStores."""

from __future__ import annotations

import random

import pytest

from ckptvault.alerts.alert import ALL_RUNS
from ckptvault.catalog import Catalog, CheckpointState, events
from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.config import LockConfig, ReplicaConfig
from ckptvault.errors import AlreadyAlerted
from ckptvault.replication import (
    ReplicateIncomplete,
    ReplicateResult,
    ReplicaUnusable,
    open_replica,
    replicate,
    select_replicas,
)
from ckptvault.replication import replicas as replicas_mod
from ckptvault.store import StoreError, TransientStoreError
from ckptvault.store.memory import MemoryStore

DR = ReplicaConfig(name="dr", bucket="replica", prefix="dr")
DR2 = ReplicaConfig(name="dr2", bucket="replica2", prefix="dr")
NO_LOCK = LockConfig()


def _primary(steps: tuple[int, ...] = (10, 20)) -> tuple[MemoryStore, Catalog, list[CheckpointState]]:
    """Committed saves of run r1, two small files each."""
    primary = MemoryStore("primary")
    catalog = Catalog(primary, "ck")
    rng = random.Random(1)
    for step in steps:
        base = checkpoint_prefix("ck", "r1", step)
        files = []
        for name, size in (("model.bin", 4096), ("config.json", 100)):
            data = rng.randbytes(size)
            primary.put_bytes(base + name, data)
            files.append(FileEntry(name, size, 1.0, to_b64(crc32c_update(data))))
        m = Manifest("r1", step, "hf", tuple(files), 1.0, 2.0, f"/hot/r1/step-{step}")
        primary.put_bytes(base + MANIFEST_NAME, m.to_json())
        catalog.append([events.verified(m)])
    return primary, catalog, catalog.current()


def test_select_replicas_takes_every_one_or_the_named_one_and_names_an_unknown_one() -> None:
    assert select_replicas([DR, DR2], None) == [DR, DR2]
    assert select_replicas([DR, DR2], "dr2") == [DR2]
    assert select_replicas([], None) == []  # nothing configured: a scheduled flow run has nothing to do
    with pytest.raises(ReplicaUnusable, match=r"no \[\[replicas\]\] entry is named 'nope' \(configured: dr, dr2\)"):
        select_replicas([DR, DR2], "nope")
    with pytest.raises(ReplicaUnusable, match=r"\(configured: none\)"):
        select_replicas([], "dr")


def test_open_replica_names_the_replica_in_every_refusal_and_lets_a_transient_error_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ReplicaUnusable, match=r"^replica dr: the credentials profile 'nope' does not exist"):
        open_replica(DR.model_copy(update={"profile": "nope", "endpoint_url": "http://127.0.0.1:9"}), NO_LOCK)

    class Refusing(MemoryStore):
        error: StoreError = StoreError("the bucket replica does not exist")

        def check_bucket(self) -> None:
            raise self.error

    store = Refusing("replica")
    monkeypatch.setattr(replicas_mod, "open_store", lambda cfg: store)
    with pytest.raises(ReplicaUnusable, match=r"^replica dr: the bucket replica does not exist$"):
        open_replica(DR, NO_LOCK)
    store.error = TransientStoreError("connection reset")  # the task's retry is for this one: not rewrapped
    with pytest.raises(TransientStoreError, match=r"^connection reset$"):
        open_replica(DR, NO_LOCK)

    plain = MemoryStore("replica")  # no Object Lock on the bucket
    monkeypatch.setattr(replicas_mod, "open_store", lambda cfg: plain)
    assert open_replica(DR, NO_LOCK) is plain
    with pytest.raises(ReplicaUnusable, match=r"^replica dr: .*Object Lock"):
        open_replica(DR, LockConfig(mode="governance", days=7))


def test_a_run_with_a_failed_save_and_a_stopped_replica_reports_publishes_and_alerts_each_by_name() -> None:
    primary, catalog, states = _primary()
    bad = checkpoint_prefix("ck", "r1", 20) + "model.bin"
    primary.put_bytes(bad, random.Random(9).randbytes(4096))  # bit rot on the primary: same size, other bytes
    replica = MemoryStore("replica")
    p = replicate(primary, "ck", replica, DR, states, NO_LOCK, catalog=catalog)
    result = ReplicateResult.of([("dr", p), ("dr2", TransientStoreError("dr2.example: connection refused"))])

    assert not result.ok
    assert [s.step for s in p.copied] == [10] and [f.label for f in p.failures] == ["r1 step 20 save 1"]
    doc = result.as_dict()
    assert doc["stopped"] == {"dr2": "dr2.example: connection refused"}
    (one,) = doc["replicas"]
    assert one["replica"] == "dr" and one["present"] == 0 and list(one["failed"]) == ["r1 step 20 save 1"]

    lines = result.lines()
    assert (False, "dr: 1 saves copied, 0 already there, 1 failed") in lines
    assert [text for bad, text in lines if bad] == [
        f"dr: r1 step 20 save 1 FAILED: {p.failures[0].error}",
        "dr2: stopped: dr2.example: connection refused",
    ]

    (done,) = p.copied  # 2 files and the manifest
    md = result.to_markdown()
    assert f"| dr | 1 | 0 | 3 | 0 | {done.bytes} (" in md and md.splitlines()[4].endswith(f"| {done.seconds:.1f} | 1 |")
    assert "| dr2 | - | - | - | - | - | - | stopped |" in md
    assert f"| dr | r1 | 10 | 1 | 3 | 0 | {done.bytes} |" in md
    assert "- dr: r1 step 20 save 1: " in md and "CRC32C" in md
    assert "- dr2: the pass stopped: dr2.example: connection refused" in md

    save_alert, stopped_alert = result.alerts("http://prefect/run/1")
    assert save_alert.kind == stopped_alert.kind == "replicate_failed"
    assert (save_alert.run, save_alert.step) == ("r1", 20)
    assert "r1 step 20 save 1 to replica dr FAILED" in save_alert.summary and "CRC32C" in save_alert.details[0]
    assert "replicate --replica dr" in save_alert.next_step and save_alert.flow_run_url == "http://prefect/run/1"
    assert (stopped_alert.run, stopped_alert.step) == (ALL_RUNS, None)
    assert "replica dr2 stopped" in stopped_alert.summary and "connection refused" in stopped_alert.details[0]
    assert save_alert.dedup_key() != stopped_alert.dedup_key()

    err = ReplicateIncomplete(result)
    assert isinstance(err, AlreadyAlerted) and err.result is result  # the failure hook stays quiet
    assert "dr: r1 step 20 save 1 FAILED" in str(err) and "dr2: stopped" in str(err)


def test_a_rerun_that_copies_nothing_reports_ok_with_an_empty_row() -> None:
    primary, catalog, states = _primary()
    replica = MemoryStore("replica")
    first = ReplicateResult.of([("dr", replicate(primary, "ck", replica, DR, states, NO_LOCK, catalog=catalog))])
    assert first.ok and first.alerts() == []
    again = ReplicateResult.of([("dr", replicate(primary, "ck", replica, DR, catalog.current(), NO_LOCK))])
    assert again.ok and again.alerts() == []
    assert again.lines() == [(False, "dr: nothing to copy (2 saves already there)")]
    md = again.to_markdown()
    assert "| dr | 0 | 2 | 0 | 0 | 0 (0 B) | 0.0 | 0 |" in md
    assert "### Saves copied" not in md and "### Not copied" not in md
    assert ReplicateResult().ok and ReplicateResult().as_dict() == {"replicas": [], "stopped": {}}
