"""The library's lifecycle on the in-memory store, no server and no Prefect: ingest (data first, the
manifest last), restore, tiering with a thaw, the catalog's events, alert state, and a drill, each
through the library functions the tasks call. The same functions run against real servers in
tests/flows and tests/reliability; here they run in a second each."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from ckptvault.alerts.sending import load_alert_state, save_alert_state
from ckptvault.alerts.watch import AlertState, Episode
from ckptvault.catalog import Catalog, events
from ckptvault.checkpoint.manifest import MANIFEST_NAME, Manifest, checkpoint_prefix
from ckptvault.config import SourceConfig
from ckptvault.ingest import steps as ingest
from ckptvault.restore import drill
from ckptvault.restore import steps as restore
from ckptvault.store import ChecksumMismatchError, ObjectFrozenError
from ckptvault.store.memory import MemoryStore
from ckptvault.tiering import apply as tiering

PREFIX = "t"


class RecordingStore(MemoryStore):
    """A MemoryStore that remembers the order in which keys were written."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[str] = []

    def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> None:
        super().put_bytes(key, data, **kwargs)
        self.writes.append(key)

    def upload_file(self, path: Path, key: str, **kwargs: Any) -> Any:
        result = super().upload_file(path, key, **kwargs)
        self.writes.append(key)
        return result


def _hf_checkpoint(root: Path, step: int) -> Path:
    """A Hugging Face Trainer checkpoint as transformers writes it: trainer_state.json last."""
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    rng = np.random.default_rng(step)
    save_file({"w": rng.standard_normal((64, 32)).astype(np.float32), "b": np.zeros(32, np.float32)},
              str(d / "model.safetensors"))  # fmt: skip
    (d / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 32}))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": [{"loss": 1.0 / step}]}))
    return d


def _ingest(store: MemoryStore, root: Path, step: int) -> tuple[Manifest, Path]:
    src = _hf_checkpoint(root, step)
    result = ingest.find_checkpoints(SourceConfig(run="r", path=root, format="hf", settle_seconds=0))
    [found] = [f for f in result.found if f.step == step]
    assert found.ready, found.reason
    jobs = ingest.plan_upload(store, PREFIX, found)
    assert all(j.upload for j in jobs)
    entries = [ingest.upload_one(store, j, found) for j in jobs]
    assert not ingest.is_committed(store, PREFIX, found)  # every byte is up, nothing exists yet
    manifest = ingest.commit_manifest(store, PREFIX, found, entries)
    assert ingest.is_committed(store, PREFIX, found)
    return manifest, src


def _restore(store: MemoryStore, manifest: Manifest, dest: Path) -> Path:
    plans = restore.plan_objects(store, PREFIX, manifest)
    # largest first, so the biggest download starts first on the threads or Dask workers
    assert [p.stored_bytes for p in plans] == sorted((f.stored_bytes for f in manifest.files), reverse=True)
    staged = restore.staging_dir(dest)
    for plan in plans:
        restore.download_one(store, plan, staged, manifest)
    restore.finalize(staged, dest, force=False)
    return dest / restore.checkpoint_name(manifest)


def _tree(d: Path) -> Mapping[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_ingest_writes_every_data_object_before_the_manifest_and_a_rerun_sends_nothing(tmp_path: Path) -> None:
    store = RecordingStore("b")
    manifest, src = _ingest(store, tmp_path / "run", 100)
    base = checkpoint_prefix(PREFIX, "r", 100)
    data = sorted(base + f.path for f in manifest.files)
    assert store.writes[-1] == base + MANIFEST_NAME  # the commit marker, last
    # (a single PUT is recorded twice: upload_file writes through put_bytes)
    assert sorted({k for k in store.writes[:-1] if k.startswith(base)}) == data
    assert store.writes.count(base + MANIFEST_NAME) == 1
    assert {f.path for f in manifest.files} == set(_tree(src))
    result = ingest.find_checkpoints(SourceConfig(run="r", path=tmp_path / "run", format="hf", settle_seconds=0))
    again = ingest.plan_upload(store, PREFIX, result.found[0])
    assert [j.upload for j in again] == [False] * len(data)  # stored CRC32Cs equal the local files'


def test_restore_brings_back_the_checkpoint_byte_identical_and_refuses_a_changed_object(tmp_path: Path) -> None:
    store = MemoryStore("b")
    manifest, src = _ingest(store, tmp_path / "run", 200)
    loaded = restore.load_manifest(store, PREFIX, "r", 200)
    assert loaded.files == manifest.files
    back = _restore(store, loaded, tmp_path / "dest")
    assert _tree(back) == _tree(src)

    key = checkpoint_prefix(PREFIX, "r", 200) + "model.safetensors"
    store.put_bytes(key, store.get_bytes(key)[:-1] + b"\0")  # same size, one byte changed
    [plan] = [p for p in restore.plan_objects(store, PREFIX, loaded) if p.key == key]
    with pytest.raises(ChecksumMismatchError, match=r"model\.safetensors"):
        restore.download_one(store, plan, restore.staging_dir(tmp_path / "again"), loaded)


def test_tiering_moves_data_not_the_manifest_and_a_restore_thaws_first_then_expiry_removes_it(
    tmp_path: Path,
) -> None:
    store = MemoryStore("b", restore_seconds=0)
    manifest, src = _ingest(store, tmp_path / "run", 300)
    done = tiering.transition(store, PREFIX, manifest, "GLACIER", "cold", milestone=False)
    assert done.objects == len(manifest.files)
    base = checkpoint_prefix(PREFIX, "r", 300)
    classes = {o.key: o.storage_class for o in store.list(base)}
    assert classes.pop(base + MANIFEST_NAME) == "STANDARD"  # planning a restore never needs a thaw
    assert set(classes.values()) == {"GLACIER"}
    assert store.get_tags(base + "config.json")[tiering.TIER_TAG] == "cold"

    plans = restore.plan_objects(store, PREFIX, manifest)
    assert not any(p.thawed for p in plans)
    with pytest.raises(ObjectFrozenError):
        restore.download_one(store, plans[0], restore.staging_dir(tmp_path / "early"), manifest)
    restore.request_thaw(store, plans, "Bulk")
    assert restore.still_frozen(store, plans) == []
    assert _tree(_restore(store, manifest, tmp_path / "dest")) == _tree(src)

    gone = tiering.expire(store, PREFIX, "r", 300)
    assert gone.objects == len(manifest.files) and list(store.list(base)) == []


def test_catalog_events_append_and_fold_into_the_current_state(tmp_path: Path) -> None:
    store = MemoryStore("b")
    manifest, _ = _ingest(store, tmp_path / "run", 400)
    catalog = Catalog(store, PREFIX)
    catalog.append([events.verified(manifest, "flow-1")])
    catalog.append([events.transitioned(manifest, "GLACIER", "older than 7 days", "client", "flow-2")])
    [state] = catalog.current("r")
    assert (state.step, state.verified, state.storage_class) == (400, True, "GLACIER")
    assert [e.event for e in catalog.events("r")] == ["verified", "transitioned"]
    assert Catalog(store, PREFIX).current() == [state]  # a second reader sees the same log


def test_alert_state_is_saved_merged_and_not_rewritten_when_unchanged() -> None:
    store = MemoryStore("b")
    now = time.time()
    first = AlertState(sent={"run_stale:r": now}, stale={"r": Episode(newest_at=now - 7200, opened_at=now)})
    assert save_alert_state(store, PREFIX, first) is not None
    other = AlertState(sent={"budget:2026-12": now})
    save_alert_state(store, PREFIX, other)  # another writer's state merges, nothing is lost
    merged = load_alert_state(store, PREFIX)
    assert set(merged.sent) == {"run_stale:r", "budget:2026-12"} and merged.stale == first.stale
    assert save_alert_state(store, PREFIX, merged) is None  # the hourly pass that changes nothing writes nothing


def test_a_drill_selects_restores_load_checks_and_records_the_newest_checkpoint(tmp_path: Path) -> None:
    store = MemoryStore("b")
    catalog = Catalog(store, PREFIX)
    for step in (500, 600):
        manifest, _ = _ingest(store, tmp_path / "run", step)
        catalog.append([events.verified(manifest)])
    selection = drill.select(catalog.current("r"), sample=1)
    assert ("r", 600, 1) in selection.newest  # each run's newest is drilled every time
    results = []
    for chosen in selection.chosen:
        t0 = time.monotonic()
        manifest = restore.load_manifest(store, PREFIX, "r", chosen.step, chosen.save)
        back = _restore(store, manifest, tmp_path / f"scratch-{chosen.step}")
        problems = drill.load_report(back).problems  # what the drill flow's load-check task returns
        assert problems == []
        seconds = time.monotonic() - t0
        results.append(drill.DrillResult("r", chosen.step, chosen.save, True, seconds, manifest.total_bytes))
    catalog.append([r.event() for r in results])
    states = {s.step: s for s in catalog.current("r")}
    drilled = {c.step for c in selection.chosen}
    assert 600 in drilled
    assert all(states[step].last_drill_ok is True for step in drilled)
    assert all(states[step].last_drill_at is None for step in states.keys() - drilled)


def test_a_node_local_rerun_leaves_the_crc_check_to_the_node_and_sends_only_what_changed(tmp_path: Path) -> None:
    store = RecordingStore("b")
    manifest, src = _ingest(store, tmp_path / "run", 100)
    # the same size, other bytes: only a CRC32C comparison can tell
    (src / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 64}))
    result = ingest.find_checkpoints(SourceConfig(run="r", path=tmp_path / "run", format="hf", settle_seconds=0))
    [found] = result.found
    jobs = ingest.plan_upload(store, PREFIX, found, read_local=False)  # the flow cannot read node files
    same_size = [j for j in jobs if j.check_crc32c is not None]
    assert len(same_size) == len(jobs) and all(j.upload for j in jobs)  # none kept without the node's look
    store.writes.clear()
    entries = [ingest.upload_one(store, j, found) for j in jobs]  # on the node: compared there
    kept = {e.path for e in entries} - {k.rsplit("/", 1)[-1] for k in store.writes}
    assert kept == {"model.safetensors", "trainer_state.json"}  # the node kept every unchanged object ...
    assert {k.rsplit("/", 1)[-1] for k in store.writes} == {"config.json"}  # ... and sent the changed one
    assert {e.path: e.crc32c for e in entries}.keys() == {f.path for f in manifest.files}
