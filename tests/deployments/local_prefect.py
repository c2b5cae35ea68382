"""A real Prefect server and worker for tests, started by the scripts humans use (infra/local/prefect.sh,
infra/local/worker.sh), on a free port with all state in a temporary directory.

State dirs are named `ckptvault-test-<prefect|worker>-<pytest pid>-<tag>` in the system temp dir, so the
leftovers of a killed session are recognised and stopped by the next one (`reap_stale`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import servers

REPO_ROOT = servers.REPO_ROOT
SCRIPTS = REPO_ROOT / "infra" / "local"
TMP = Path(tempfile.gettempdir())
_STATE_RE = re.compile(r"ckptvault-test-(prefect|worker)-(\d+)-[0-9a-f]+")
# Variables of the scripts that a developer's shell must not leak into a test instance.
_DROP = {
    "STATE_DIR",
    "PORT",
    "READY_TIMEOUT",
    "STOP_TIMEOUT",
    "POOL",
    "WORK_QUEUE",
    "DEPLOY",
    "PREFECT_API_URL",
    "PREFECT_PORT",
}


def telemetry_off_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update(DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false", SE_OFFLINE="true")
    env.update(extra)
    return env


def new_state_dir(kind: str) -> Path:
    return TMP / f"ckptvault-test-{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _script(name: str, action: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPTS / f"{name}.sh"), action],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _tail(p: subprocess.CompletedProcess[str], n: int = 60) -> str:
    return "\n".join(f"{p.stdout}\n{p.stderr}".strip().splitlines()[-n:])


@dataclass(frozen=True)
class PrefectServer:
    port: int
    state_dir: Path
    startup_seconds: float

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> Any:
        return _send(urllib.request.Request(self.api_url + path))

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(
            self.api_url + path,
            data=json.dumps(body or {}).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        return _send(req)

    def deployments(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.post("/deployments/filter")
        return result

    def flow_run(self, flow_run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/flow_runs/{flow_run_id}")
        return result

    def run_deployment(self, deployment_id: str, timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
        """Create a flow run of the deployment and wait until it ends: (the run, its final state)."""
        run: dict[str, Any] = self.post(f"/deployments/{deployment_id}/create_flow_run", {})
        state: dict[str, Any] = wait_for(
            "the deployment's run ends",
            lambda: (s := self.flow_run(run["id"])["state"])["type"] in {"COMPLETED", "FAILED", "CRASHED"} and s,
            timeout,
        )
        return run, state

    def task_runs(self, flow_run_id: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
        return result

    def artifact_keys(self, flow_run_id: str) -> set[str]:
        arts = self.post("/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
        return {a["key"] for a in arts if a.get("key")}

    def cli_env(self, **extra: str) -> dict[str, str]:
        """Environment for a `prefect` CLI or a client process talking to this server."""
        return telemetry_off_env(PREFECT_API_URL=self.api_url, **extra)


def start_prefect_server(ready_timeout: int = 150, **settings: str) -> PrefectServer:
    """`prefect.sh up` on a free port with a fresh SQLite database; retried on a port taken meanwhile.
    `settings`: the server's own PREFECT_* settings, passed in its environment."""
    out = ""
    for _ in range(3):
        state = new_state_dir("prefect")
        port = servers.free_port_base((0,))
        env = telemetry_off_env(STATE_DIR=str(state), PORT=str(port), READY_TIMEOUT=str(ready_timeout), **settings)
        t0 = time.monotonic()
        p = _script("prefect", "up", env, timeout=ready_timeout + 60)
        if p.returncode == 0:
            return PrefectServer(port, state, time.monotonic() - t0)
        out = _tail(p)
        stop("prefect", state)
        if p.returncode != 3:  # 3: the port was taken between our check and the server's bind
            break
    raise RuntimeError(f"infra/local/prefect.sh up failed:\n{out}")


def start_worker(server: PrefectServer, extra_env: dict[str, str], ready_timeout: int = 90) -> Path:
    """`worker.sh up`: the work pool, `prefect deploy --all`, a worker. Returns the worker's state dir."""
    state = new_state_dir("worker")
    env = server.cli_env(STATE_DIR=str(state), READY_TIMEOUT=str(ready_timeout), **extra_env)
    p = _script("worker", "up", env, timeout=ready_timeout + 360)
    if p.returncode != 0:
        stop("worker", state)
        raise RuntimeError(f"infra/local/worker.sh up failed:\n{_tail(p)}")
    return state


def stop(kind: str, state_dir: Path, *, remove: bool = True) -> None:
    """Stop by recorded PID (the script's `down`), then delete the state dir (unless kept on request)."""
    if state_dir.exists():
        with contextlib.suppress(subprocess.TimeoutExpired):
            _script(kind, "down", telemetry_off_env(STATE_DIR=str(state_dir), STOP_TIMEOUT="3"), timeout=60)
    if remove and os.environ.get("CKPTVAULT_KEEP_TEST_STATE") != "1":
        shutil.rmtree(state_dir, ignore_errors=True)


def reap_stale() -> list[str]:
    """Stop and delete the servers and workers of test sessions that died before their teardown."""
    reaped = []
    for d in TMP.glob("ckptvault-test-*-*-*"):
        m = _STATE_RE.fullmatch(d.name)
        if not m or not d.is_dir():
            continue
        pid = int(m[2])
        try:
            os.kill(pid, 0)
            continue  # that session is still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        stop(m[1], d)
        reaped.append(str(d))
    return reaped


def _send(req: urllib.request.Request, attempts: int = 5) -> Any:
    """One API call. The SQLite-backed server answers 503 when its database is busy (seen in CI while a
    served flow run was writing): the request was not applied, so it is sent again after a pause, as
    Prefect's own client does. Any other error, or a 503 that persists, fails the test."""
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == attempts - 1:
                raise
        time.sleep(2**attempt)
    raise AssertionError("unreachable")


def wait_for(what: str, check: Any, timeout: float, interval: float = 1.0) -> Any:
    """Poll check() until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, OSError, KeyError, ValueError):
            last = check()
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last value: {last!r})")


def page_text(driver: Any) -> str:
    """Everything the page shows, as a person reads it."""
    from selenium.webdriver.common.by import By

    text: str = driver.find_element(By.TAG_NAME, "body").text
    return text


def ui_wait(what: str, check: Any, timeout: float = 60, interval: float = 0.5) -> Any:
    """wait_for, where an element the Vue UI re-rendered under us counts as "not yet", not as a failure."""
    from selenium.common.exceptions import StaleElementReferenceException

    def tolerant() -> Any:
        try:
            return check()
        except StaleElementReferenceException:
            return None

    return wait_for(what, tolerant, timeout, interval)
