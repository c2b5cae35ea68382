"""Session-wide test set-up: telemetry off, a private PREFECT_HOME, and real local S3 servers.

Fixtures (see infra/local/README.md for the servers themselves):
  seaweedfs, ceph, moto_server  session-scoped S3Endpoint; each server starts lazily, on first use, on
                                free ports with its own state dir, and stops at session end.
  any_s3                        parametrized over all three (ids seaweedfs, ceph, moto).
  any_store                     the same three, then None for the in-memory store (id memory).
  pipeline_s3                   parametrized over seaweedfs and ceph (the stores the pipeline targets).
  bucket_factory                bucket_factory(endpoint) -> a fresh bucket, emptied and deleted afterwards.
  prefect_api                   a throwaway Prefect API (prefect_test_harness), for flow tests.
  prometheus                    prometheus(targets, rule_files=()) -> a real Prometheus (tests/prometheus.py)
                                scraping those host:port targets every second; stopped after the test.

A server that fails to start fails the tests that need it (with the log tail), never skips them. The one
exception, outside CI (CI=true) only: Ceph is skipped when radosgw is not installed or we are not root.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# Before anything imports prefect: its settings are read from the environment at import time.
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# A private PREFECT_HOME (database, results, profiles) for the session: tests neither see nor touch the
# developer's ~/.prefect. And no PREFECT_API_URL from the developer's shell: tests must not write flow
# runs into their real server; flow tests use the prefect_api fixture.
_PREFECT_HOME = tempfile.mkdtemp(prefix="ckptvault-prefect-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ.pop("PREFECT_API_URL", None)
# Nor the developer's ~/.cache/ckptvault (the Object Lock probe's memory, ckptvault/objectlock/probe_cache.py):
# every CLI the tests start inherits this, so no test reads a pass a developer's run recorded, or writes one.
_CACHE_DIR = tempfile.mkdtemp(prefix="ckptvault-cache-")
os.environ["CKPTVAULT_CACHE_DIR"] = _CACHE_DIR

# Prefect sets up its logging the first time `prefect.flow` is imported, and its console handler keeps the
# sys.stderr of that moment. Imported first inside a test that uses capsys (tests/flows/test_cli.py run
# on its own), the handler keeps that test's capture stream, which is closed when the test ends, and
# every later test's flow logs fail on it. Here, sys.stderr is pytest's session-wide capture.
import prefect.main  # noqa: E402, F401

from tests import prometheus as prometheus_server  # noqa: E402
from tests import servers  # noqa: E402  (after the environment above is set)
from tests.helpers import in_ci  # noqa: E402
from tests.prometheus import Prometheus  # noqa: E402
from tests.servers import S3Endpoint  # noqa: E402
from tests.slack_recorder import SLACK_TOKEN, SlackRecorder  # noqa: E402

pytest_plugins = ["tests.durations"]


def ceph_unavailable_reason() -> str | None:
    if shutil.which("radosgw") is None:
        return "ceph: radosgw not installed; run infra/local/install-ceph.sh as root"
    if os.geteuid() != 0:
        return "ceph: the single-node cluster runs as root here; run the tests as root (CI does)"
    return None


class _TestServers:
    """This session's lazily started servers, one per kind."""

    def __init__(self) -> None:
        self.running: dict[str, servers.RunningServer] = {}
        # Under pytest-xdist: the run's shared instances (servers.shared_server), stopped by the controller.
        self.shared: dict[str, servers.RunningServer] = {}
        self.notes: list[str] = []
        self._reaped = False

    def require(self, kind: str) -> S3Endpoint:
        if kind in self.running:
            return self.running[kind].endpoint
        if kind in self.shared:
            return self.shared[kind].endpoint
        if kind == "ceph" and (reason := ceph_unavailable_reason()):
            if in_ci():
                self.notes.append(f"{reason} (CI=true: failing, not skipping)")
                pytest.fail(f"{reason}\n(CI=true: a missing server fails the tests that need it)", pytrace=False)
            self.notes.append(f"skipped: {reason}")
            pytest.skip(reason)
        if not self._reaped:
            self._reaped = True
            for d in servers.reap_stale_test_state():
                self.notes.append(f"stopped and removed the leftover of a dead test session: {d}")
        if _XDIST_WORKER:
            try:
                server, _ = servers.shared_server(kind)
            except servers.ServerStartError as e:
                pytest.fail(f"{kind} test server failed to start:\n{e}", pytrace=False)
            self.shared[kind] = server
            return server.endpoint
        state_dir = servers.session_state_dir(kind)
        try:
            server = servers.start(kind, state_dir)
        except servers.ServerStartError as e:
            self.notes.append(f"{kind}: FAILED to start, see the failing tests (state kept in {state_dir})")
            pytest.fail(f"{kind} test server failed to start:\n{e}", pytrace=False)
        self.running[kind] = server
        self.notes.append(
            f"{kind}: ready in {server.startup_seconds:.1f} s at {server.endpoint.url} (state {state_dir})"
        )
        return server.endpoint

    def stop_all(self) -> None:
        keep = os.environ.get("CKPTVAULT_KEEP_TEST_STATE") == "1"

        def stop_one(kind: str, server: servers.RunningServer) -> str:
            t0 = time.monotonic()
            out = servers.stop(kind, server.state_dir)
            note = f"{kind}: stopped in {time.monotonic() - t0:.1f} s"
            if out:
                note += f" ({out.splitlines()[-1]})"
            if not keep:
                shutil.rmtree(server.state_dir, ignore_errors=True)
            return note

        # In parallel: each clean stop takes seconds (SeaweedFS ~4 s, Ceph up to 3 daemons x STOP_TIMEOUT).
        with ThreadPoolExecutor(max_workers=len(self.running) or 1) as pool:
            self.notes.extend(pool.map(stop_one, self.running.keys(), self.running.values()))
        self.running.clear()


_SERVERS = _TestServers()
# pytest-xdist runs tests in worker processes, each its own session; they share one server of each kind.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


@pytest.fixture(scope="session")
def _test_servers() -> Iterator[_TestServers]:
    yield _SERVERS
    _SERVERS.stop_all()


@pytest.fixture(scope="session")
def seaweedfs(_test_servers: _TestServers) -> S3Endpoint:
    return _test_servers.require("seaweedfs")


@pytest.fixture(scope="session")
def ceph(_test_servers: _TestServers) -> S3Endpoint:
    return _test_servers.require("ceph")


@pytest.fixture(scope="session")
def moto_server(_test_servers: _TestServers) -> S3Endpoint:
    return _test_servers.require("moto")


_FIXTURE_FOR_KIND = {"seaweedfs": "seaweedfs", "ceph": "ceph", "moto": "moto_server"}


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("seaweedfs", id="seaweedfs"),
        pytest.param("ceph", id="ceph", marks=pytest.mark.ceph),
        pytest.param("moto", id="moto"),
    ],
)
def any_s3(request: pytest.FixtureRequest) -> S3Endpoint:
    """Each of our three S3 servers in turn (conformance tests: what holds everywhere)."""
    endpoint: S3Endpoint = request.getfixturevalue(_FIXTURE_FOR_KIND[request.param])
    return endpoint


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("seaweedfs", id="seaweedfs"),
        pytest.param("ceph", id="ceph", marks=pytest.mark.ceph),
        pytest.param("moto", id="moto"),
        pytest.param("memory", id="memory"),
    ],
)
def any_store(request: pytest.FixtureRequest) -> S3Endpoint | None:
    """any_s3's three servers, then None for the in-memory ObjectStore (ckptvault.store.memory): the
    backends the store conformance suite holds to the port's contracts."""
    if request.param == "memory":
        return None
    endpoint: S3Endpoint = request.getfixturevalue(_FIXTURE_FOR_KIND[request.param])
    return endpoint


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("seaweedfs", id="seaweedfs"),
        pytest.param("ceph", id="ceph", marks=pytest.mark.ceph),
    ],
)
def pipeline_s3(request: pytest.FixtureRequest) -> S3Endpoint:
    """The stores the pipeline runs against for real: SeaweedFS (embedded default) and Ceph (on-prem)."""
    endpoint: S3Endpoint = request.getfixturevalue(_FIXTURE_FOR_KIND[request.param])
    return endpoint


@pytest.fixture
def bucket_factory() -> Iterator[Callable[[S3Endpoint], str]]:
    """bucket_factory(endpoint) creates a fresh, uniquely named bucket on that endpoint. At teardown every
    bucket it made is emptied (all versions, delete markers, incomplete multipart uploads) and deleted,
    best effort: a failure there is a warning, not a test error."""
    created: list[tuple[S3Endpoint, str]] = []

    def make(endpoint: S3Endpoint) -> str:
        name = servers.unique_bucket_name()
        endpoint.client().create_bucket(Bucket=name)
        created.append((endpoint, name))
        return name

    yield make
    servers.cleanup_buckets(created)


@pytest.fixture
def slack() -> Iterator[SlackRecorder]:
    """A local Slack-speaking HTTP server that records what it was sent (tests/slack_recorder.py); the
    bot token it accepts is SLACK_TOKEN."""
    rec = SlackRecorder(token=SLACK_TOKEN)
    rec.start()
    try:
        yield rec
    finally:
        rec.down()


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary Prefect API server (SQLite in this session's PREFECT_HOME) for flow tests."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Prometheus]]:
    """A factory: prometheus(["127.0.0.1:PORT"], rule_files=[...]) starts a Prometheus on loopback that
    scrapes those targets every second (tests/prometheus.py); each one started is stopped after the test."""
    started: list[Prometheus] = []

    def start(targets: list[str], rule_files: tuple[Path, ...] = ()) -> Prometheus:
        prom = prometheus_server.start(tmp_path_factory.mktemp("prometheus"), targets, rule_files)
        started.append(prom)
        return prom

    yield start
    for prom in started:
        prometheus_server.stop(prom)


# Fixtures whose parameter names the server a test runs against (any_s3[moto], pipeline_s3[ceph], ...).
_SERVER_PARAMS = ("any_s3", "any_store", "pipeline_s3", "store")


def servers_of(item: pytest.Item) -> set[str]:
    """The S3 servers a collected test will start or use: asked for by name, or by a parametrized fixture."""
    names = set(getattr(item, "fixturenames", ()))
    kinds = {kind for kind, fixture in _FIXTURE_FOR_KIND.items() if fixture in names}
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        kinds.update(str(callspec.params[f]) for f in _SERVER_PARAMS if f in callspec.params)
    return kinds & set(_FIXTURE_FOR_KIND)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Markers for running one area: each server a test needs (`-m ceph`, `-m "not ceph"` runs everything
    # else without starting the cluster), `prefect` for a real Prefect API, `dask` for a real Dask cluster,
    # `frameworks` for the checkpoints the real frameworks write (pyproject.toml lists them all).
    for item in items:
        for kind in servers_of(item):
            item.add_marker(kind)
        names = set(getattr(item, "fixturenames", ()))
        if "prefect_api" in names:
            item.add_marker(pytest.mark.prefect)
        if names & {"dask_cluster_2", "dask_cluster_factory"}:
            item.add_marker(pytest.mark.dask)
        if item.nodeid.startswith("tests/frameworks/"):
            item.add_marker(pytest.mark.frameworks)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        # The controller (or a run without xdist): its pid names the servers every worker will share.
        os.environ[servers.SESSION_PID_VAR] = str(os.getpid())


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or not session.config.pluginmanager.hasplugin("dsession"):
        return
    # The xdist controller, once every worker is done: stop the servers they shared, and say how each
    # started (read from the record the worker that started it left).
    for kind in servers.SPECS:
        record = servers.state_dir_for(kind, os.getpid()) / "endpoint.json"
        if record.exists():
            d = json.loads(record.read_text())
            _SERVERS.notes.append(f"{kind}: shared by the workers, ready in {d['startup_seconds']:.1f} s at {d['url']}")
    _SERVERS.notes.extend(servers.stop_shared(os.getpid(), os.environ.get("CKPTVAULT_KEEP_TEST_STATE") == "1"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SERVERS.notes:
        terminalreporter.section("ckptvault test servers")
        for note in _SERVERS.notes:
            terminalreporter.write_line(note)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_PREFECT_HOME, ignore_errors=True)
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture
def locked_bucket() -> Iterator[Callable[[S3Endpoint], str]]:
    """A fresh bucket created with Object Lock. At teardown every open upload is aborted (a killed
    ingest leaves some) and every version deleted with the governance bypass; COMPLIANCE versions stay
    until their date (the test server's state goes with the run)."""
    import contextlib

    from botocore.exceptions import ClientError

    made: list[tuple[S3Endpoint, str]] = []

    def make(endpoint: S3Endpoint) -> str:
        name = servers.unique_bucket_name("ckv-lock")
        endpoint.client().create_bucket(Bucket=name, ObjectLockEnabledForBucket=True)
        made.append((endpoint, name))
        return name

    yield make
    for endpoint, name in made:
        s3 = endpoint.client()
        for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=name):
            for u in page.get("Uploads", []):
                with contextlib.suppress(ClientError):
                    s3.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=name):
            for v in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                with contextlib.suppress(ClientError):
                    s3.delete_object(
                        Bucket=name, Key=v["Key"], VersionId=v["VersionId"], BypassGovernanceRetention=True
                    )
        with contextlib.suppress(ClientError):
            s3.delete_bucket(Bucket=name)
