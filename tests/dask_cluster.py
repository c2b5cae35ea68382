"""A real Dask cluster for tests: infra/local/dask.sh (the script humans use) on free loopback ports,
with its own state dir `.state/test-dask<name>-<pytest pid>`, stopped and deleted afterwards (the
name is letters only: down.sh and .ci/run leave `test-<letters>-<pid>` alone while that pid runs).

Like tests/servers.py for the S3 servers: a session that died without stopping its cluster is cleaned
up by the next one (`reap_stale`), and by .ci/run's trap (it stops every `server` dir of the checkout).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import servers

SCRIPT = servers.SCRIPTS / "dask.sh"
_OWN_VARS = ("WORKERS", "THREADS")  # dask.sh's settings besides those tests/servers.py already drops


class DaskStartError(RuntimeError):
    """dask.sh up failed; the message carries its output (with the logs' tails)."""


@dataclass(frozen=True)
class DaskCluster:
    address: str
    state_dir: Path
    workers: int

    def node_dir(self, i: int) -> Path:
        return self.state_dir / f"node-{i}"

    def worker_pids(self) -> dict[str, int]:
        """node name -> the PID of its worker process (the nanny's child that runs the tasks)."""
        from distributed import Client

        with Client(self.address, timeout=10, set_as_default=False) as c:
            info: dict[str, Any] = c.scheduler_info(n_workers=-1)["workers"]
            pids: dict[str, int] = c.run(os.getpid)
            return {str(info[addr]["name"]): pid for addr, pid in pids.items()}


def _run(action: str, state_dir: Path, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in servers._script_env(state_dir, extra).items() if k not in _OWN_VARS or k in extra}
    return subprocess.run(
        ["bash", str(SCRIPT), action], env=env, cwd=servers.REPO_ROOT, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def start(state_dir: Path, workers: int = 2, env: dict[str, str] | None = None, attempts: int = 3) -> DaskCluster:
    """env: for the scheduler and workers, e.g. the store's credentials (each worker builds its own
    boto3 client from its own environment; the S3Store sent to it carries no secret)."""
    if state_dir.exists():
        stop(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
    output = ""
    for _ in range(attempts):
        port = servers.free_port_base((0, 1))
        extra = {**(env or {}), "PORT": str(port), "WORKERS": str(workers), "STOP_TIMEOUT": "3"}
        proc = _run("up", state_dir, extra)
        output = f"{proc.stdout}\n{proc.stderr}".strip()
        if proc.returncode == 0:
            return DaskCluster(f"tcp://127.0.0.1:{port}", state_dir, workers)
        if proc.returncode != 3:  # 3: a port was taken meanwhile; other ports, afresh
            break
        shutil.rmtree(state_dir, ignore_errors=True)
    raise DaskStartError(f"`dask.sh up` failed (state {state_dir}):\n{servers._tail(output)}")


def stop(state_dir: Path) -> str:
    if not state_dir.exists():
        return ""
    proc = _run("down", state_dir, {"STOP_TIMEOUT": "3"})
    return f"{proc.stdout}{proc.stderr}".strip()


def session_dir(name: str = "") -> Path:
    assert re.fullmatch("[a-z]*", name), name
    return servers.STATE_ROOT / f"test-dask{name}-{os.getpid()}"


def reap_stale() -> list[str]:
    """Stop and delete the clusters of test sessions that are gone."""
    reaped = []
    for d in servers.STATE_ROOT.glob("test-dask*-*"):
        m = re.fullmatch(r"test-dask[a-z]*-(\d+)", d.name)
        if not m or not d.is_dir() or servers._pid_alive(int(m[1])):
            continue
        stop(d)
        shutil.rmtree(d, ignore_errors=True)
        reaped.append(str(d))
    return reaped
