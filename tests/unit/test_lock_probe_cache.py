"""The Object Lock probe's memory across processes (ckptvault/objectlock/probe_cache.py): a pass is kept a
day per endpoint and bucket, a failure never, the bucket's configuration is read every time, and a
cache file that cannot be read or written only means the probe runs. Every test points the cache at
its own tmp_path (never the real ~/.cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptvault.config import LockConfig, StoreConfig
from ckptvault.objectlock.probe_cache import MAX_AGE, ProbeCache, cache_dir, endpoint_key
from ckptvault.objectlock.save_lock import lock_problem
from ckptvault.store import LockStatus
from ckptvault.store.memory import MemoryStore

LOCK = LockConfig(mode="governance", days=1)
T0 = 1.8e9


class Server(MemoryStore):
    """A bucket with Object Lock whose server enforces it or not; counts what the preflight asks it."""

    def __init__(self, bucket: str = "ckpts", enforces: bool = True) -> None:
        super().__init__(bucket, object_lock=True)
        self.enforces, self.probes, self.status_reads = enforces, 0, 0

    def lock_status(self) -> LockStatus:
        self.status_reads += 1
        return super().lock_status()

    def probe_lock_enforced(self) -> str | None:
        self.probes += 1
        return None if self.enforces else "the server deleted a version locked in GOVERNANCE mode"


def _cache(tmp_path: Path, endpoint: str = "http://127.0.0.1:8333", bucket: str = "ckpts") -> ProbeCache:
    # a new ProbeCache per call, as each `ckptvault ingest` process makes its own
    return ProbeCache.of(StoreConfig(bucket=bucket, endpoint_url=endpoint), {"CKPTVAULT_CACHE_DIR": str(tmp_path)})


def test_a_passed_probe_is_not_run_again_for_a_day_but_the_bucket_check_is(tmp_path: Path) -> None:
    server = Server()
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0) is None
    assert (server.probes, server.status_reads) == (1, 1)
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0 + MAX_AGE - 1) is None
    assert (server.probes, server.status_reads) == (1, 2)  # the probe remembered, the configuration read
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0 + MAX_AGE) is None
    assert server.probes == 2  # a day old: probed again, and remembered from then
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0 + MAX_AGE + 1) is None
    assert server.probes == 2
    doc = json.loads((tmp_path / "lock-probe.json").read_text())
    assert doc == {"schema": "ckptvault.lock-probe/1", "passed": {"http://127.0.0.1:8333 ckpts": T0 + MAX_AGE}}


def test_a_failed_probe_is_never_remembered_so_a_fixed_server_is_seen_at_the_next_run(tmp_path: Path) -> None:
    server = Server(enforces=False)
    problem = lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0)
    assert problem is not None and "does not enforce it" in problem
    assert not (tmp_path / "lock-probe.json").exists()
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0 + 1) is not None
    server.enforces = True  # the server fixed
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0 + 2) is None
    assert server.probes == 3


def test_a_pass_counts_only_for_its_endpoint_and_bucket_and_never_hides_a_bucket_without_lock(
    tmp_path: Path,
) -> None:
    server = Server()
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0) is None
    assert lock_problem(LOCK, server, _cache(tmp_path, bucket="other"), now=lambda: T0) is None
    assert lock_problem(LOCK, server, _cache(tmp_path, endpoint="http://10.0.0.1:8333/"), now=lambda: T0) is None
    assert server.probes == 3
    assert len(json.loads((tmp_path / "lock-probe.json").read_text())["passed"]) == 3  # each kept beside the others
    swapped = MemoryStore("ckpts")  # the same name, created again without Object Lock
    problem = lock_problem(LOCK, swapped, _cache(tmp_path), now=lambda: T0 + 1)
    assert problem is not None and "has no Object Lock" in problem


@pytest.mark.parametrize(
    "content",
    [
        b"\x00garbage",
        b"[]",
        b'{"schema": "ckptvault.lock-probe/1", "passed": []}',
        b'{"schema": "something-else/9", "passed": {"http://127.0.0.1:8333 ckpts": 1.8e9}}',
        b'{"schema": "ckptvault.lock-probe/1", "passed": {"http://127.0.0.1:8333 ckpts": "yesterday"}}',
        b'{"schema": "ckptvault.lock-probe/1", "passed": {"http://127.0.0.1:8333 ckpts": 1.9e9}}',  # the future
    ],
)
def test_a_cache_file_that_cannot_be_trusted_means_probe_and_is_written_again(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "lock-probe.json").write_bytes(content)
    server = Server()
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0) is None
    assert server.probes == 1
    assert lock_problem(LOCK, server, _cache(tmp_path), now=lambda: T0 + 1) is None
    assert server.probes == 1  # the pass was written over the bad file


def test_a_cache_that_cannot_be_written_means_probe_every_time_and_no_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    unwritable = tmp_path / "a-file" / "ckptvault"
    server = Server()
    for t in (T0, T0 + 1):
        assert lock_problem(LOCK, server, _cache(unwritable), now=lambda t=t: t) is None
    assert server.probes == 2
    assert not list(tmp_path.glob("**/.lock-probe.json.*"))  # no temporary file left behind


def test_the_directory_is_the_env_var_then_xdg_cache_home_then_home(tmp_path: Path) -> None:
    assert cache_dir({"CKPTVAULT_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/ckptvault")
    assert cache_dir({"XDG_CACHE_HOME": "relative"}) == Path.home() / ".cache" / "ckptvault"
    assert cache_dir({}) == Path.home() / ".cache" / "ckptvault"
    assert endpoint_key(StoreConfig(bucket="ckpts", region="eu-west-1")) == "https://s3.eu-west-1.amazonaws.com ckpts"
