"""Restore from a copy (docs/replicas.md, "Restore from a copy"): which copy is read (`copies.rank` and
`copies.choose`, pure), what `survey` sees of each, and the fallback file by file
(`fallback.restore_from_copies`) on in-memory stores: a corrupt or missing object on the primary is read
from the replica and reported, a file no copy can give leaves the destination untouched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptvault.catalog import Catalog
from ckptvault.checkpoint.manifest import Manifest, checkpoint_prefix
from ckptvault.config import SourceConfig
from ckptvault.ingest import steps
from ckptvault.restore import copies
from ckptvault.restore.copies import Copy, CopyStatus, UnknownCopyError
from ckptvault.restore.fallback import restore_from_copies
from ckptvault.restore.plan import ObjectPlan
from ckptvault.restore.resolve import RestoreError
from ckptvault.store import TransferConfig, TransientStoreError
from ckptvault.store.memory import MemoryStore
from ckptvault.transfer.progress import ProgressBar
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Plain

MiB = 2**20
PREFIX = "t"
DR = "dr"


def _plan(storage_class: str = "STANDARD", thawed: bool = True) -> ObjectPlan:
    return ObjectPlan("k", "a.bin", 10, "AAAAAA==", 0.0, storage_class, thawed)


def _status(name: str, order: int, *, reachable: bool = True, complete: bool = True, cls: str = "STANDARD",
            thawed: bool = True, missing: int = 0) -> CopyStatus:  # fmt: skip
    gone = {f"m{i}": "missing" for i in range(missing)}
    return CopyStatus(name, reachable, complete, order, plans=(_plan(cls, thawed),), missing=gone)


def _names(statuses: list[CopyStatus]) -> list[str]:
    return [s.name for s in statuses]


# --- which copy: pure ---------------------------------------------------------------------------------------


def test_rank_puts_usable_first_then_no_thaw_then_the_cheaper_class_then_fewer_missing_then_config_order() -> None:
    primary = _status("primary", 0)
    assert _names(copies.rank([_status("dr", 1), primary])) == ["primary", "dr"]  # a tie: the configuration's order
    down = _status("primary", 0, reachable=False, complete=False)
    assert _names(copies.rank([down, _status("dr", 1)])) == ["dr", "primary"]
    not_there = _status("primary", 0, complete=False)
    assert _names(copies.rank([not_there, _status("dr", 1, cls="DEEP_ARCHIVE", thawed=False)])) == ["dr", "primary"]
    # no thaw beats a thaw, even of the primary
    frozen = _status("primary", 0, cls="GLACIER", thawed=False)
    assert _names(copies.rank([frozen, _status("dr", 1, cls="STANDARD_IA")])) == ["dr", "primary"]
    # a thawed GLACIER object needs no thaw, but STANDARD is still cheaper to read back
    assert _names(copies.rank([_status("primary", 0, cls="GLACIER"), _status("dr", 1)])) == ["dr", "primary"]
    assert _names(copies.rank([_status("primary", 0, cls="STANDARD_IA"), _status("dr", 1)])) == ["dr", "primary"]
    # a class ckptvault does not know (Ceph's COLD) reads like STANDARD_IA: after STANDARD, before GLACIER_IR
    ranked = copies.rank([_status("a", 0, cls="GLACIER_IR"), _status("b", 1, cls="COLD"), _status("c", 2)])
    assert _names(ranked) == ["c", "b", "a"]
    assert _names(copies.rank([_status("primary", 0, missing=1), _status("dr", 1)])) == ["dr", "primary"]


def test_choose_gives_the_usable_copies_in_rank_order_or_the_forced_one_first() -> None:
    statuses = [_status("primary", 0), _status("dr", 1), _status("far", 2, reachable=False, complete=False)]
    assert _names(copies.choose(statuses)) == ["primary", "dr"]  # the unreachable one is no fallback
    assert _names(copies.choose(statuses, "dr")) == ["dr", "primary"]
    with pytest.raises(RestoreError, match=r"--from far: far: unreachable"):
        copies.choose(statuses, "far")
    with pytest.raises(UnknownCopyError, match=r"--from nosuch: no such store \(known: primary, dr, far\)"):
        copies.choose(statuses, "nosuch")
    none = [_status("primary", 0, reachable=False, complete=False), _status("dr", 1, complete=False)]
    with pytest.raises(RestoreError, match=r"no copy of this save can be read: primary: unreachable"):
        copies.choose(none)


# --- on in-memory stores ------------------------------------------------------------------------------------


def _copy_all(src: MemoryStore, src_prefix: str, dst: MemoryStore, dst_prefix: str) -> None:
    """What the replicate pass leaves on a replica: every object, key for key under its own prefix."""
    for o in src.list(f"{src_prefix}/"):
        dst.put_bytes(dst_prefix + o.key[len(src_prefix) :], src.get_bytes(o.key))


@pytest.fixture
def two_copies(tmp_path: Path) -> tuple[MemoryStore, MemoryStore, Manifest, Path]:
    transfer = TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB)
    primary = MemoryStore("ckpts", transfer=transfer)
    replica = MemoryStore("ckpts-dr", transfer=transfer)
    src = write_checkpoint(tmp_path / "hot", "hf", 100, 16 * MiB, shards=2, seed=1)
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    entries = [steps.upload_one(primary, j, found) for j in steps.plan_upload(primary, PREFIX, found)]
    manifest = steps.commit_manifest(primary, PREFIX, found, entries)
    _copy_all(primary, PREFIX, replica, DR)
    return primary, replica, manifest, src


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _restore(primary: MemoryStore | None, replica: MemoryStore, target: Path, submit: Plain | None = None,
             forced: str | None = None) -> tuple[list[str], list[tuple[str, str, str]]]:  # fmt: skip
    found = [Copy("primary", primary, PREFIX, "" if primary else "connection refused"), Copy("dr", replica, DR)]
    statuses = copies.survey(found, "r", 100, 1)
    ordered = copies.choose(statuses, forced)
    bar = ProgressBar(sum(p.size for p in ordered[0].plans), "r")
    assert ordered[0].manifest is not None
    done = restore_from_copies(submit or Plain(), ordered, target, ordered[0].manifest, bar, 4 * MiB, False)
    return _names(ordered), [(f.path, f.source, f.because) for f in done.fallbacks]


def _biggest(manifest: Manifest) -> str:
    return max(manifest.files, key=lambda f: f.size).path


def test_a_corrupt_object_on_the_primary_is_read_from_the_replica_and_reported(
    two_copies: tuple[MemoryStore, MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    primary, replica, manifest, src = two_copies
    small = min((f for f in manifest.files if f.size > 0), key=lambda f: f.size)
    big = _biggest(manifest)  # over the 4 MiB threshold: fetched as ranges, so its seal finds the mismatch
    for path, size in ((small.path, small.size), (big, max(f.size for f in manifest.files))):
        key = checkpoint_prefix(PREFIX, "r", 100) + path
        primary.put_bytes(key, b"\x00" * size)  # the same size: only the CRC32C can tell
    order, fallbacks = _restore(primary, replica, tmp_path / "dest")
    assert order == ["primary", "dr"]
    assert _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)
    assert sorted(fallbacks) == sorted(
        [(small.path, "dr", "crc32c mismatch on primary"), (big, "dr", "crc32c mismatch on primary")]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "hot"]  # no staging left behind


def test_a_missing_object_makes_the_complete_replica_the_first_copy_and_forcing_the_primary_falls_back(
    two_copies: tuple[MemoryStore, MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    primary, replica, manifest, src = two_copies
    gone = manifest.files[0].path
    primary.delete(checkpoint_prefix(PREFIX, "r", 100) + gone)
    order, fallbacks = _restore(primary, replica, tmp_path / "a")
    assert (order, fallbacks) == (["dr", "primary"], [])  # the complete copy ranks first
    assert _tree(tmp_path / "a" / "checkpoint-100") == _tree(src)
    order, fallbacks = _restore(primary, replica, tmp_path / "b", forced="primary")
    assert (order, fallbacks) == (["primary", "dr"], [(gone, "dr", "missing on primary")])
    assert _tree(tmp_path / "b" / "checkpoint-100") == _tree(src)
    # missing on every copy: refused before anything is fetched
    replica.delete(checkpoint_prefix(DR, "r", 100) + gone)
    submit = Plain()
    with pytest.raises(RestoreError, match=rf"1 objects .* missing or wrong on every copy \(primary, dr\): {gone}"):
        _restore(primary, replica, tmp_path / "c", submit)
    assert "download_one" not in submit.names() and not (tmp_path / "c").exists()


def test_an_unreachable_primary_restores_the_whole_save_from_the_replica(
    two_copies: tuple[MemoryStore, MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    _, replica, _, src = two_copies
    order, fallbacks = _restore(None, replica, tmp_path / "dest")
    assert (order, fallbacks) == (["dr"], [])
    assert _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)


def test_a_primary_failing_mid_way_keeps_what_it_verified_and_is_not_asked_again(
    two_copies: tuple[MemoryStore, MemoryStore, Manifest, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary, replica, manifest, src = two_copies
    asked: list[tuple[str, bool]] = []  # (key, answered) of every read of the primary

    def storm(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(key: str, *args: Any, **kwargs: Any) -> Any:
            if len(asked) >= 3:  # three reads come back, then 503s that outlive botocore's retries
                asked.append((key, False))
                raise TransientStoreError(f"downloading {key}: 503 SlowDown, gave up after 5 attempts")
            asked.append((key, True))
            return real(key, *args, **kwargs)

        return call

    monkeypatch.setattr(primary, "download_file", storm(primary.download_file))
    monkeypatch.setattr(primary, "download_range", storm(primary.download_range))
    submit = Plain()
    order, fallbacks = _restore(primary, replica, tmp_path / "dest", submit)
    assert order == ["primary", "dr"]
    assert _tree(tmp_path / "dest" / "checkpoint-100") == _tree(src)
    # one failure trips the primary's breaker: none of its other files is asked of it
    assert [ok for _, ok in asked] == [True, True, True, False]
    base = checkpoint_prefix(PREFIX, "r", 100)
    served = {k[len(base) :] for k, ok in asked if ok} - {asked[-1][0][len(base) :]}
    assert served  # the files the primary gave before failing are kept, not fetched again
    assert {path for path, _, _ in fallbacks} == {f.path for f in manifest.files} - served
    assert all(source == "dr" and why.startswith("primary failing or unreachable: ") for _, source, why in fallbacks)
    from ckptvault_prefect.tasks.restore import STEPS  # how the flow runs each of these calls

    assert {c.fn for c in submit.ran} <= STEPS.keys()


def test_a_file_no_copy_can_give_changes_nothing_and_leaves_no_staging(
    two_copies: tuple[MemoryStore, MemoryStore, Manifest, Path], tmp_path: Path
) -> None:
    primary, replica, manifest, _ = two_copies
    big = _biggest(manifest)
    size = max(f.size for f in manifest.files)
    for store, prefix in ((primary, PREFIX), (replica, DR)):
        store.put_bytes(checkpoint_prefix(prefix, "r", 100) + big, b"\x01" * size)
    submit = Plain()
    with pytest.raises(RestoreError, match=rf"1 of {len(manifest.files)} files could be read from no copy") as e:
        _restore(primary, replica, tmp_path / "dest", submit)
    assert f"{big}: crc32c mismatch on primary; crc32c mismatch on dr" in str(e.value)
    assert "finalize" not in submit.names() and "discard" in submit.names()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hot"]  # no destination, no staging beside it
    from ckptvault_prefect.tasks.restore import STEPS  # how the flow runs each of these calls

    assert {c.fn for c in submit.ran} <= STEPS.keys()


def test_survey_sees_a_frozen_replica_and_ranks_it_after_the_primary(tmp_path: Path) -> None:
    primary = MemoryStore("ckpts")
    replica = MemoryStore("ckpts-dr", write_class="DEEP_ARCHIVE")
    write_checkpoint(tmp_path / "hot", "hf", 100, 1 * MiB, shards=1, seed=2)
    [found] = steps.find_checkpoints(SourceConfig(run="r", path=tmp_path / "hot", format="hf", settle_seconds=0)).found
    entries = [steps.upload_one(primary, j, found) for j in steps.plan_upload(primary, PREFIX, found)]
    steps.commit_manifest(primary, PREFIX, found, entries)
    _copy_all(primary, PREFIX, replica, DR)
    hot = replica.under("")  # the replica's manifest readable (the objects stay DEEP_ARCHIVE)
    hot.write_class = "STANDARD"
    key = checkpoint_prefix(PREFIX, "r", 100) + "_MANIFEST.json"
    hot.put_bytes(checkpoint_prefix(DR, "r", 100) + "_MANIFEST.json", primary.get_bytes(key))
    found_copies = [Copy("primary", primary, PREFIX), Copy("dr", replica, DR), Copy("empty", MemoryStore("e"), "x")]
    statuses = copies.survey(found_copies, "r", 100, 1)
    by = {s.name: s for s in statuses}
    assert by["dr"].usable and by["dr"].frozen > 0 and by["primary"].frozen == 0
    assert not by["empty"].complete and by["empty"].reachable  # no manifest there: not holding the save
    assert _names(copies.choose(statuses)) == ["primary", "dr"]
    lines = copies.report(copies.choose(statuses), statuses)
    assert "primary" in lines[0] and "<- read from" in lines[0] and "objects to thaw" in lines[1]
    assert "empty: does not hold this save" in lines[2]


def test_without_the_primary_the_runs_saves_are_found_from_a_replicas_manifests(
    two_copies: tuple[MemoryStore, MemoryStore, Manifest, Path],
) -> None:
    _, replica, _, _ = two_copies
    assert Catalog(replica, DR).current("r") == []  # a replica holds no catalog
    history = copies.history_from_replicas([Copy("primary", None, PREFIX, "down"), Copy("dr", replica, DR)], "r")
    [state] = history.states()
    assert (state.run, state.step, state.save, state.verified) == ("r", 100, 1, True)


class _Failing(MemoryStore):
    def get_bytes(self, key: str) -> bytes:
        raise TransientStoreError(f"{key}: connection reset")


def test_an_early_survey_is_handed_over_only_for_the_save_the_catalog_names(
    two_copies: tuple[MemoryStore, MemoryStore, Manifest, Path],
) -> None:
    primary, replica, _, _ = two_copies
    found = [Copy("primary", primary, PREFIX), Copy("dr", replica, DR)]
    early = copies.EarlySurvey(found, "r", "100", None)  # --step 100: its first save guessed
    assert early.key == (100, 1)
    got = early.statuses(100, 1)
    assert got is not None and got == copies.survey(found, "r", 100, 1) and got[0].manifest is not None
    assert copies.EarlySurvey(found, "r", "100", None).statuses(100, 2) is None  # the catalog named save 2
    assert copies.EarlySurvey(found, "r", "100", None).statuses(200, 1) is None
    assert copies.EarlySurvey(found, "r", "100", 2).key == (100, 2)  # --save 2
    latest = copies.EarlySurvey(found, "r", "latest", None)  # only the catalog names the step: nothing started
    assert latest.key is None and latest.statuses(100, 1) is None
    # a survey that raised is not handed over: the caller's own survey raises it where it always did
    failing = [Copy("primary", _Failing("ckpts"), PREFIX)]
    assert copies.EarlySurvey(failing, "r", "100", None).statuses(100, 1) is None
    with pytest.raises(TransientStoreError):
        copies.survey(failing, "r", 100, 1)
