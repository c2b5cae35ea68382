"""The first half of a restore (ckptvault/restore/prepare.py), as `ckptvault restore` and the restore flow
both run it, on the in-memory store: bad input is refused before any copy is surveyed, the caller's
steps run in the order both callers rely on, and a primary that cannot be reached is read around."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from ckptvault.catalog import Catalog
from ckptvault.catalog import events as events_lib
from ckptvault.config import Config, ReplicaConfig, SourceConfig, StoreConfig
from ckptvault.ingest import steps
from ckptvault.restore import copies
from ckptvault.restore.complete import Chosen
from ckptvault.restore.copies import Copy, CopyStatus
from ckptvault.restore.prepare import Request, Ways, prepare
from ckptvault.restore.resolve import Resolution, RestoreError
from ckptvault.store import TransferConfig
from ckptvault.store.memory import MemoryStore
from ckptvault_cli.synthetic import write_checkpoint

MiB = 2**20
PREFIX = "t"


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    """A store holding run r's step 100, committed and recorded as verified in its catalog."""
    store = MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB))
    write_checkpoint(tmp_path / "hot", "hf", 100, 2 * MiB, shards=1, seed=1)
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
    manifest = steps.commit_manifest(store, PREFIX, found, entries)
    Catalog(store, PREFIX).append([events_lib.verified(manifest)])
    return store


class Seen:
    """The caller's steps, in the order prepare called them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def ways(self) -> Ways:
        def survey(cs: Sequence[Copy], run: str, step: int, save: int) -> list[CopyStatus]:
            self.calls.append("survey")
            return copies.survey(cs, run, step, save)

        def unreadable(objects: Mapping[str, str], why: str) -> None:
            self.calls.append("unreadable")

        def primary_down(problem: str) -> None:
            self.calls.append(f"primary down: {problem}")

        def resolved(res: Resolution) -> None:
            self.calls.append(f"resolved {res.step}")

        def planned(plan: Chosen) -> None:
            self.calls.append(f"planned from {plan.ordered[0].name}")

        return Ways(survey=survey, unreadable=unreadable, primary_down=primary_down, resolved=resolved, planned=planned)


def test_the_save_is_resolved_then_surveyed_then_estimated(store: MemoryStore, tmp_path: Path) -> None:
    cfg = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX))
    seen = Seen()
    prepared = prepare(cfg, [Copy(copies.PRIMARY, store, PREFIX)], Request("r", str(tmp_path / "dest")), seen.ways())
    assert seen.calls == ["resolved 100", "survey", "planned from primary"]
    chosen = prepared.chosen
    assert (chosen.resolution.step, chosen.resolution.save) == (100, 1)
    assert chosen.target == (tmp_path / "dest").resolve()
    assert chosen.estimate.objects == len(chosen.ordered[0].plans) > 0
    assert prepared.catalog is not None and prepared.catalog.store is store and not prepared.unreadable


def test_bad_input_is_refused_before_any_copy_is_surveyed(store: MemoryStore, tmp_path: Path) -> None:
    cfg = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX))
    primary = [Copy(copies.PRIMARY, store, PREFIX)]
    for asked in (Request("r", str(tmp_path), step="nope"), Request("r", str(tmp_path), step="200"),
                  Request("nobody", str(tmp_path))):  # fmt: skip
        seen = Seen()
        with pytest.raises(RestoreError):
            prepare(cfg, primary, asked, seen.ways())
        assert seen.calls == []  # nothing surveyed, nothing said: the caller refuses it as bad input
    seen = Seen()
    with pytest.raises(RestoreError):  # `--from` a copy that is not there: refused once surveyed, before the plan
        prepare(cfg, primary, Request("r", str(tmp_path), source="dr"), seen.ways())
    assert seen.calls == ["resolved 100", "survey"]


def test_a_primary_that_cannot_be_reached_is_read_around(store: MemoryStore, tmp_path: Path) -> None:
    cfg = Config(store=StoreConfig(bucket="ckpts", prefix=PREFIX),
                 replicas=[ReplicaConfig(name="dr", bucket="elsewhere", prefix=PREFIX)])  # fmt: skip
    seen = Seen()
    down = [Copy(copies.PRIMARY, None, PREFIX, "connection refused"), Copy("dr", store, PREFIX)]
    prepared = prepare(cfg, down, Request("r", str(tmp_path / "dest")), seen.ways())
    assert seen.calls == ["primary down: connection refused", "resolved 100", "survey", "planned from dr"]
    assert prepared.catalog is None  # nothing is recorded nor alerted without the primary
    assert [s.name for s in prepared.chosen.statuses] == ["primary", "dr"]
