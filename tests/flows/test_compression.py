"""`[store] compression` end to end on SeaweedFS (issue [M]): ingest with "auto" stores a BF16
safetensors checkpoint and a mixed one (BF16 weights + FP32 optimizer state) as frames under the
issue's targets, restore and drill decode them byte-identical, a corrupted frame fails both naming the
file and the frame, a source with compression "off" stores raw objects in exactly the old format."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckptvault import humanize
from ckptvault.checkpoint.manifest import MANIFEST_NAME, Manifest, checkpoint_prefix
from ckptvault.restore.drill import DrillFailed
from ckptvault_cli.synthetic import write_checkpoint, write_torch_zip
from tests.integration.test_compressed_objects import decode_from_bucket

MiB = 2**20


def _bf16_safetensors(path: Path, nbytes: int, seed: int) -> None:
    """A valid safetensors file of BF16 tensors (normal values, as trained weights are)."""
    f32 = np.random.default_rng(seed).standard_normal(nbytes // 2, dtype=np.float32) * 0.02
    data = (f32.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    half = len(data) // 4 * 2
    header = {
        "__metadata__": {"format": "pt"},
        "model.embed.weight": {"dtype": "BF16", "shape": [half // 2], "data_offsets": [0, half]},
        "model.head.weight": {"dtype": "BF16", "shape": [(len(data) - half) // 2], "data_offsets": [half, len(data)]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _checkpoint(root: Path, step: int, weights: int, optimizer: int) -> Path:
    d = write_checkpoint(root, "hf", step, 3 * MiB, shards=1, seed=step)
    _bf16_safetensors(d / "model.safetensors", weights, seed=step)
    write_torch_zip(d / "optimizer.pt", optimizer, seed=step)  # FP32 values, as Adam's moments
    (d / "trainer_state.json").touch()  # the Trainer's last write stays the newest
    return d


def _config(tmp_path: Path, endpoint: Any, bucket: str, sources: list[tuple[str, Path, str]]) -> Path:
    lines = [
        "[store]",
        f'bucket = "{bucket}"',
        'prefix = "t"',
        f'endpoint_url = "{endpoint.url}"',
        f'region = "{endpoint.region}"',
        "part_size_mb = 5",
        'compression = "auto"',
        "",
    ]
    for run, root, extra in sources:
        lines += ["[[sources]]", f'run = "{run}"', f'path = "{root}"', 'format = "hf"', "settle_seconds = 0", extra, ""]
    lines += ["[drill]", f'scratch = "{tmp_path / "scratch"}"', "sample = 5", ""]
    path = tmp_path / "c.toml"
    path.write_text("\n".join(lines))
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _manifest(client: Any, bucket: str, run: str, step: int) -> Manifest:
    key = checkpoint_prefix("t", run, step) + MANIFEST_NAME
    return Manifest.from_json(client.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_compression_auto_round_trip_targets_and_a_bad_frame(
    prefect_api: None, seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from ckptvault_prefect.flows.drill import drill
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.flows.restore import restore

    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    root, raw_root = tmp_path / "hot", tmp_path / "hot-raw"
    bf16 = _checkpoint(root, 10, weights=24 * MiB, optimizer=64 * 1024)  # a saved BF16 model
    mixed = _checkpoint(root, 20, weights=8 * MiB, optimizer=32 * MiB)  # BF16 weights, FP32 state
    plain = _checkpoint(raw_root, 10, weights=6 * MiB, optimizer=6 * MiB)
    cfg = _config(tmp_path, seaweedfs, bucket, [("z", root, ""), ("raw", raw_root, 'compression = "off"')])
    ingest(config_path=str(cfg))
    client = seaweedfs.client()

    m10, m20 = _manifest(client, bucket, "z", 10), _manifest(client, bucket, "z", 20)
    by_path = {f.path: f for f in m20.files}
    model, optim = by_path["model.safetensors"], by_path["optimizer.pt"]
    assert (model.codec, model.typesize) == ("shuffle-zstd", 2)  # from the safetensors header
    assert (optim.codec, optim.typesize) == ("shuffle-zstd", 4)  # from the sampled trial
    assert by_path["config.json"].codec == "none"  # under a MiB: stored as it is
    stored10 = sum(f.stored_bytes for f in m10.files)
    stored20 = sum(f.stored_bytes for f in m20.files)
    assert stored10 <= 0.75 * m10.total_bytes, (stored10, m10.total_bytes)
    assert stored20 <= 0.87 * m20.total_bytes, (stored20, m20.total_bytes)
    base = checkpoint_prefix("t", "z", 20)
    for f in m20.files:  # every object is exactly as big as its manifest says it is stored
        assert client.head_object(Bucket=bucket, Key=base + f.path)["ContentLength"] == f.stored_bytes

    # The catalog records the stored bytes; ls and the plan's cost rows show them against the original.
    from ckptvault_cli.main import main

    capsys.readouterr()
    assert main(["--config", str(cfg), "ls", "--json"]) == 0
    listed = {(r["run"], r["step"]): (r["bytes"], r["stored_bytes"]) for r in json.loads(capsys.readouterr().out)}
    assert listed[("z", 20)] == (m20.total_bytes, stored20) and listed[("z", 10)] == (m10.total_bytes, stored10)
    raw_bytes = listed[("raw", 10)][0]
    assert listed[("raw", 10)] == (raw_bytes, raw_bytes)
    assert main(["--config", str(cfg), "plan", "--json"]) == 0
    cost = {r["run"]: (r["bytes"], r["stored_bytes"]) for r in json.loads(capsys.readouterr().out)["cost"]}
    assert cost == {"z": (m10.total_bytes + m20.total_bytes, stored10 + stored20), "raw": (raw_bytes, raw_bytes)}
    assert main(["--config", str(cfg), "catalog", "stats"]) == 0  # the class's original and stored sizes
    stats_text = capsys.readouterr().out
    assert f"({humanize.size(stored10 + stored20 + raw_bytes)} stored)" in stats_text, stats_text

    # The bucket's object decodes with numcodecs alone, as docs/FORMAT.md shows.
    decoded = tmp_path / "decoded.safetensors"
    entry = {"frames": [list(fr) for fr in model.frames]}
    decode_from_bucket(client, bucket, base + "model.safetensors", entry, decoded)
    assert decoded.read_bytes() == (mixed / "model.safetensors").read_bytes()

    # compression = "off" on its source: raw objects, and a manifest as versions before codecs wrote it.
    raw_key = checkpoint_prefix("t", "raw", 10) + MANIFEST_NAME
    raw_doc = json.loads(client.get_object(Bucket=bucket, Key=raw_key)["Body"].read())
    assert all("codec" not in f and "frames" not in f for f in raw_doc["files"])
    raw_opt = checkpoint_prefix("t", "raw", 10) + "optimizer.pt"
    assert client.get_object(Bucket=bucket, Key=raw_opt)["Body"].read() == (plain / "optimizer.pt").read_bytes()

    for run, step, src in (("z", 10, bf16), ("z", 20, mixed), ("raw", 10, plain)):
        dest = tmp_path / f"out-{run}-{step}"
        report = restore(run=run, step=str(step), dest=str(dest), config_path=str(cfg))
        assert report.status == "restored"
        assert _tree(dest / src.name) == _tree(src)
    rows = drill(config_path=str(cfg)).drilled
    assert sorted((r.run, r.step, r.ok) for r in rows) == [("raw", 10, True), ("z", 10, True), ("z", 20, True)]

    # Tiering moves the stored objects as they are (a server-side copy) and checks their stored size.
    from ckptvault.config import parse_config
    from ckptvault.store import open_store
    from ckptvault.tiering.apply import transition

    store = open_store(parse_config(cfg.read_text()).store)
    moved = transition(store, "t", m20, "STANDARD_IA", "warm", milestone=False)
    assert (moved.objects, moved.bytes) == (len(m20.files), stored20)
    for f in m20.files:
        head = client.head_object(Bucket=bucket, Key=base + f.path)
        assert (head["ContentLength"], head.get("StorageClass")) == (f.stored_bytes, "STANDARD_IA")
    dest = tmp_path / "out-warm"
    restore(run="z", step="20", dest=str(dest), config_path=str(cfg))
    assert _tree(dest / mixed.name) == _tree(mixed)

    # One byte inside frame 1 of the stored optimizer.pt changed, the object's length unchanged.
    key = base + "optimizer.pt"
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    offset, length, _, _ = optim.frames[1]
    body[offset + length // 2] ^= 0x10
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    dest = tmp_path / "out-bad"
    state = restore(run="z", step="20", dest=str(dest), config_path=str(cfg), return_state=True)
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert "optimizer.pt: frame 1 (original bytes 4194304-8388607)" in message, message
    assert not dest.exists()
    state = drill(config_path=str(cfg), return_state=True)
    err = state.result(raise_on_failure=False)
    assert isinstance(err, DrillFailed)
    assert "optimizer.pt: frame 1" in str(err), str(err)


@pytest.mark.parametrize("kind", ["moto", pytest.param("ceph", marks=pytest.mark.ceph)])
def test_a_mixed_codec_checkpoint_round_trips_byte_identical(
    kind: str, prefect_api: None, request: pytest.FixtureRequest, bucket_factory: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Ingest with "auto" and restore on moto and Ceph: one checkpoint holding BF16 frames (typesize 2),
    FP32 frames (4), a file that does not compress and small files as they are; restored byte-identical,
    every compressed object decoded by numcodecs alone, and a rerun sends nothing."""
    from ckptvault_prefect.flows.ingest import ingest
    from ckptvault_prefect.flows.restore import restore

    endpoint = request.getfixturevalue({"moto": "moto_server", "ceph": "ceph"}[kind])
    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(endpoint)
    root = tmp_path / "hot"
    ck = _checkpoint(root, 30, weights=6 * MiB, optimizer=10 * MiB)
    (ck / "rng.bin").write_bytes(np.random.default_rng(1).bytes(2 * MiB))  # random: does not compress
    (ck / "trainer_state.json").touch()
    cfg = _config(tmp_path, endpoint, bucket, [("z", root, "")])
    assert [o.result for o in ingest(config_path=str(cfg))] == ["uploaded"]
    client = endpoint.client()
    m = _manifest(client, bucket, "z", 30)
    codecs = {f.path: (f.codec, f.typesize) for f in m.files}
    assert codecs["model.safetensors"] == ("shuffle-zstd", 2) and codecs["optimizer.pt"] == ("shuffle-zstd", 4)
    assert codecs["rng.bin"] == ("none", None) and codecs["config.json"] == ("none", None)
    base = checkpoint_prefix("t", "z", 30)
    for f in m.files:
        if f.codec != "none":
            out = tmp_path / f"decoded-{f.path}"
            decode_from_bucket(client, bucket, base + f.path, {"frames": [list(fr) for fr in f.frames]}, out)
            assert out.read_bytes() == (ck / f.path).read_bytes(), f.path
    dest = tmp_path / "out"
    assert restore(run="z", step="30", dest=str(dest), config_path=str(cfg)).status == "restored"
    assert _tree(dest / ck.name) == _tree(ck)
    assert [o.result for o in ingest(config_path=str(cfg))] == ["present"]
