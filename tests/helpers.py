"""Shared test helpers: write a config for a real endpoint, compute CRC32C independently, what a
test does when a tool it needs is missing (skip it, or with CI=true fail it), and the references and
writers only tests use (the fold one event at a time, `ls --json` of a table as text, a run of
synthetic checkpoints)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import crc32c
import pytest

if TYPE_CHECKING:
    import pyarrow as pa

    from ckptvault.catalog import CheckpointState, Event

# The stores the pipeline targets, for an indirect parametrization of a fixture that takes the kind as
# its param (tests/infra/conftest.py `store`); a Ceph case carries the `ceph` marker like pipeline_s3's.
PIPELINE_STORES = [
    pytest.param("seaweedfs", id="seaweedfs"),
    pytest.param("ceph", id="ceph", marks=pytest.mark.ceph),
]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing_tool(reason: str) -> NoReturn:
    """A tool (or what it needs) is missing; `reason` names it and how to install it. Outside CI the
    test is skipped with that reason, so a laptop without it can still run the rest. With CI=true it
    fails: a CI run that skipped would be green without having tested anything (.ci/run installs, or
    checks for, every tool the suite needs)."""
    if in_ci():
        pytest.fail(f"{reason}\n(CI=true: a missing tool fails its test, never skips)", pytrace=False)
    pytest.skip(reason)


def require_tool(name: str, install: str) -> str:
    """The path of executable `name` on PATH, or missing_tool naming it and `install` (how to get it)."""
    exe = shutil.which(name)
    if exe is None:
        missing_tool(f"{name} is not installed (not on PATH): {install}")
    return exe


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


def self_signed_cert(tmp_path: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (for a TLS front on loopback), as file paths."""
    cert, key = tmp_path / "ca.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def stored_checkpoints(
    client: Any, bucket: str, prefix: str, ignore: tuple[str, ...] = ("uploaded_at",)
) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    """Every object's bytes under `prefix`, and every manifest minus the fields in `ignore` (those that
    differ between two ingests of the same files), by key: what two ingests are compared on."""
    objects: dict[str, bytes] = {}
    manifests: dict[str, dict[str, Any]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            if o["Key"].endswith("/_MANIFEST.json"):
                manifests[o["Key"]] = {k: v for k, v in json.loads(body).items() if k not in ignore}
            else:
                objects[o["Key"]] = body
    return objects, manifests


def dcp_save(path: Path, state: dict[str, Any], threads: int = 1) -> list[Path]:
    """`torch.distributed.checkpoint.save` in one process (the framework fixtures' writer does the same
    in a child): the save's `.distcp` data files, sorted."""
    import warnings

    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is ... uninitialized": one process
        save(state, storage_writer=FileSystemWriter(str(path), thread_count=threads))
    return sorted(path.glob("*.distcp"))


def torch_weights(dtype: Any, seed: int = 0, layers: int = 4) -> dict[str, Any]:
    """`layers` 512x512 weights of a model's scale (normal, std 0.02) in `dtype`: 0.5 MiB each in BF16."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": (torch.randn(512, 512, generator=g) * 0.02).to(dtype) for i in range(layers)}


def fold_python(events: Iterable[Event]) -> list[CheckpointState]:
    """`fold` one event at a time (`_fold_one`): the reference the vectorised fold is tested against."""
    from ckptvault.catalog.fold import _fold_one

    groups: dict[tuple[str, int, int], list[Event]] = {}
    for e in sorted(events, key=lambda e: e.at):
        groups.setdefault((e.run, e.step, e.save), []).append(e)
    return [_fold_one(groups[k]) for k in sorted(groups)]


def render_json_table(t: pa.Table) -> str:
    """What `ckptvault.catalog.table_view.write_json_table` writes (`ls --json`), as text."""
    import io

    from ckptvault.catalog.table_view import write_json_table

    buf = io.BytesIO()
    write_json_table(t, buf)
    return buf.getvalue().decode()


def simulate_run(run_root: Path, fmt: str, steps: Sequence[int], size_bytes: int, **kw: Any) -> list[Path]:
    """A run that saved at each of `steps` (in order); keyword arguments go to `write_checkpoint`."""
    from ckptvault_cli.synthetic import write_checkpoint

    return [write_checkpoint(run_root, fmt, step, size_bytes, **kw) for step in steps]


def deny_deletes(store: Any) -> list[str]:
    """Make a MemoryStore answer every delete as an IAM deny would (credentials without s3:DeleteObject:
    the ingest role of infra/terraform): nothing removed, AccessDenied raised for DELETE and reported per
    key for DeleteObjects. Returns the list every attempted key is appended to. `store.under(prefix)`
    made before this call is a plain store of the same bucket: the tier role, which may delete."""
    from ckptvault.store import StoreError

    attempted: list[str] = []

    def delete(key: str) -> None:
        attempted.append(key)
        raise StoreError(f"deleting {store.where(key)}: AccessDenied (no s3:DeleteObject)")

    def delete_many(keys: Sequence[str]) -> dict[str, str]:
        attempted.extend(keys)
        return dict.fromkeys(keys, "AccessDenied (no s3:DeleteObject)")

    store.delete, store.delete_many = delete, delete_many
    return attempted


def open_test_store(tmp_path: Path, endpoint: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The store of `bucket` on `endpoint` as a command opens it (open_store: the adapter under the retry
    policy), its credentials in this process's environment for the test's length."""
    from ckptvault.config import load_config
    from ckptvault.store import open_store

    for k, v in endpoint.env().items():
        monkeypatch.setenv(k, v)
    cfg = write_config(tmp_path / f"{bucket}.toml", endpoint, bucket, [])
    return open_store(load_config(str(cfg)).store)


def primary_env_and_dr_profile(mp: pytest.MonkeyPatch, primary: Any, replica: Any, tmp: Path) -> None:
    """Two stores with two sets of keys, as in production: the primary's credentials in the environment,
    the replica's under the shared-credentials profile `dr` (what `[[replicas]] profile = "dr"` names)."""
    for k, v in primary.env().items():
        mp.setenv(k, v)
    creds = tmp / "credentials"
    creds.write_text(f"[dr]\naws_access_key_id = {replica.access_key}\naws_secret_access_key = {replica.secret_key}\n")
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    mp.setenv("AWS_CONFIG_FILE", str(tmp / "no-config"))
