"""Payload signing ([store] sign_payload): which bodies are SHA-256 hashed into their SigV4 signature,
seen on the signed requests sent to each of our servers, over plain HTTP and over a TLS front."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest

from ckptvault.config import StoreConfig
from ckptvault.store.s3 import S3Store
from ckptvault.store.s3_client import signs_payload
from tests.faultproxy import FaultProxy
from tests.helpers import self_signed_cert

MiB = 1 << 20
UNSIGNED = "UNSIGNED-PAYLOAD"


def _round_trip(cfg: StoreConfig, tmp_path: Path) -> list[str]:
    """Upload a two-part file and a small object, read both back; return the X-Amz-Content-SHA256
    header of every request that carried a body."""
    store = S3Store(cfg)
    seen: list[str] = []

    def record(request: Any, **_: Any) -> None:  # observes the signed request; sends it unchanged
        if request.body:
            value = request.headers.get("X-Amz-Content-SHA256", b"")
            seen.append(value.decode() if isinstance(value, bytes) else str(value))

    store.client.meta.events.register("before-send.s3", record)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(cfg.part_size_mb * MiB + 12345))
    up = store.upload_file(src, "sig/src.bin")
    assert up.parts == 2
    store.put_bytes("sig/small.json", b'{"ok": true}')
    dest = tmp_path / "back.bin"
    store.download_file("sig/src.bin", dest, size=up.size, crc32c=up.crc32c)
    assert dest.read_bytes() == src.read_bytes()
    assert store.get_bytes("sig/small.json") == b'{"ok": true}'
    return seen


@pytest.mark.parametrize(
    "tls,setting,signed",
    [(False, "auto", True), (False, "never", False), (True, "auto", False), (True, "always", True)],
    ids=["http-auto-signed", "http-never-unsigned", "tls-auto-unsigned", "tls-always-signed"],
)
def test_bodies_are_signed_as_configured(
    any_s3: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    tls: bool, setting: str, signed: bool,
) -> None:  # fmt: skip
    for k, v in any_s3.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(any_s3)
    with contextlib.ExitStack() as stack:
        endpoint, ca_bundle = any_s3.url, None
        if tls:  # a TLS front on loopback with a self-signed certificate, in front of the real server
            cert, key = self_signed_cert(tmp_path)
            endpoint, ca_bundle = stack.enter_context(FaultProxy(any_s3.url, tls=(cert, key))).url, cert
            assert endpoint.startswith("https://")
        cfg = StoreConfig(
            bucket=bucket,
            endpoint_url=endpoint,
            region=any_s3.region,
            ca_bundle=ca_bundle,
            part_size_mb=5,
            sign_payload=setting,
        )
        assert signs_payload(cfg) is signed
        seen = _round_trip(cfg, tmp_path)
    # the multipart upload's create, parts and complete, and the PUT: all by the same rule
    assert len(seen) >= 4
    if signed:
        assert all(len(v) == 64 and v != UNSIGNED for v in seen), seen
    else:
        assert set(seen) == {UNSIGNED}, seen


def test_aws_without_endpoint_is_https_and_unsigned() -> None:
    assert signs_payload(StoreConfig(bucket="ckpts")) is False
    assert signs_payload(StoreConfig(bucket="ckpts", sign_payload="always")) is True
