"""Fixtures of the infra tests: a real Dask cluster (infra/local/dask.sh, 2 worker processes on
loopback, with the test servers' credentials in their environment) for the session, a fresh one for a
test that kills a worker, and `store`, the S3 server a Dask test runs against.

One cluster serves every store: the test servers all take the same throwaway credentials
(tests/servers.py TEST_ACCESS_KEY), and the endpoint and region travel in the S3Store sent to the
workers, so a Ceph test needs no cluster of its own (that would cost a cluster start per store)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest

from tests import dask_cluster, servers
from tests.dask_cluster import DaskCluster
from tests.servers import S3Endpoint

_CLUSTER_ENV = {
    "AWS_ACCESS_KEY_ID": servers.TEST_ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": servers.TEST_SECRET_KEY,
    "AWS_EC2_METADATA_DISABLED": "true",  # else botocore may probe 169.254.169.254: slow, and off-machine
}


@pytest.fixture
def store(request: pytest.FixtureRequest) -> S3Endpoint:
    """SeaweedFS, or the server an indirect parametrization names: a test that runs on each store the
    pipeline targets has @pytest.mark.parametrize("store", PIPELINE_STORES, indirect=True)."""
    kind = getattr(request, "param", "seaweedfs")
    endpoint: S3Endpoint = request.getfixturevalue({"seaweedfs": "seaweedfs", "ceph": "ceph"}[kind])
    return endpoint


def _start(name: str) -> DaskCluster:
    try:
        return dask_cluster.start(dask_cluster.session_dir(name), workers=2, env=_CLUSTER_ENV)
    except dask_cluster.DaskStartError as e:
        pytest.fail(f"the Dask test cluster failed to start:\n{e}", pytrace=False)


def _stop(c: DaskCluster) -> None:
    dask_cluster.stop(c.state_dir)
    shutil.rmtree(c.state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def dask_cluster_2() -> Iterator[DaskCluster]:
    """A scheduler and 2 worker processes (node-0, node-1), shared by the tests that do not harm it."""
    dask_cluster.reap_stale()
    c = _start("")
    yield c
    _stop(c)


@pytest.fixture
def dask_cluster_factory() -> Iterator[Callable[[str], DaskCluster]]:
    """make(name) -> a cluster of this test's own (letters-only name), stopped and deleted after it."""
    made: list[DaskCluster] = []

    def make(name: str) -> DaskCluster:
        made.append(_start(name))
        return made[-1]

    yield make
    for c in made:
        _stop(c)
