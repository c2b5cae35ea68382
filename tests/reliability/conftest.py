"""Shared pieces of the reliability suite: credentials in the environment, CLI subprocesses, checks
that read the bucket directly (never through the code under test)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import MANIFEST_NAME
from tests.helpers import crc32c_b64, write_config
from tests.integration.test_compressed_objects import decode_from_bucket

MiB = 2**20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """s3_env(endpoint): put the endpoint's credentials into this process's environment."""

    def set_env(endpoint: Any) -> Any:
        for k, v in endpoint.env().items():
            monkeypatch.setenv(k, v)
        return endpoint

    yield set_env


def cli_cmd(cfg: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "ckptvault_cli.main", "--config", str(cfg), *args]


def cli_env(endpoint: Any, **extra: str) -> dict[str, str]:
    """Environment of a CLI subprocess: the endpoint's credentials and this session's Prefect API."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, **endpoint.env(), "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run_cli(cfg: Path, *args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_cmd(cfg, *args), env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def all_keys(client: Any, bucket: str, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
    return out


def manifest_keys(client: Any, bucket: str, prefix: str = "") -> list[str]:
    return sorted(k for k in all_keys(client, bucket, prefix) if k.endswith("/" + MANIFEST_NAME))


def incomplete_uploads(client: Any, bucket: str, prefix: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(page.get("Uploads", []))
    return out


def check_committed(
    client: Any, bucket: str, manifest_key: str, source: Path, *, read_bytes: bool = True
) -> dict[str, Any]:
    """A committed checkpoint is whole: every file of the source is in the manifest and in the bucket,
    sizes and an independent CRC32C of the source agree with the manifest, and (read_bytes) the stored
    bytes equal the source's. Returns the manifest as JSON."""
    m = json.loads(client.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    base = manifest_key[: -len(MANIFEST_NAME)]
    local = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file() and not p.is_symlink())
    assert sorted(f["path"] for f in m["files"]) == local, f"{manifest_key}: manifest files differ from {source}"
    for f in m["files"]:
        path = source / f["path"]
        assert f["size"] == path.stat().st_size, f"{base}{f['path']}: size"
        assert f["crc32c"] == crc32c_b64(path), f"{base}{f['path']}: manifest CRC32C != independent CRC32C"
        compressed = f.get("codec", "none") != "none"
        if read_bytes and compressed:
            # decoded by numcodecs alone, as docs/FORMAT.md says anyone can (no ckptvault code)
            decoded = path.with_name(path.name + ".decoded-check")
            try:
                decode_from_bucket(client, bucket, base + f["path"], f, decoded)
                assert decoded.read_bytes() == path.read_bytes(), f"{base}{f['path']}: decoded bytes differ"
            finally:
                decoded.unlink(missing_ok=True)
        elif read_bytes:
            body = client.get_object(Bucket=bucket, Key=base + f["path"])["Body"].read()
            assert body == path.read_bytes(), f"{base}{f['path']}: stored bytes differ from the source"
        else:
            head = client.head_object(Bucket=bucket, Key=base + f["path"])
            want = f["stored_size"] if compressed else f["size"]
            assert head["ContentLength"] == want, f"{base}{f['path']}: stored size"
    return dict(m)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# A CLI process with its imports done, waiting for "go" on stdin, then exactly `ckptvault ARGS`: kill
# offsets then fall in the command's own work, not in interpreter start-up (seconds on a loaded box).
# `preload`: the modules the command imports once it runs (the Prefect flows for ingest and tier).
_PREWARMED = (
    "import os, sys; import ckptvault_cli.main as cli; "
    "import {preload}; "
    "print('ready', flush=True); os.dup2(os.open(os.devnull, os.O_WRONLY), 1); "
    "sys.stdin.readline(); sys.exit(cli.main(sys.argv[1:]))"
)
FLOWS = "ckptvault_prefect.flows.ingest, ckptvault_prefect.flows.tier"


def prewarmed(cmd: list[str], env: dict[str, str], preload: str = FLOWS) -> subprocess.Popen[bytes]:
    args = cmd[cmd.index("ckptvault_cli.main") + 1 :]
    return subprocess.Popen(
        [sys.executable, "-c", _PREWARMED.format(preload=preload), *args],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def go_and_kill(proc: subprocess.Popen[bytes], offset: float | None) -> tuple[bool, float]:
    """Let the prewarmed process run; SIGKILL it after `offset` s (None: let it finish). Returns
    (killed while running, seconds it ran)."""
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n", "the prewarmed CLI did not start"
    t0 = time.monotonic()
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    try:
        try:
            rc = proc.wait(timeout=offset if offset is not None else 300)
            assert offset is not None or rc == 0, f"exit {rc}"
            return False, time.monotonic() - t0
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# The crash tests' seed: the same kill offsets on every run, so a failure reruns as it happened.
CRASH_SEED = 20261130


def stratified_offsets(rng: random.Random, start: float, end: float, n: int) -> list[float]:
    """n kill offsets in [start, end], one uniformly at random in each of n equal slices."""
    width = (end - start) / n
    return [round(start + width * (i + rng.random()), 2) for i in range(n)]


def crash_config(
    tmp_path: Path, endpoint: Any, bucket: str, prefix: str, root: Path, extra: str = "", compression: str = "off"
) -> Path:
    """A crash test's config: one DeepSpeed source, 5 MiB parts sent one at a time (the kills land
    between and inside parts), `extra` appended."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = write_config(tmp_path / f"{prefix}.toml", endpoint, bucket, [("r", root, "deepspeed")], prefix=prefix)
    store = f'part_size_mb = 5\nmax_concurrency = 1\ncompression = "{compression}"'
    text = cfg.read_text().replace("part_size_mb = 5", store)
    cfg.write_text(text + extra)
    return cfg


def abort_the_kills_uploads(client: Any, store: Any, bucket: str, prefix: str, sources: dict[int, Path]) -> int:
    """The multipart uploads a kill left open under `prefix`: ckptvault's own abort (what the bucket's
    lifecycle rule does a day later) removes every one, and every committed save of `sources` (step ->
    its local checkpoint) stays whole. Returns how many there were."""
    from ckptvault.checkpoint.manifest import checkpoint_prefix

    left = incomplete_uploads(client, bucket, prefix + "/")
    assert store.abort_multipart_uploads(prefix + "/") == len(left)
    assert incomplete_uploads(client, bucket, prefix + "/") == []
    for step, source in sources.items():
        check_committed(client, bucket, checkpoint_prefix(prefix, "r", step) + MANIFEST_NAME, source, read_bytes=False)
    return len(left)


def assert_abort_rules(client: Any, bucket: str, prefixes: list[str]) -> None:
    """Each prefix of the shared bucket keeps its own one-day abort-incomplete-upload rule (one ID for
    all would cover only the last): the backstop for the uploads of a kill nobody reruns."""
    from ckptvault.store import ABORT_MPU_RULE_NAME
    from ckptvault.store.lifecycle import rule_id, rule_prefix

    rules = client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    have = {r["ID"]: (rule_prefix(r), r["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
            for r in rules if "AbortIncompleteMultipartUpload" in r}  # fmt: skip
    want = {rule_id(ABORT_MPU_RULE_NAME, p): (f"{p}/", 1) for p in prefixes}
    assert want.items() <= have.items(), have
