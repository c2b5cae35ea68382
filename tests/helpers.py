"""Shared test helpers: write a config for a real endpoint, compute CRC32C independently."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import crc32c


def write_config(
    path: Path,
    endpoint: Any,
    bucket: str,
    sources: Sequence[tuple[str, Path, str]],
    *,
    prefix: str = "t",
    settle: float = 0,
    extra: str = "",
) -> Path:
    lines = [
        "[store]",
        f'bucket = "{bucket}"',
        f'prefix = "{prefix}"',
        f'endpoint_url = "{endpoint.url}"',
        f'region = "{endpoint.region}"',
        "part_size_mb = 5",
        "",
    ]
    for run, root, fmt in sources:
        lines += [
            "[[sources]]",
            f'run = "{run}"',
            f'path = "{root}"',
            f'format = "{fmt}"',
            f"settle_seconds = {settle}",
            "",
        ]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def crc32c_b64(path: Path) -> str:
    """An independent CRC32C: the plain crc32c package over the whole file, chunk by chunk."""
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            value = crc32c.crc32c(chunk, value)
    return base64.b64encode(value.to_bytes(4, "big")).decode()
