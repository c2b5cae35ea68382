"""Fixtures of the infra tests: a real Dask cluster (infra/local/dask.sh, 2 worker processes on
loopback, with the SeaweedFS test server's credentials in their environment) for the session, and a
fresh one for a test that kills a worker."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests import dask_cluster
from tests.dask_cluster import DaskCluster


def _start(name: str, seaweedfs: Any) -> DaskCluster:
    try:
        return dask_cluster.start(dask_cluster.session_dir(name), workers=2, env=seaweedfs.env())
    except dask_cluster.DaskStartError as e:
        pytest.fail(f"the Dask test cluster failed to start:\n{e}", pytrace=False)


def _stop(c: DaskCluster) -> None:
    dask_cluster.stop(c.state_dir)
    shutil.rmtree(c.state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def dask_cluster_2(seaweedfs: Any) -> Iterator[DaskCluster]:
    """A scheduler and 2 worker processes (node-0, node-1), shared by the tests that do not harm it."""
    dask_cluster.reap_stale()
    c = _start("", seaweedfs)
    yield c
    _stop(c)


@pytest.fixture
def dask_cluster_factory(seaweedfs: Any) -> Iterator[Callable[[str], DaskCluster]]:
    """make(name) -> a cluster of this test's own (letters-only name), stopped and deleted after it."""
    made: list[DaskCluster] = []

    def make(name: str) -> DaskCluster:
        made.append(_start(name, seaweedfs))
        return made[-1]

    yield make
    for c in made:
        _stop(c)
