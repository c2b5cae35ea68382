"""The local stack through the real scripts and real servers: `make demo`'s store, then `make up` (which
uses that store), `make down` (stops every server of the checkout and names each), `make clean` (stops,
then deletes), and the port-conflict hints (each names the variable that really moves the port, and
following it works).

Isolation: every script runs with DEMO_DIR and STATE_ROOT in a fresh temporary directory, and every port is
picked free (10000-22000, as tests/servers.py does): the developer's .demo/ and .state/, their servers on
8333/4200 and other sessions' test servers are never looked at. The `make` targets are checked to be exactly
these scripts (`make -n`), not run: `make up` would rebuild .venv whenever pyproject.toml is newer.
Teardown runs down.sh on the temporary roots, checks that every process the test started is gone and
deletes the directory; a session killed before that is tidied by the next one (`_reap_dead_sessions`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests import servers

REPO = servers.REPO_ROOT
LOCAL = REPO / "infra" / "local"
TMP_PREFIX = "ckptvault-stack-"
SEAWEED_BLOCK = servers.SPECS["seaweedfs"].port_offsets
# Variables the scripts read that a developer's shell might have set: the tests choose them or leave them out.
_DROP = servers._SCRIPT_VARS | {
    "STORE",
    "STORE_PORT",
    "PREFECT_PORT",
    "DEMO_PORT",
    "DEMO_STORE",
    "DEMO_DIR",
    "STATE_ROOT",
    "CKPTVAULT_CONFIG",
    "PREFECT_API_URL",
    "PORT_HINT",
    "POOL",
    "WORK_QUEUE",
    "BUCKET",
}


def _pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_block(offsets: tuple[int, ...] = SEAWEED_BLOCK) -> int:
    return servers.free_port_base(offsets)


@dataclass
class Stack:
    """A throwaway DEMO_DIR + STATE_ROOT and how to run the scripts against them."""

    root: Path
    pids: set[int] = field(default_factory=set)

    @property
    def demo_dir(self) -> Path:
        return self.root / "demo"

    @property
    def state_root(self) -> Path:
        return self.root / "state"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _DROP}
        env.update(DEMO_DIR=str(self.demo_dir), STATE_ROOT=str(self.state_root), STOP_TIMEOUT="3")
        env.update(extra)
        return env

    def run(self, args: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            args,
            cwd=REPO,
            env=self.env(**extra),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,  # a hung script fails the test instead of the session's 600 s limit
            check=False,
        )
        self.remember_pids()
        return proc

    def script(self, name: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return self.run(["bash", str(LOCAL / name), *args], **extra)

    def demo_store(self, **extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
        """`make demo`'s store start (ckptvault_cli.demo._store_env, what main() calls first), in a subprocess."""
        code = (
            "import json; from ckptvault_cli.demo import _store_env; "
            "url, env = _store_env(); "
            "print(json.dumps({'url': url, **{k: env[k] for k in ('STATE_DIR', 'PORT', 'ACCESS_KEY', 'SECRET_KEY')}}))"
        )
        proc = self.run([sys.executable, "-c", code], **extra)
        info = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
        return proc, info

    def remember_pids(self) -> None:
        """Every PID file under the roots: the processes this test started, checked gone at teardown."""
        if self.root.exists():
            for f in self.root.rglob("*pid"):
                text = f.read_text().strip() if f.is_file() else ""
                if text.isdigit():
                    self.pids.add(int(text))

    def alive(self) -> list[int]:
        return sorted(p for p in self.pids if _pid_alive(p))


def _reap_dead_sessions() -> None:
    """Stop and delete what an earlier, killed session of this module left (its pytest pid is in the name)."""
    for d in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        m = re.match(rf"{TMP_PREFIX}(\d+)-", d.name)
        if not m or not d.is_dir() or _pid_alive(int(m[1])):
            continue
        Stack(d).script("down.sh", "clean")
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def stack() -> Iterator[Stack]:
    _reap_dead_sessions()
    st = Stack(Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")))
    try:
        yield st
    finally:
        st.remember_pids()
        down = st.script("down.sh")
        # A fake "running test session" dir (test_clean_*) is left alone by down.sh: stop it by its own script.
        for d in st.state_root.glob(f"test-moto-{os.getpid()}"):
            st.script("moto.sh", "down", STATE_DIR=str(d))
        left = st.alive()
        shutil.rmtree(st.root, ignore_errors=True)
        assert not left, f"processes still running after teardown: {left}\n{down.stdout}{down.stderr}"


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    out = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out}"
    return out


def _post(url: str) -> list[dict[str, Any]]:
    """A Prefect API filter call with no filter: every row."""
    req = urllib.request.Request(url, data=b"{}", headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        rows: list[dict[str, Any]] = json.loads(r.read())
    return rows


def _running(st: Stack) -> list[str]:
    listing = _ok(st.script("instances.sh"))
    return [line for line in listing.splitlines() if line.startswith("running")]


def test_make_targets_are_these_scripts() -> None:
    """make up/down/clean run exactly the scripts the other tests drive (and clean no longer rm -rf's first)."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    for target, expected in [
        ("down", ["bash infra/local/down.sh"]),
        ("clean", ["bash infra/local/down.sh clean"]),
    ]:
        proc = subprocess.run(
            ["make", "-n", "--no-print-directory", target], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split("\n")[:-1] == expected, proc.stdout
    proc = subprocess.run(["make", "-n", "up"], cwd=REPO, env=env, capture_output=True, text=True)
    assert "bash infra/local/up.sh" in proc.stdout.splitlines(), proc.stdout


def test_make_up_after_demo_uses_the_demo_store_and_down_stops_everything(stack: Stack) -> None:
    port = _free_block()
    prefect_port = _free_block((0,))
    proc, demo = stack.demo_store(DEMO_PORT=str(port))
    _ok(proc)
    demo_dir = stack.demo_dir / "seaweedfs"
    assert demo == {
        "url": f"http://127.0.0.1:{port}",
        "STATE_DIR": str(demo_dir),
        "PORT": str(port),
        "ACCESS_KEY": "ckptvault-demo",
        "SECRET_KEY": "ckptvault-demo-secret",
    }

    # `make up` right after: no STORE_PORT, as a user types it. It uses the demo's store: same port, keys, data.
    out = _ok(stack.script("up.sh", PREFECT_PORT=str(prefect_port)))
    assert "using the demo's store" in out
    assert f"seaweedfs at http://127.0.0.1:{port}" in out
    assert "AWS_ACCESS_KEY_ID=ckptvault-demo AWS_SECRET_ACCESS_KEY=ckptvault-demo-secret" in out
    assert f"PREFECT_API_URL=http://127.0.0.1:{prefect_port}/api" in out
    assert not (stack.state_root / "seaweedfs").exists(), "make up started a second store"
    # the demo's config, served by the stack (one prefix, `demo`, that the roles' keys are scoped to)
    config = (stack.demo_dir / "ckptvault.toml").read_text()
    assert 'prefix = "demo"' in config
    assert f'endpoint_url = "http://127.0.0.1:{port}"' in config
    with urllib.request.urlopen(f"http://127.0.0.1:{prefect_port}/api/health", timeout=5) as r:
        assert r.read() == b"true"
    store = servers.S3Endpoint(
        "seaweedfs", f"http://127.0.0.1:{port}", "ckptvault-demo", "ckptvault-demo-secret", "us-east-1"
    )
    assert "ckpts" in [b["Name"] for b in store.client().list_buckets()["Buckets"]]
    running = _running(stack)
    assert len(running) == 5, running  # the demo's store, the Prefect server, the two workers, the trainer

    # The two roles (docs/OPERATIONS.md): the tier deployment alone on the `tier` queue, one worker per queue,
    # each registered with the API, each with its own SeaweedFS user's key, and the config tells the flows.
    assert 'deletes = "tier-only"' in config
    assert 'lifecycle = "external"' in config  # the ingest role cannot write the lifecycle: roles.py did
    rules = store.client().get_bucket_lifecycle_configuration(Bucket="ckpts")["Rules"]
    assert "ckptvault-abort-incomplete-mpu-demo" in [r["ID"] for r in rules], rules
    api = f"http://127.0.0.1:{prefect_port}/api"
    queues = {d["name"]: d["work_queue_name"] for d in _post(f"{api}/deployments/filter")}
    assert queues == {
        "ingest": "default",
        "replicate": "default",
        "scrub": "default",
        "drill": "default",
        "watch": "default",
        "restore": "default",
        "tier": "tier",
    }
    registered = {w["name"] for w in _post(f"{api}/work_pools/ckptvault/workers/filter")}
    names = {(stack.state_root / d / "worker.name").read_text().strip() for d in ("worker", "worker-tier")}
    assert len(names) == 2 and names <= registered, (names, registered)
    roles = stack.state_root / "roles.env"
    assert roles.stat().st_mode & 0o777 == 0o600
    keys = dict(line.split("=", 1) for line in roles.read_text().splitlines() if not line.startswith("#"))
    # what each worker was started with: its queue and its role's access key id (flow runs inherit the key)
    started = {d: (stack.state_root / d / "worker.started").read_text().strip() for d in ("worker", "worker-tier")}
    assert started == {
        "worker": f"queue=default key={keys['INGEST_ACCESS_KEY']}",
        "worker-tier": f"queue=tier key={keys['TIER_ACCESS_KEY']}",
    }
    for d, role in (("worker", "INGEST"), ("worker-tier", "TIER")):  # and the processes' own environment
        pid = (stack.state_root / d / "worker.pid").read_text().strip()
        environ = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
        assert environ["AWS_ACCESS_KEY_ID"] == keys[f"{role}_ACCESS_KEY"], d
    assert f"key {keys['INGEST_ACCESS_KEY']} of user ckptvault-ingest" in out and "cannot delete anything" in out
    assert f"key {keys['TIER_ACCESS_KEY']} of user ckptvault-tier" in out
    as_ingest = replace(store, access_key=keys["INGEST_ACCESS_KEY"], secret_key=keys["INGEST_SECRET_KEY"]).client()
    as_tier = replace(store, access_key=keys["TIER_ACCESS_KEY"], secret_key=keys["TIER_SECRET_KEY"]).client()
    store.client().put_object(Bucket="ckpts", Key="demo/role-check", Body=b"x")
    with pytest.raises(ClientError) as refused:
        as_ingest.delete_object(Bucket="ckpts", Key="demo/role-check")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    as_tier.delete_object(Bucket="ckpts", Key="demo/role-check")
    assert "demo/role-check" not in [
        o["Key"] for o in store.client().list_objects_v2(Bucket="ckpts", Prefix="demo/").get("Contents", [])
    ]

    # A second `make up` is a no-op on what runs; the demo's store start too (it finds its store running).
    _ok(stack.script("up.sh", "store"))
    proc, again = stack.demo_store()
    _ok(proc)
    assert again["STATE_DIR"] == str(demo_dir) and again["PORT"] == str(port)

    down = _ok(stack.script("down.sh", STOP_TIMEOUT="10"))  # as `make down` runs it
    # the trainer, the workers and the Prefect server stop on SIGTERM (a store under load may still be
    # given its SIGKILL after STOP_TIMEOUT, said, as before)
    killed = [ln for ln in down.splitlines() if "SIGKILL" in ln and not ln.startswith("seaweedfs:")]
    assert killed == [], down
    for what in (
        f"stopped trainer in {stack.state_root / 'trainer'} (make up's",
        f"stopped worker in {stack.state_root / 'worker'} (make up's",
        f"stopped worker in {stack.state_root / 'worker-tier'} (make up's",
        "stopped prefect in",
        f"stopped seaweedfs in {demo_dir} (the demo's",
    ):
        assert what in down, down
    assert (
        down.index("stopped trainer")
        < down.index("stopped worker")
        < down.index("stopped prefect")
        < down.index("stopped seaweedfs")
    ), down
    assert _running(stack) == []
    assert not stack.alive()
    assert not any(_port_open(port + o) for o in SEAWEED_BLOCK) and not _port_open(prefect_port)
    assert "nothing of this checkout was running" in _ok(stack.script("down.sh"))

    # `make up` again later: still the demo's store (the stack's catalog is there), started again.
    out = _ok(stack.script("up.sh", "store"))
    assert "using the demo's store" in out and f"S3 ready at http://127.0.0.1:{port}" in out

    clean = _ok(stack.script("down.sh", "clean"))
    assert f"stopped seaweedfs in {demo_dir}" in clean
    assert not stack.demo_dir.exists() and not stack.state_root.exists()
    assert not stack.alive()
    assert not stack.demo_dir.exists(), "something recreated the demo directory"


def test_clean_stops_before_it_deletes_and_spares_a_running_test_session(stack: Stack) -> None:
    demo_port, hand_port, session_port = _free_block(), _free_block((0,)), _free_block((0,))
    _ok(stack.demo_store(DEMO_PORT=str(demo_port))[0])
    hand = stack.state_root / "moto2"
    _ok(stack.script("moto.sh", "up", STATE_DIR=str(hand), PORT=str(hand_port)))
    # As tests/servers.py names a live session's dir: this pytest's pid, so it counts as running.
    session = stack.state_root / f"test-moto-{os.getpid()}"
    _ok(stack.script("moto.sh", "up", STATE_DIR=str(session), PORT=str(session_port)))
    weed_pid = int((stack.demo_dir / "seaweedfs" / "weed.pid").read_text())
    hand_pid = int((hand / "moto.pid").read_text())

    clean = _ok(stack.script("down.sh", "clean"))  # no `down` first: clean itself must stop them
    assert f"stopped seaweedfs in {stack.demo_dir / 'seaweedfs'} (the demo's" in clean, clean
    assert f"stopped moto in {hand} (hand-started" in clean, clean
    assert f"left running: moto in {session} (a test session's" in clean, clean
    assert not _pid_alive(weed_pid) and not _pid_alive(hand_pid)
    assert not _port_open(demo_port) and not _port_open(hand_port)
    assert not stack.demo_dir.exists()
    assert sorted(p.name for p in stack.state_root.iterdir()) == [session.name]
    assert _port_open(session_port), "clean stopped a running test session's server"
    assert not stack.demo_dir.exists(), "something recreated the demo directory"


def test_stack_keeps_its_own_store_and_the_demo_shares_it(stack: Stack) -> None:
    port = _free_block()
    # `make up` first (no demo yet): a store of its own.
    out = _ok(stack.script("up.sh", "store", STORE_PORT=str(port)))
    own = stack.state_root / "seaweedfs"
    assert f"S3 ready at http://127.0.0.1:{port}" in out and (own / "config.env").exists()
    # `make demo` then: it shares that store (with its keys) instead of failing on the port.
    proc, demo = stack.demo_store(DEMO_PORT=str(port))
    _ok(proc)
    assert demo["STATE_DIR"] == str(own) and demo["ACCESS_KEY"] == "ckptvault"
    assert not (stack.demo_dir / "seaweedfs").exists()
    assert f"stopped seaweedfs in {own} (make up's" in _ok(stack.script("down.sh"))

    # The demo alone starts its own store on that port; a later `make up` keeps the stack's store (its
    # catalog is there) and stops the demo's, saying so.
    proc, demo = stack.demo_store(DEMO_PORT=str(port))
    _ok(proc)
    assert demo["STATE_DIR"] == str(stack.demo_dir / "seaweedfs")
    out = _ok(stack.script("up.sh", "store"))
    assert f"stopping seaweedfs in {stack.demo_dir / 'seaweedfs'} (the demo's" in out, out
    assert "AWS_ACCESS_KEY_ID=ckptvault AWS_SECRET_ACCESS_KEY=ckptvault-secret" in out
    running = _running(stack)
    assert len(running) == 1 and str(own) in running[0], running


def test_port_conflicts_name_the_variable_that_moves_the_port(stack: Stack) -> None:
    with socket.socket() as foreign:
        # Not port 0: an ephemeral port + 10000 (SeaweedFS's gRPC ports) may not exist.
        taken = _free_block()
        foreign.bind(("127.0.0.1", taken))
        foreign.listen()

        # `make up` with a port held by something that is not ours: exit 3, and the hint is STORE_PORT.
        proc = stack.script("up.sh", "store", STORE_PORT=str(taken))
        assert proc.returncode == 3, proc.stderr
        assert f"port {taken} on 127.0.0.1 is already in use" in proc.stderr
        assert "not by a server of this checkout" in proc.stderr
        assert "set PORT" not in proc.stderr
        m = re.search(r"STORE_PORT=(\d+) make up", proc.stderr)
        assert m, proc.stderr
        m_store = m[1]
        # Following the hint works.
        out = _ok(stack.script("up.sh", "store", STORE_PORT=m_store))
        assert f"S3 ready at http://127.0.0.1:{m_store}" in out

        # `make demo` on a taken port: the hint is DEMO_PORT, and following it works.
        proc, _ = stack.demo_store(DEMO_PORT=str(taken))
        assert proc.returncode == 3, proc.stderr
        m = re.search(r"DEMO_PORT=(\d+) make demo", proc.stderr)
        assert m and "set PORT" not in proc.stderr, proc.stderr
        proc, demo = stack.demo_store(DEMO_PORT=m[1])
        _ok(proc)
        assert demo["PORT"] == m[1]

    # The stack's store, once created, keeps its port: STORE_PORT asking for another is refused, clearly.
    proc = stack.script("up.sh", "store", STORE_PORT=str(_free_block()))
    assert proc.returncode == 1, proc.stderr
    assert f"was created on port {m_store} and keeps it" in proc.stderr and "unset STORE_PORT" in proc.stderr

    # A port held by a hand-started server of this checkout: named, with the command that stops it.
    _ok(stack.script("down.sh"))
    shutil.rmtree(stack.state_root)  # the stack starts afresh (its store is stopped: down.sh said so)
    hand_port = _free_block((0,))
    hand = stack.state_root / "moto2"
    _ok(stack.script("moto.sh", "up", STATE_DIR=str(hand), PORT=str(hand_port)))
    proc = stack.script("up.sh", "store", STORE_PORT=str(hand_port))
    assert proc.returncode == 3, proc.stderr
    assert f"port {hand_port} is held by moto in {hand} (hand-started" in proc.stderr
    assert f"STATE_DIR={hand} bash infra/local/moto.sh down" in proc.stderr
    assert re.search(r"STORE_PORT=\d+ make up", proc.stderr), proc.stderr


def test_make_demo_ends_with_the_catalog_and_no_error_lines(stack: Stack) -> None:
    """`make demo 2>&1` as a new user sees it (what `make demo` runs, on a port of its own): the catalog is
    the last thing on the screen, and no line says error, exception or traceback."""
    port = _free_block()
    proc = stack.run([sys.executable, "-m", "ckptvault_cli.demo"], DEMO_PORT=str(port))
    screen = proc.stdout + proc.stderr
    assert proc.returncode == 0, screen[-3000:]
    bad = [line for line in screen.splitlines() if re.search(r"error|exception|traceback", line, re.IGNORECASE)]
    assert bad == [], bad[:20]
    out = proc.stdout
    catalog = out[out.index("[demo] the catalog now holds:") : out.index("[demo] where to look next")]
    rows = [line for line in catalog.splitlines() if re.match(r"^\S+\s+\d+\s+1\s+\w+\s+verified", line)]
    assert len(rows) == 9, catalog  # every checkpoint of the four simulated runs, verified
