"""Block checksums on SeaweedFS through the CLI (docs/FORMAT.md, "Block checksums"): `ckptvault ingest`
writes `_BLOCKS.json` beside the manifest with a CRC32C per 4 MiB block of each file over 8 MiB, the
same a plain crc32c computes here from the local file; `blocks backfill` gives a save whose sidecar was
deleted the same one back, and refuses (exit 1, naming the file) to write one from a damaged object;
`fetch_verified_range` over HTTP returns exactly the bytes asked for and fails naming the block one
flipped byte of the stored object lies in. One ingest for all of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import crc32c
import pytest

from ckptvault.checkpoint.blocks import BlockMismatchError, fetch_verified_range, load_blocks
from ckptvault.checkpoint.manifest import BLOCKS_NAME, MANIFEST_NAME, Manifest, checkpoint_prefix
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import open_test_store, write_config

MiB = 2**20
BLOCK = 4 * MiB


def test_ingest_writes_block_crcs_backfill_restores_them_and_a_flipped_byte_is_named_by_its_block(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    bucket = bucket_factory(seaweedfs)
    root = tmp_path / "hot"
    ckpt = write_checkpoint(root, "hf", 100, 20 * MiB, shards=1, seed=5)  # optimizer.pt ~13 MiB: 4 blocks
    store = open_test_store(tmp_path, seaweedfs, bucket, monkeypatch)
    cfg = str(write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "hf")]))
    assert main(["--config", cfg, "ingest"]) == 0
    capsys.readouterr()

    base = checkpoint_prefix("t", "r", 100)
    client = seaweedfs.client()
    manifest = Manifest.from_json(client.get_object(Bucket=bucket, Key=base + MANIFEST_NAME)["Body"].read())
    sidecar = client.get_object(Bucket=bucket, Key=base + BLOCKS_NAME)["Body"].read()
    big = {f.path for f in manifest.files if f.size > 8 * MiB}
    assert "optimizer.pt" in big and set(json.loads(sidecar)["files"]) == big
    blocks = load_blocks(store, manifest, "t")
    for path in big:
        local = (ckpt / path).read_bytes()
        assert blocks[path].crcs == tuple(crc32c.crc32c(local[i : i + BLOCK]) for i in range(0, len(local), BLOCK))

    # a save without its sidecar (committed before them): the backfill reads it and writes the same one
    client.delete_object(Bucket=bucket, Key=base + BLOCKS_NAME)
    assert main(["--config", cfg, "blocks", "backfill", "--run", "r", "--json"]) == 0
    [done] = json.loads(capsys.readouterr().out)["saves"]
    assert (done["outcome"], done["files"]) == ("written", len(big))
    assert client.get_object(Bucket=bucket, Key=base + BLOCKS_NAME)["Body"].read() == sidecar
    assert main(["--config", cfg, "blocks", "backfill"]) == 0
    assert "r step 100 save 1: present" in capsys.readouterr().out  # verified: neither read nor rewritten

    # one byte flipped in block 3 (the last) of the stored object, behind ckptvault's back
    key = base + "optimizer.pt"
    local = (ckpt / "optimizer.pt").read_bytes()
    damaged = bytearray(local)
    damaged[3 * BLOCK + 77] ^= 0x10
    client.put_object(Bucket=bucket, Key=key, Body=bytes(damaged))
    fb = blocks["optimizer.pt"]
    assert fetch_verified_range(store, key, fb, BLOCK + 5, 2 * BLOCK - 10) == local[BLOCK + 5 : 3 * BLOCK - 5]
    with pytest.raises(BlockMismatchError) as err:
        fetch_verified_range(store, key, fb, 3 * BLOCK + 100, 10)
    last = min(4 * BLOCK, len(local)) - 1  # the file's short last block
    assert f"optimizer.pt: block 3 (bytes {3 * BLOCK}-{last})" in str(err.value)

    client.delete_object(Bucket=bucket, Key=base + BLOCKS_NAME)
    assert main(["--config", cfg, "blocks", "backfill"]) == 1
    out = capsys.readouterr()
    assert "r step 100 save 1: failed: optimizer.pt: its stored bytes' CRC32C is" in out.err
    assert "Traceback" not in out.err
    assert "Contents" not in client.list_objects_v2(Bucket=bucket, Prefix=base + BLOCKS_NAME)  # nothing written
    assert main(["--config", cfg, "blocks", "backfill", "--run", "nope"]) == 2
    assert "nope is not in the catalog" in capsys.readouterr().err
