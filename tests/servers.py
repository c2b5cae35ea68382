"""Start and stop the local S3 servers for tests, by calling infra/local/*.sh (the scripts humans use).

Each test session gets its own instances: its own ports (free ones, picked at start) and its own state
directory, `.state/test-<kind>-<pytest pid>`, deleted after a clean stop. A session that died without
stopping its servers is cleaned up by the next one (`reap_stale_test_state`), and by .ci/run's trap.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mypy_boto3_s3 import S3Client

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "infra" / "local"
STATE_ROOT = REPO_ROOT / ".state"
TMP_STATE_ROOT = Path(tempfile.gettempdir())

# Throwaway credentials for test instances (the scripts' defaults are for the demo store).
TEST_ACCESS_KEY = "ckptvault-test"
TEST_SECRET_KEY = "ckptvault-test-secret"

# Environment variables the scripts read. We pass our own values and drop any the caller's shell has,
# so a stray `export PORT=3000` cannot move a test server.
_SCRIPT_VARS = frozenset(
    {
        "STATE_DIR",
        "PORT",
        "ACCESS_KEY",
        "SECRET_KEY",
        "READY_TIMEOUT",
        "STOP_TIMEOUT",
        "MASTER_PORT",
        "VOLUME_PORT",
        "FILER_PORT",
        "ADMIN_PORT",
        "S3_GRPC_PORT",
        "MASTER_GRPC_PORT",
        "VOLUME_GRPC_PORT",
        "FILER_GRPC_PORT",
        "ADMIN_GRPC_PORT",
        "MON_V2_PORT",
        "MON_V1_PORT",
        "OSD_PORT_MIN",
        "OSD_PORT_MAX",
        "STORE_BYTES",
        "OBJECTSTORE",
        "LC_DEBUG_INTERVAL",
    }
)

_EXIT_PORT_BUSY = 3  # infra/local/common.sh: a port we need is taken


@dataclass(frozen=True)
class ServerSpec:
    kind: str
    script: str
    ready_timeout: int  # the script's own limit for `up`; we allow a margin on top
    region: str
    # Ports the instance opens, as offsets from its S3 port (see the scripts' headers).
    port_offsets: tuple[int, ...]
    # Extra environment for test instances.
    test_env: tuple[tuple[str, str], ...] = ()


SPECS: dict[str, ServerSpec] = {
    # Test data is thrown away after the session: no need to wait long for a clean stop (STOP_TIMEOUT).
    "seaweedfs": ServerSpec(
        "seaweedfs",
        "seaweedfs.sh",
        30,
        "us-east-1",
        (0, 1, 2, 3, 4, 10000, 10001, 10002, 10003, 10004),
        (("STOP_TIMEOUT", "3"),),
    ),
    "ceph": ServerSpec("ceph", "ceph.sh", 180, "default", (0, 1, 2), (("STOP_TIMEOUT", "2"),)),
    "moto": ServerSpec("moto", "moto.sh", 30, "us-east-1", (0,)),
}


@dataclass(frozen=True)
class S3Endpoint:
    """How to reach one running S3 server."""

    kind: str  # "seaweedfs" | "ceph" | "moto"
    url: str
    access_key: str
    secret_key: str
    region: str

    def client(self) -> S3Client:
        """A boto3 S3 client for this endpoint (path-style; checksums only where an API requires them)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                s3={"addressing_style": "path"},
            ),
        )

    def env(self) -> dict[str, str]:
        """Environment for a subprocess (our CLI, a flow) that should reach this endpoint's credentials."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            # Otherwise botocore may probe 169.254.169.254 for credentials/region: slow, and off-machine.
            "AWS_EC2_METADATA_DISABLED": "true",
        }


class ServerStartError(RuntimeError):
    """A server did not become ready; the message carries the script's output and the log tail."""


@dataclass(frozen=True)
class RunningServer:
    endpoint: S3Endpoint
    state_dir: Path
    startup_seconds: float


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_base(offsets: tuple[int, ...], lo: int = 10000, hi: int = 22000, attempts: int = 500) -> int:
    """A port P such that P+o is free for every offset o.

    The range keeps P+10000 (SeaweedFS's gRPC ports) below Linux's ephemeral range (32768+), where an
    outgoing connection could take the port between our check and the server's bind, and away from
    Ceph's OSD range (6800-7300) and the scripts' default ports (5000, 7480, 8333).
    """
    for _ in range(attempts):
        base = random.randrange(lo, hi)
        if all(_port_free(base + o) for o in offsets):
            return base
    raise ServerStartError(f"no free block of ports {offsets} found in {lo}-{hi}")


def _script_env(state_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRIPT_VARS}
    env["STATE_DIR"] = str(state_dir)
    env.update(extra)
    return env


def run_script(
    kind: str, action: str, state_dir: Path, extra: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`infra/local/<kind>.sh <action>` on `state_dir`, with the scripts' own variables cleared from the
    environment: how the suite and bench/servers.py start and stop every server."""
    script = SCRIPTS / SPECS[kind].script
    return subprocess.run(
        ["bash", str(script), action],
        env=_script_env(state_dir, extra),
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _tail(text: str, lines: int = 80) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# Set by the pytest-xdist controller before it starts its workers (tests/conftest.py): the workers of one
# run share one instance of each server, named by the controller's pid, which lives as long as the run.
SESSION_PID_VAR = "CKPTVAULT_TEST_SESSION_PID"


def session_pid() -> int:
    """The pid that names this test session's servers: the xdist controller's for its workers, else ours."""
    return int(os.environ.get(SESSION_PID_VAR) or os.getpid())


def state_dir_for(kind: str, pid: int) -> Path:
    """Ceph's admin sockets live under a state dir and a unix socket path is limited to 107 bytes, so a
    long checkout path falls back to the system temp dir."""
    path = STATE_ROOT / f"test-{kind}-{pid}"
    if len(str(path)) > 70:
        path = TMP_STATE_ROOT / f"ckptvault-test-{kind}-{pid}"
    return path


def session_state_dir(kind: str) -> Path:
    """Where this session's instance of `kind` keeps its state (fresh: any leftover is stopped and removed)."""
    path = state_dir_for(kind, os.getpid())
    if path.exists():
        stop(kind, path)
        shutil.rmtree(path, ignore_errors=True)
    return path


@contextlib.contextmanager
def private_server(kind: str) -> Iterator[RunningServer]:
    """An instance of `kind` of one test's own, not the session's, for a test that stops it (a store that
    goes down): started with the infra script, like the session's, in a state dir the reaper recognises
    (test-<kind>-<pid>-<hex>), stopped (if the test has not) and removed on exit."""
    base = state_dir_for(kind, os.getpid())
    state_dir = base.with_name(f"{base.name}-{uuid.uuid4().hex[:8]}")
    server = start(kind, state_dir)
    try:
        yield server
    finally:
        stop(kind, state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)


_SHARED_RECORD = "endpoint.json"
_SHARED_FAILURE = "start-failed.txt"


def shared_server(kind: str) -> tuple[RunningServer, bool]:
    """This run's one instance of `kind`, shared by every xdist worker: the first worker to ask starts it
    (under an exclusive lock, so the others wait for it instead of starting their own) and records its
    endpoint in its state dir; the others read the record. Returns (server, started by this call).

    A failed start is recorded too, so the other workers fail at once with the same message instead of
    each waiting out a start of their own. The controller stops it (stop_shared) when the run ends.
    """
    import fcntl
    import json

    state_dir = state_dir_for(kind, session_pid())
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(state_dir.parent / f".{state_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record, failure = state_dir / _SHARED_RECORD, state_dir / _SHARED_FAILURE
        if record.exists():
            d = json.loads(record.read_text())
            endpoint = S3Endpoint(kind, d["url"], TEST_ACCESS_KEY, TEST_SECRET_KEY, SPECS[kind].region)
            return RunningServer(endpoint, state_dir, float(d["startup_seconds"])), False
        if failure.exists():
            raise ServerStartError(failure.read_text())
        if state_dir.exists():  # a start that died half-way (its worker was killed): start afresh
            stop(kind, state_dir)
            shutil.rmtree(state_dir, ignore_errors=True)
        try:
            server = start(kind, state_dir)
        except ServerStartError as e:
            state_dir.mkdir(parents=True, exist_ok=True)
            failure.write_text(str(e))
            raise
        record.write_text(json.dumps({"url": server.endpoint.url, "startup_seconds": server.startup_seconds}))
        return server, True


def stop_shared(pid: int, keep_state: bool = False) -> list[str]:
    """Stop the shared instances a run (named by its controller's pid) started; one note per server."""
    notes = []
    for kind in SPECS:
        state_dir = state_dir_for(kind, pid)
        lock = state_dir.parent / f".{state_dir.name}.lock"
        if state_dir.exists():
            t0 = time.monotonic()
            out = stop(kind, state_dir)
            note = f"{kind}: stopped in {time.monotonic() - t0:.1f} s"
            notes.append(note + (f" ({out.splitlines()[-1]})" if out else ""))
            if not keep_state:
                shutil.rmtree(state_dir, ignore_errors=True)
        lock.unlink(missing_ok=True)
    return notes


def start(kind: str, state_dir: Path, *, attempts: int = 3) -> RunningServer:
    """Start a test instance of `kind` on free ports; raise ServerStartError if it does not get ready."""
    spec = SPECS[kind]
    output = ""
    for _ in range(attempts):
        port = free_port_base(spec.port_offsets)
        extra = {"PORT": str(port), "ACCESS_KEY": TEST_ACCESS_KEY, "SECRET_KEY": TEST_SECRET_KEY}
        extra.update(spec.test_env)
        t0 = time.monotonic()
        try:
            proc = run_script(kind, "up", state_dir, extra, timeout=spec.ready_timeout + 60)
        except subprocess.TimeoutExpired as e:
            stop(kind, state_dir)
            raise ServerStartError(
                f"{kind}: `{spec.script} up` did not return within {spec.ready_timeout + 60} s\n"
                f"{_tail(str(e.stderr or ''))}"
            ) from e
        elapsed = time.monotonic() - t0
        output = f"{proc.stdout}\n{proc.stderr}".strip()
        if proc.returncode == 0:
            url = f"http://127.0.0.1:{port}"
            endpoint = S3Endpoint(kind, url, TEST_ACCESS_KEY, TEST_SECRET_KEY, spec.region)
            return RunningServer(endpoint, state_dir, elapsed)
        if proc.returncode != _EXIT_PORT_BUSY:
            break
        # Someone took a port between our check and the script's: pick other ports, start afresh.
        shutil.rmtree(state_dir, ignore_errors=True)
    raise ServerStartError(f"{kind}: `{spec.script} up` failed (state {state_dir}):\n{_tail(output)}")


def stop(kind: str, state_dir: Path, sigterm_seconds: int | None = None) -> str:
    """Stop the instance recorded in state_dir (SIGTERM, then SIGKILL after the script's STOP_TIMEOUT, or
    `sigterm_seconds`); returns the script's output."""
    if not state_dir.exists():
        return ""
    env = dict(SPECS[kind].test_env) | ({} if sigterm_seconds is None else {"STOP_TIMEOUT": str(sigterm_seconds)})
    try:
        proc = run_script(kind, "down", state_dir, env, timeout=120)
    except subprocess.TimeoutExpired:
        return f"{kind}: `down` timed out"
    return f"{proc.stdout}{proc.stderr}".strip()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale_test_state() -> list[str]:
    """Stop and delete the instances of test sessions that are gone (killed before their teardown)."""
    reaped = []
    candidates = [*STATE_ROOT.glob("test-*-*"), *TMP_STATE_ROOT.glob("ckptvault-test-*-*")]
    for d in candidates:
        # a session's instance, or a test's own (private_server: "-<suffix>" after the pid)
        m = re.fullmatch(r"(?:test|ckptvault-test)-(seaweedfs|ceph|moto)-(\d+)(?:-[0-9a-f]+)?", d.name)
        if not m or not d.is_dir() or _pid_alive(int(m[2])):
            continue
        stop(m[1], d)
        shutil.rmtree(d, ignore_errors=True)
        reaped.append(str(d))
    return reaped


def unique_bucket_name(prefix: str = "ckv-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def delete_bucket_everything(endpoint: S3Endpoint, bucket: str) -> list[str]:
    """Best effort: delete every object version, delete marker and incomplete multipart upload, then the
    bucket. Returns the errors met (empty when all went well); never raises."""
    errors: list[str] = []
    s3 = endpoint.client()

    def attempt(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            errors.append(f"{what}: {e}")
            return None

    def delete_keys(keys: list[dict[str, str]]) -> None:
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            done = attempt("delete_objects", s3.delete_objects, Bucket=bucket, Delete={"Objects": batch})
            if done is None:
                for k in batch:  # some servers are picky about DeleteObjects; go one by one
                    attempt(f"delete_object {k['Key']}", s3.delete_object, Bucket=bucket, **k)
            else:
                errors.extend(f"delete {e.get('Key')}: {e.get('Code')}" for e in done.get("Errors", []))

    keys: list[dict[str, str]] = []
    try:
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
            for v in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                keys.append({"Key": v["Key"], "VersionId": v["VersionId"]})
    except Exception:
        # Not every server lists versions of an unversioned bucket; plain listing is enough there.
        keys = []
        with contextlib.suppress(Exception):
            for listing in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys.extend({"Key": o["Key"]} for o in listing.get("Contents", []))
    delete_keys(keys)
    try:
        for uploads in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
            for u in uploads.get("Uploads", []):
                what = f"abort_multipart_upload {u['Key']}"
                attempt(what, s3.abort_multipart_upload, Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
    except Exception as e:
        errors.append(f"list_multipart_uploads: {e}")
    attempt("delete_bucket", s3.delete_bucket, Bucket=bucket)
    return errors


def cleanup_buckets(created: list[tuple[S3Endpoint, str]]) -> None:
    for endpoint, bucket in reversed(created):
        errors = delete_bucket_everything(endpoint, bucket)
        if errors:
            warnings.warn(f"cleanup of {endpoint.kind} bucket {bucket}: {'; '.join(errors)}", stacklevel=2)
