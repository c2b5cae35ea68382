"""A restore into one directory (ckptvault/restore/downloads.py) on the in-memory store through the
test submitter (tests/unit/submitters.py): big files fetched as ranges between being made and being
verified, byte-identical; a failed download leaves the destination untouched and no staging behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptvault.checkpoint.manifest import Manifest
from ckptvault.config import SourceConfig
from ckptvault.ingest import steps
from ckptvault.restore import plan
from ckptvault.restore.downloads import restore_into
from ckptvault.restore.resolve import RestoreError
from ckptvault.store import TransferConfig
from ckptvault.store.memory import MemoryStore
from ckptvault.transfer.progress import ProgressBar
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Plain

PREFIX = "t"
MiB = 2**20


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture
def ingested(tmp_path: Path) -> tuple[MemoryStore, Manifest, Path]:
    store = MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB))
    src = write_checkpoint(tmp_path / "hot", "hf", 100, 16 * MiB, shards=1, seed=1)
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    entries = [steps.upload_one(store, j, found) for j in steps.plan_upload(store, PREFIX, found)]
    return store, steps.commit_manifest(store, PREFIX, found, entries), src


def _restore(ingested: tuple[MemoryStore, Manifest, Path], target: Path, submit: Plain) -> None:
    store, manifest, _ = ingested
    plans = plan.plan_objects(store, PREFIX, manifest)
    restore_into(submit, store, plans, target, manifest, ProgressBar(manifest.total_bytes, "r"), 5 * MiB, False)


def test_big_files_come_back_as_ranges_made_first_and_verified_last(
    ingested: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    submit = Plain(inline=False)
    _restore(ingested, tmp_path / "dest", submit)
    assert _tree(tmp_path / "dest" / "checkpoint-100") == _tree(ingested[2])
    names = submit.names()
    made = [i for i, n in enumerate(names) if n == "allocate"]
    fetched = [i for i, n in enumerate(names) if n == "fetch_range"]
    sealed = [i for i, n in enumerate(names) if n == "seal"]
    assert made and fetched and sealed and max(made) < min(fetched) and max(fetched) < min(sealed)
    assert names.index("write_pointer") < names.index("finalize")
    from ckptvault_prefect.tasks.restore import STEPS  # how the flow runs each of these calls

    assert {c.fn for c in submit.ran} <= STEPS.keys()


def test_a_failed_range_changes_nothing_and_leaves_no_staging(
    ingested: tuple[MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    submit = Plain(fail=lambda c: c.name == "fetch_range" and c.args[4] > 0)  # a range past the first
    with pytest.raises(RestoreError, match=r"downloads \(\d+ files, 2 as ranges\) failed; nothing was changed at"):
        _restore(ingested, tmp_path / "dest", submit)
    assert "finalize" not in submit.names() and "discard" in submit.names()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hot"]  # no destination, no staging beside it
