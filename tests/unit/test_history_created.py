"""The verdict `recover --since` gives each key written after TIME (ckptvault/history/created.py): a new
save verifies when every object its manifest lists is there with the manifest's size and kept CRC32C."""

from __future__ import annotations

from ckptvault.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.checksum import crc32c_update, to_b64
from ckptvault.history.created import check_created
from ckptvault.history.recovery import KeyRole
from ckptvault.history.versions import Change, ChangeKind
from ckptvault.store.memory import MemoryStore
from ckptvault.store.port import ObjectVersion


def _save(store: MemoryStore, step: int, files: dict[str, bytes]) -> str:
    base = checkpoint_prefix("p", "r", step)
    entries = tuple(FileEntry(name, len(data), 1.0, to_b64(crc32c_update(data))) for name, data in files.items())
    for name, data in files.items():
        store.put_bytes(base + name, data)
    store.put_bytes(base + MANIFEST_NAME, Manifest("r", step, "hf", entries, 1.0, 2.0, "/hot").to_json())
    return base


def _created(*keys: str) -> list[Change]:
    return [Change(k, ChangeKind.CREATED, None, ObjectVersion(k, "v", 9.0), (), ()) for k in keys]


def test_a_new_save_verifies_a_damaged_one_is_named_and_the_catalog_has_nothing_to_check() -> None:
    store = MemoryStore("b")
    good = _save(store, 100, {"model.bin": b"m" * 100, "config.json": b"{}"})
    bad = _save(store, 200, {"model.bin": b"m" * 100})
    store.put_bytes(bad + "model.bin", b"m" * 99)  # not the manifest's size
    gone = _save(store, 300, {"model.bin": b"x" * 10})
    store.delete(gone + "model.bin")
    stray = checkpoint_prefix("p", "r", 400) + "model.bin"
    store.put_bytes(stray, b"no manifest")
    event = "p/_catalog/run=r/events/1-a.parquet"
    found = check_created(
        store,
        _created(good + MANIFEST_NAME, good + "model.bin", bad + MANIFEST_NAME, gone + MANIFEST_NAME, stray, event),
        "p",
    )
    verdicts = [(n.key, n.role, n.verifies) for n in found]
    assert verdicts == [
        (good + MANIFEST_NAME, KeyRole.MANIFEST, True),
        (good + "model.bin", KeyRole.SAVE_OBJECT, True),
        (bad + MANIFEST_NAME, KeyRole.MANIFEST, False),
        (gone + MANIFEST_NAME, KeyRole.MANIFEST, False),
        (stray, KeyRole.SAVE_OBJECT, False),
        (event, KeyRole.CATALOG, None),
    ]
    assert "model.bin is 99 bytes, its manifest says 100" in found[2].why
    assert "model.bin is missing" in found[3].why and "no manifest lists it" in found[4].why
    assert found[1].why.startswith("its save's manifest: its 2 objects")
