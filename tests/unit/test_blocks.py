"""Block checksums (docs/FORMAT.md, "Block checksums") on the in-memory store: the sidecar's encoding,
the block CRCs computed in the upload's read pass (single PUT, multipart, split ranges cut anywhere),
the verification rule (a list that does not combine to the manifest's CRC32C is ignored, never
trusted), the ingest writing `_BLOCKS.json` after the data and before the manifest, and a ranged read
that names the damaged block."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import replace
from pathlib import Path

import pytest

from ckptvault.checkpoint.blocks import (
    SCHEMA,
    BlockMismatchError,
    FileBlocks,
    decode_crcs,
    encode_crcs,
    fetch_verified_range,
    load_blocks,
    sidecar_json,
    verified,
)
from ckptvault.checkpoint.manifest import BLOCKS_NAME, MANIFEST_NAME, FileEntry, Manifest, checkpoint_prefix
from ckptvault.checksum import BLOCK_SIZE, BlockCrcs, StreamHasher, crc32c_update, join_pieces, to_b64
from ckptvault.store import TransferConfig
from ckptvault.store.memory import MemoryStore
from ckptvault_cli.synthetic import write_checkpoint
from tests.unit.submitters import Plain
from tests.unit.test_ingest_pass import PREFIX, _cfg, _pass

MiB = 2**20


def _direct(data: bytes) -> tuple[int, ...]:
    """Block CRCs computed here, one crc32c call per block, nothing shared with the code under test."""
    return tuple(crc32c_update(data[i : i + BLOCK_SIZE]) for i in range(0, len(data), BLOCK_SIZE))


def _data(size: int, seed: int = 3) -> bytes:
    return random.Random(seed).randbytes(size)


def test_the_encoding_is_base64_of_big_endian_crcs_and_refuses_what_is_not() -> None:
    crcs = (0, 1, 0xDEADBEEF, 0xFFFFFFFF)
    text = encode_crcs(crcs)
    assert text == "AAAAAAAAAAHerb7v/////w=="
    assert decode_crcs(text) == crcs
    assert len(text) == 24  # 16 bytes of CRCs: 100 GB would be 25,600 blocks, 100 KB before base64
    with pytest.raises(ValueError, match="whole number"):
        decode_crcs("AAAA")  # 3 bytes
    with pytest.raises(ValueError, match="base64"):
        decode_crcs("not base64!")


@pytest.mark.parametrize("chunks", [[7 * MiB + 5], [1, 3 * MiB, 4 * MiB, 1 * MiB + 4], [5 * MiB] * 3])
def test_the_hasher_cuts_blocks_wherever_the_pieces_fall_and_its_crc_is_unchanged(chunks: list[int]) -> None:
    data = _data(sum(chunks))
    with_blocks, plain = StreamHasher(blocks_at=0), StreamHasher()
    at = 0
    for n in chunks:
        piece = data[at : at + n]
        assert with_blocks.update(piece) == plain.update(piece) == crc32c_update(piece)  # the part's own CRC
        at += n
    assert with_blocks.crc == plain.crc == crc32c_update(data)
    assert with_blocks.blocks is not None and plain.blocks is None
    assert join_pieces(with_blocks.blocks.cut()) == _direct(data)


def test_ranges_starting_inside_a_block_join_into_the_files_blocks() -> None:
    # a split upload's ranges of 5 MiB parts: the second range starts 1 MiB into block 1
    data = _data(13 * MiB + 17)
    pieces = []
    for start, end in ((0, 5 * MiB), (5 * MiB, 10 * MiB), (10 * MiB, len(data))):
        acc = BlockCrcs(start)
        acc.update(data[start:end])
        pieces += acc.cut()
    assert join_pieces(pieces) == _direct(data)


def _entry(data: bytes, path: str = "model.bin") -> FileEntry:
    return FileEntry(path=path, size=len(data), mtime=0.0, crc32c=to_b64(crc32c_update(data)))


def test_a_list_is_trusted_only_when_it_has_every_block_and_combines_to_the_manifests_crc() -> None:
    data = _data(9 * MiB + 1)
    entry, crcs = _entry(data), _direct(data)
    good = verified(entry, crcs)
    assert good is not None and good.crcs == crcs and len(crcs) == 3
    assert verified(entry, crcs[:2]) is None  # a block missing
    assert verified(entry, (*crcs, 0)) is None  # one too many
    assert verified(entry, (crcs[0] ^ 1, *crcs[1:])) is None  # one wrong CRC
    assert verified(entry, (crcs[1], crcs[0], crcs[2])) is None  # the right CRCs out of order
    assert verified(replace(entry, codec="shuffle-zstd", typesize=2), crcs) is None  # frames are its blocks


def test_span_and_check_name_the_file_the_block_and_its_bytes() -> None:
    data = bytearray(_data(10 * MiB + 3))
    fb = FileBlocks("model.bin", len(data), BLOCK_SIZE, _direct(bytes(data)))
    assert fb.span(0, 1) == (0, BLOCK_SIZE)
    assert fb.span(BLOCK_SIZE - 1, 2) == (0, 2 * BLOCK_SIZE)  # straddles: both blocks
    assert fb.span(9 * MiB, MiB + 3) == (2 * BLOCK_SIZE, len(data))  # the short last block
    with pytest.raises(ValueError, match="outside"):
        fb.span(len(data) - 1, 2)
    fb.check(BLOCK_SIZE, bytes(data[BLOCK_SIZE:]))
    data[BLOCK_SIZE + 5] ^= 0x40
    with pytest.raises(BlockMismatchError) as err:
        fb.check(0, bytes(data))
    assert f"model.bin: block 1 (bytes {BLOCK_SIZE}-{2 * BLOCK_SIZE - 1})" in str(err.value)
    with pytest.raises(ValueError, match="block boundary"):
        fb.check(1, bytes(data[1:BLOCK_SIZE]))


def _store() -> MemoryStore:
    return MemoryStore("ckpts", transfer=TransferConfig(part_size=5 * MiB, multipart_threshold=5 * MiB))


@pytest.mark.parametrize("size", [6 * MiB, 8 * MiB, 8 * MiB + 1, 17 * MiB + 9])
def test_the_memory_store_records_blocks_of_files_over_8_mib_single_or_multipart(tmp_path: Path, size: int) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(_data(size))
    for store in (_store(), MemoryStore("b")):  # multipart above 5 MiB; one PUT up to 64 MiB
        res = store.upload_file(src, "k")
        assert res.blocks == (_direct(src.read_bytes()) if size > 8 * MiB else ())


def _ingested(tmp_path: Path, split_mb: int) -> tuple[MemoryStore, Plain, Manifest]:
    store, submit = _store(), Plain()
    # optimizer.pt ~22 MiB and model.safetensors ~11 MiB: both over 8 MiB, both multipart at 5 MiB parts
    write_checkpoint(tmp_path / "r", "hf", 100, 32 * MiB, shards=1, seed=1)
    _, [outcome] = _pass(_cfg({"r": tmp_path / "r"}, split_mb=split_mb), store, submit)
    assert outcome.result == "uploaded", outcome.message
    base = checkpoint_prefix(PREFIX, "r", 100)
    return store, submit, Manifest.from_json(store.get_bytes(base + MANIFEST_NAME))


@pytest.mark.parametrize("split_mb", [0, 5], ids=["whole", "split-ranges"])
def test_ingest_writes_the_sidecar_after_the_data_and_before_the_manifest(tmp_path: Path, split_mb: int) -> None:
    store, submit, manifest = _ingested(tmp_path, split_mb)
    names = submit.names()
    sends = [i for i, n in enumerate(names) if n in ("upload_one", "finish_split")]
    assert ("finish_split" in names) == bool(split_mb)  # ranges of 5 MiB parts, cut inside blocks
    assert max(sends) < names.index("write_blocks") < names.index("commit_manifest")
    base = checkpoint_prefix(PREFIX, "r", 100)
    doc = json.loads(store.get_bytes(base + BLOCKS_NAME))
    assert doc["schema"] == SCHEMA and doc["block_size"] == BLOCK_SIZE
    big = {f.path for f in manifest.files if f.size > 8 * MiB}
    assert big and set(doc["files"]) == big  # only the files over 8 MiB
    blocks = load_blocks(store, manifest, PREFIX)
    assert set(blocks) == big
    for path in big:
        local = (tmp_path / "r" / "checkpoint-100" / path).read_bytes()
        assert blocks[path].crcs == _direct(local)
    assert BLOCKS_NAME not in manifest.to_json().decode()  # the manifest does not name it


def test_a_ranged_read_returns_exactly_its_bytes_and_fails_naming_a_damaged_block(tmp_path: Path) -> None:
    store, _, manifest = _ingested(tmp_path, 0)
    base = checkpoint_prefix(PREFIX, "r", 100)
    fb = load_blocks(store, manifest, PREFIX)["optimizer.pt"]
    local = (tmp_path / "r" / "checkpoint-100" / "optimizer.pt").read_bytes()
    key = base + "optimizer.pt"
    assert fetch_verified_range(store, key, fb, 5 * MiB + 3, 7 * MiB) == local[5 * MiB + 3 : 12 * MiB + 3]
    damaged = bytearray(local)
    damaged[9 * MiB] ^= 1  # in block 2
    store.put_bytes(key, bytes(damaged))
    assert fetch_verified_range(store, key, fb, 0, MiB) == local[:MiB]  # block 0 is intact
    with pytest.raises(BlockMismatchError, match=r"optimizer.pt: block 2 \(bytes 8388608-12582911\)"):
        fetch_verified_range(store, key, fb, 7 * MiB, 2 * MiB)


def test_a_sidecar_that_does_not_verify_is_ignored_file_by_file_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _, manifest = _ingested(tmp_path, 0)
    key = checkpoint_prefix(PREFIX, "r", 100) + BLOCKS_NAME
    doc = json.loads(store.get_bytes(key))
    good = decode_crcs(doc["files"]["model.safetensors"])
    bad = decode_crcs(doc["files"]["optimizer.pt"])
    forged = {"model.safetensors": good, "optimizer.pt": (bad[0] ^ 1, *bad[1:]), "not-in-manifest.bin": bad}
    store.put_bytes(key, sidecar_json(forged))
    with caplog.at_level(logging.WARNING, logger="ckptvault.checkpoint.blocks"):
        blocks = load_blocks(store, manifest, PREFIX)
    assert set(blocks) == {"model.safetensors"}  # the forged list is not trusted
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and any("'optimizer.pt'" in w for w in warned)
    store.put_bytes(key, b'{"schema": "ckptvault.blocks/9"}')
    assert load_blocks(store, manifest, PREFIX) == {}
    store.delete(key)
    assert load_blocks(store, manifest, PREFIX) == {}  # a save from before blocks: none, no error


def test_backfill_writes_the_sidecar_a_save_lacks_never_over_one_that_verifies_nor_from_damaged_bytes(
    tmp_path: Path,
) -> None:
    from ckptvault.catalog import Catalog
    from ckptvault.replication.blocks_backfill import backfill

    store, _, manifest = _ingested(tmp_path, 0)
    key = checkpoint_prefix(PREFIX, "r", 100) + BLOCKS_NAME
    ingested = store.get_bytes(key)
    states = Catalog(store, PREFIX).current("r")

    [present] = backfill(store, PREFIX, states)
    assert (present.outcome, present.bytes_read) == ("present", 0)  # verified: not read, not rewritten

    store.delete(key)  # a save committed before blocks existed
    [done] = backfill(store, PREFIX, states, run="r", step=100)
    assert (done.outcome, done.files) == ("written", 2) and done.bytes_read > 32 * MiB * 0.9
    assert store.get_bytes(key) == ingested  # the same blocks the ingest computed in its read pass
    assert set(load_blocks(store, manifest, PREFIX)) == {"model.safetensors", "optimizer.pt"}

    store.delete(key)
    obj = checkpoint_prefix(PREFIX, "r", 100) + "optimizer.pt"
    damaged = bytearray(store.get_bytes(obj))
    damaged[5 * MiB] ^= 1
    store.put_bytes(obj, bytes(damaged))
    [failed] = backfill(store, PREFIX, states)
    assert failed.outcome == "failed" and "optimizer.pt: its stored bytes' CRC32C is" in failed.detail
    assert store.head(key) is None  # nothing written from a damaged object


def test_backfill_writes_the_sidecar_with_the_lock_and_hold_the_saves_manifest_has_now(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from ckptvault.catalog import Catalog
    from ckptvault.replication.blocks_backfill import backfill
    from ckptvault.store import Retention

    store = MemoryStore("ckpts", object_lock=True, transfer=_store().transfer)
    write_checkpoint(tmp_path / "r", "hf", 100, 32 * MiB, shards=1, seed=1)
    _, [outcome] = _pass(_cfg({"r": tmp_path / "r"}), store, Plain())
    assert outcome.result == "uploaded", outcome.message
    base = checkpoint_prefix(PREFIX, "r", 100)
    store.delete(base + BLOCKS_NAME)  # unlocked (no [lock]): a save from before blocks, say
    # since the commit: a milestone extension and a legal hold, on the manifest as on every object
    until = Retention("GOVERNANCE", datetime.now(UTC) + timedelta(days=30))
    store.extend_retention(base + MANIFEST_NAME, until)
    store.put_legal_hold(base + MANIFEST_NAME, True)
    [done] = backfill(store, PREFIX, Catalog(store, PREFIX).current("r"))
    assert done.outcome == "written"
    head = store.head(base + BLOCKS_NAME)
    assert head is not None and head.retention == until and head.legal_hold
