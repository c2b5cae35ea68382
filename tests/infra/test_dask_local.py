"""infra/local/dask.sh: a real scheduler and 2 worker processes on loopback, each a "node" with its own
directory, name and resource; stopped by PID with nothing left behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from distributed import Client

from tests import dask_cluster, dask_probe
from tests.dask_cluster import DaskCluster


def _node() -> Callable[[], str]:
    # a lambda: dask sends a task graph by plain pickle (by reference) unless that fails, and the
    # scheduler and workers cannot import this module; a lambda goes by value
    return lambda: os.environ["CKPTVAULT_NODE"]


def test_each_worker_is_a_node_with_its_own_directory_and_resource(dask_cluster_2: DaskCluster) -> None:
    c = dask_cluster_2
    with Client(c.address, timeout=10, set_as_default=False) as client:
        seen = sorted(client.run(dask_probe.identity).values(), key=lambda w: str(w["name"]))
        assert [w["name"] for w in seen] == ["node-0", "node-1"]
        for i, w in enumerate(seen):
            assert w["node"] == f"node-{i}" and w["node_dir"] == str(c.node_dir(i))
            assert w["local_directory"].startswith(str(c.node_dir(i)))
            assert w["resources"] == {f"node-{i}": 1.0}
        assert len({w["pid"] for w in seen}) == 2 and os.getpid() not in {w["pid"] for w in seen}
        # the resource pins work to a node: what later work needs to map a node-local file to its node
        ran = client.gather([client.submit(_node(), resources={f"node-{i}": 1}, pure=False) for i in (1, 0, 1)])
        assert ran == ["node-1", "node-0", "node-1"]


def test_the_probe_records_where_each_task_ran(dask_cluster_2: DaskCluster) -> None:
    c = dask_cluster_2
    dirs = [c.node_dir(i) for i in range(c.workers)]
    dask_probe.install(c.address)
    dask_probe.clear(dirs)
    with Client(c.address, timeout=10, set_as_default=False) as client:
        client.gather(client.submit(_node(), resources={"node-1": 1}, key="probe-check", pure=False))
    done = [r for r in dask_probe.records(dirs) if r["key"] == "probe-check" and r["event"] == "memory"]
    assert [(r["node"], r["pid"]) for r in done] == [("node-1", c.worker_pids()["node-1"])]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" in f.read()  # exited, not yet reaped by its parent
    except FileNotFoundError:
        return True


def test_make_down_stops_a_cluster_by_pid_and_leaves_no_process(tmp_path: Path) -> None:
    root = tmp_path / "state"
    c = dask_cluster.start(root / "dask", workers=2)
    try:
        status = dask_cluster._run("status", c.state_dir, {})
        assert status.returncode == 0 and f"ready at {c.address} (2 workers)" in status.stdout
        pids = [int((c.state_dir / f).read_text()) for f in ("scheduler.pid", "node-0.pid", "node-1.pid")]
        pids += list(c.worker_pids().values())  # the nannies' children, which run the tasks
        env = {**os.environ, "STATE_ROOT": str(root), "DEMO_DIR": str(tmp_path / "demo"), "STOP_TIMEOUT": "3"}
        down = subprocess.run(
            ["bash", str(dask_cluster.servers.SCRIPTS / "down.sh")], env=env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert down.returncode == 0, down.stderr
        assert "down: stopped dask in" in down.stderr
        assert all(_gone(pid) for pid in pids), [p for p in pids if not _gone(p)]
        stopped = dask_cluster._run("status", c.state_dir, {})
        assert stopped.returncode == 3 and "not running" in stopped.stdout
    finally:
        dask_cluster.stop(c.state_dir)
