"""The re-check before a local eviction: a pure decision over what lstat and the store listing said."""

from __future__ import annotations

from pathlib import Path

from ckptvault.alerts import kinds as alerts
from ckptvault.checkpoint.manifest import FileEntry, Manifest, checkpoint_prefix
from ckptvault.store import ObjectInfo
from ckptvault.tiering.eviction import LocalFile, Mismatch, compare_local, compare_store, eviction_check, local_targets
from ckptvault.tiering.report import render_applied, skipped_record

ROOT = "/hot/r/checkpoint-10"
BASE = checkpoint_prefix("t", "r", 10, 2)


def manifest(single_file: bool = False) -> Manifest:
    files = (
        FileEntry("model.safetensors", 1000, 100.0, "AAAAAQ=="),
        FileEntry("sub/optimizer.pt", 500, 101.0, "AAAAAg=="),
    )
    return Manifest(
        run="r",
        step=10,
        format="hf",
        files=files[:1] if single_file else files,
        created_at=101.0,
        uploaded_at=200.0,
        source=ROOT + (".ckpt" if single_file else ""),
        single_file=single_file,
        save=2,
    )


def same_locally(m: Manifest) -> dict[Path, LocalFile | None]:
    return {p: LocalFile(f.size, f.mtime, True) for p, f in local_targets(m)}


def same_in_store(m: Manifest, *, crc: bool = True) -> dict[str, ObjectInfo]:
    out = {}
    for f in m.files:
        key = BASE + f.path
        meta = {"crc32c": f.crc32c} if crc else {}
        out[key] = ObjectInfo(key, f.size, '"e"', "STANDARD", 200.0, metadata=meta)
    return out


def test_a_copy_that_matches_everywhere_may_be_evicted() -> None:
    m = manifest()
    check = eviction_check(m, BASE, same_locally(m), same_in_store(m))
    assert check.ok and check.key == ("r", 10, 2) and check.root == ROOT
    assert (check.local, check.store) == ((), ())


def test_local_targets_follow_the_layout() -> None:
    assert [str(p) for p, _ in local_targets(manifest())] == [f"{ROOT}/model.safetensors", f"{ROOT}/sub/optimizer.pt"]
    assert [str(p) for p, _ in local_targets(manifest(single_file=True))] == [ROOT + ".ckpt"]


def test_a_rewritten_resized_or_replaced_local_file_stops_the_eviction() -> None:
    m = manifest()
    (p1, f1), _ = local_targets(m)
    for stat, what in (
        (LocalFile(f1.size, f1.mtime + 5, True), "modified after upload"),
        (LocalFile(f1.size + 1, f1.mtime, True), f"size {f1.size + 1} locally, {f1.size} in the manifest"),
        (LocalFile(f1.size, f1.mtime, False), "no longer a regular file"),
    ):
        stats = {**same_locally(m), p1: stat}
        check = eviction_check(m, BASE, stats, same_in_store(m))
        assert not check.ok and check.store == ()
        (mm,) = check.local
        assert mm.path == str(p1) and what in mm.what, mm
        assert "1 local files differ" in check.reason


def test_an_mtime_within_a_millisecond_is_the_same_file() -> None:
    m = manifest()
    (p1, f1), _ = local_targets(m)
    stats = {**same_locally(m), p1: LocalFile(f1.size, f1.mtime + 5e-4, True)}
    assert eviction_check(m, BASE, stats, same_in_store(m)).ok


def test_a_file_already_gone_locally_is_what_a_crashed_eviction_left_and_not_a_mismatch() -> None:
    m = manifest()
    (p1, _), _ = local_targets(m)
    assert compare_local(local_targets(m), {**same_locally(m), p1: None}) == []


def test_an_object_missing_resized_or_with_another_crc_in_the_store_stops_the_eviction() -> None:
    m = manifest()
    key = BASE + "sub/optimizer.pt"
    good = same_in_store(m)
    missing = {k: v for k, v in good.items() if k != key}
    resized = {**good, key: ObjectInfo(key, 499, '"e"', "STANDARD", 200.0)}
    other_crc = {**good, key: ObjectInfo(key, 500, '"e"', "STANDARD", 200.0, metadata={"crc32c": "AAAAAw=="})}
    for found, what in (
        (missing, "missing from the store"),
        (resized, "size 499 in the store, 500 in the manifest"),
        (other_crc, "CRC32C AAAAAw== in the store, AAAAAg== in the manifest"),
    ):
        check = eviction_check(m, BASE, same_locally(m), found)
        assert not check.ok and check.local == ()
        assert check.store == (Mismatch(key, what),)
        assert "missing or differ in the store" in check.reason


def test_without_a_crc_from_the_store_the_size_is_what_is_checked() -> None:
    """Multipart objects on Ceph carry no whole-object CRC32C: the size alone decides."""
    m = manifest()
    assert compare_store(m, BASE, same_in_store(m, crc=False)) == []
    # a full-object checksum the server computed counts like the metadata one
    key = BASE + "model.safetensors"
    served = {**same_in_store(m), key: ObjectInfo(key, 1000, '"e-3"', "STANDARD", 200.0, server_crc32c="AAAAAQ==")}
    assert compare_store(m, BASE, served) == []
    wrong = {**served, key: ObjectInfo(key, 1000, '"e-3"', "STANDARD", 200.0, server_crc32c="AAAAAA==")}
    assert [mm.path for mm in compare_store(m, BASE, wrong)] == [key]


def test_both_sides_are_reported_together() -> None:
    m = manifest()
    (p1, f1), _ = local_targets(m)
    stats = {**same_locally(m), p1: LocalFile(f1.size + 1, f1.mtime, True)}
    check = eviction_check(m, BASE, stats, {})
    assert len(check.local) == 1 and len(check.store) == 2
    assert "local files differ" in check.reason and "in the store" in check.reason


def test_the_skip_is_recorded_alerted_and_reported_with_run_step_save_and_files() -> None:
    m = manifest()
    (p1, f1), _ = local_targets(m)
    check = eviction_check(m, BASE, {**same_locally(m), p1: LocalFile(7, f1.mtime, True)}, same_in_store(m))
    ev = check.skipped_event("older than the newest 2 verified", "fr-1")
    assert (ev.event, ev.run, ev.step, ev.save, ev.flow_run) == ("evict_skipped", "r", 10, 2, "fr-1")
    assert str(p1) in ev.detail and "older than the newest 2" in ev.detail and "local files differ" in ev.detail

    local = alerts.build("evict_skipped", run="r", step=10, save=2, local=[str(x) for x in check.local], store=[])
    assert "r step 10 save 2" in local.summary and local.severity == "warning"
    assert str(p1) in local.text() and "ingest" in local.next_step
    store = alerts.build(
        "evict_skipped", run="r", step=10, save=2, local=[], store=[f"{BASE}model.safetensors: missing from the store"]
    )
    assert store.severity == "error" and "Keep the local copy" in store.next_step
    assert "--step 10 --save 2" in store.next_step
    assert local.dedup_key() != store.dedup_key()

    rec = skipped_record(check)
    assert (rec["run"], rec["step"], rec["save"], rec["path"]) == ("r", 10, 2, ROOT)
    assert rec["local"] == [str(check.local[0])] and rec["store"] == []
    md = render_applied([check])
    assert f"| r | 10 | 2 | {ROOT} |" in md and "NOT evicted" in md
    assert "No action of the plan was skipped" in render_applied([])


def test_a_compressed_object_is_checked_by_the_crc32c_of_its_stored_bytes() -> None:
    """A compressed entry's object is its frames: the store's CRC32C is compared with `stored_crc32c`
    (never with the original file's), and an entry written before that field by its size alone."""
    frames = ((0, 700, 1000, "AAAAAQ=="),)
    entry = FileEntry("w.bin", 1000, 100.0, "AAAAAQ==", codec="shuffle-zstd", typesize=2, stored_size=700,
                      frames=frames, stored_crc32c="AAAABw==")  # fmt: skip
    m = Manifest(run="r", step=10, format="hf", files=(entry,), created_at=101.0, uploaded_at=200.0,
                 source=ROOT, single_file=False, save=2)  # fmt: skip
    key = BASE + "w.bin"

    def stored(crc: str | None) -> dict[str, ObjectInfo]:
        return {key: ObjectInfo(key, 700, '"e-2"', "STANDARD", 200.0, server_crc32c=crc)}

    assert compare_store(m, BASE, stored("AAAABw==")) == []
    assert compare_store(m, BASE, stored(None)) == []  # Ceph multipart: the size is all there is
    # the right size, other bytes: refused, as a plain object with another CRC32C is
    assert compare_store(m, BASE, stored("AAAACA==")) == [
        Mismatch(key, "CRC32C AAAACA== in the store, AAAABw== in the manifest")
    ]
    # an entry from before stored_crc32c was recorded: checked by its size, as it was when written
    old = Manifest(**{**m.__dict__, "files": (FileEntry(**{**entry.__dict__, "stored_crc32c": None}),)})
    assert compare_store(old, BASE, stored("AAAACA==")) == []
    assert [mm.what for mm in compare_store(old, BASE, {key: ObjectInfo(key, 699, '"e"', "STANDARD", 1.0)})] == [
        "size 699 in the store, 700 in the manifest"
    ]
