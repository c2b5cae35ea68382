"""The bench's servers: SeaweedFS and Ceph RGW started by infra/local/*.sh through tests/servers.py
(the same scripts, port offsets, regions and environment scrubbing as the test suite's instances), and
a Prefect server, all with state under the bench's scratch dir.

What the bench needs beyond tests/servers.py's `start`: its own credentials; ports scanned from fixed,
bench-only starts (every Server and the PrefectServer pick theirs before any of them starts, so disjoint
starts keep them apart; they also stay clear of a test session's 10000-22000); Ceph with a store sized
for the data and real lifecycle days; the venv's bin on PATH; and `clean` (down, then the state dir
deleted) instead of `down`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.paths import VENV_BIN
from tests import servers as test_servers

ACCESS_KEY, SECRET_KEY = "benchkey", "bench-secret-key"
_FIRST_PORT = {"seaweedfs": 23100, "ceph": 27480, "moto": 25600}


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_block(offsets: Sequence[int], start: int) -> int:
    """A base port P with every P+offset free (weed mini needs P..P+4 and P+10000..P+10004)."""
    for base in range(start, start + 5000, 7):
        if all(port_free(base + o) for o in offsets):
            return base
    raise RuntimeError("no free port block found")


class Server:
    def __init__(self, kind: str, scratch: Path, size_bytes: int) -> None:
        spec = test_servers.SPECS[kind]
        self.kind = kind
        self.state = scratch / kind
        self.port = free_block(spec.port_offsets, _FIRST_PORT[kind])
        self.region = spec.region
        self.size_bytes = size_bytes
        self.url = f"http://127.0.0.1:{self.port}"
        self.started = False

    def _env(self) -> dict[str, str]:
        """The script's settings on top of the caller's environment (tests/servers.py adds STATE_DIR)."""
        env = dict(
            PORT=str(self.port),
            ACCESS_KEY=ACCESS_KEY,
            SECRET_KEY=SECRET_KEY,
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
        )
        if self.kind == "ceph":
            env["STORE_BYTES"] = str(self.size_bytes)
            env["READY_TIMEOUT"] = "240"
            # Real lifecycle days (Ceph's default), not the test suite's 10-second ones: under those,
            # the abort-incomplete-multipart rule ingest sets (1 day) aborted the optimizer's upload
            # still in flight after ~10 s (NoSuchUpload, run 20261201T011614Z).
            env["LC_DEBUG_INTERVAL"] = "-1"
        return env

    def up(self) -> None:
        self.started = True
        r = test_servers.run_script(self.kind, "up", self.state, self._env(), timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(r.args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")

    def down(self) -> None:
        if self.state.exists():
            test_servers.run_script(self.kind, "clean", self.state, self._env(), timeout=120)

    def vacuum(self) -> None:
        """SeaweedFS keeps deleted bytes in its volumes until a vacuum: reclaim them between runs so the
        disk does not fill up over many repetitions (Ceph's RGW garbage collector does this itself)."""
        if self.kind == "seaweedfs":
            with contextlib.suppress(Exception):
                urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port + 1}/vol/vacuum?garbageThreshold=0.0001", timeout=300
                ).read()


class PrefectServer:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_block([0], 24200)
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.proc: subprocess.Popen[bytes] | None = None

    def up(self, env: dict[str, str]) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        logf = open(self.home / "server.log", "ab")  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        (self.home / "server.pid").write_text(str(self.proc.pid))  # for the next run, if this one is killed -9
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited ({self.proc.returncode}); see {self.home / 'server.log'}")
            with contextlib.suppress(Exception):
                if urllib.request.urlopen(self.url + "/health", timeout=2).status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError("prefect server not healthy after 180 s")

    def down(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # its own session: the server and its uvicorn child
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(5)


def stop_leftovers(scratch: Path) -> None:
    """Stop what a run killed with -9 left running from `scratch`: its Prefect server (by the pid it
    recorded) and its S3 servers (their scripts' `clean`)."""
    pidfile = scratch / "prefect" / "server.pid"
    if pidfile.exists():
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text())
            if "prefect" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                os.killpg(pid, signal.SIGKILL)
    for kind in ("seaweedfs", "ceph"):
        st = scratch / kind
        if st.exists():
            test_servers.run_script(kind, "clean", st, {}, timeout=120)
