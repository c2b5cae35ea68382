"""A real Prometheus for a test (Debian's `prometheus` package): started on loopback with a scratch config
and data directory, scraping the targets it is given every second, and asked over its HTTP API.
tests/conftest.py's `prometheus` fixture starts one per test and stops it after. Missing the binary
fails in CI and skips elsewhere (tests/helpers.py require_tool), as promtool does."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import require_tool

INSTALL = "apt-get install prometheus (Debian's; infra/ci/check-tools.sh --install does)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Prometheus:
    url: str  # http://127.0.0.1:PORT
    proc: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        """`data` of a /api/v1 answer (raises with Prometheus's error when its status is not success)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
            doc = json.load(r)
        if doc.get("status") != "success":
            raise AssertionError(f"Prometheus /api/v1/{path} {params}: {doc}")
        return doc["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {labels}, "value": [eval time, "value"]}, ...]."""
        params = {"query": promql} | ({"time": repr(at)} if at is not None else {})
        data = self.api("query", **params)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, promql: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The first non-empty answer to `promql`, asked every 0.2 s (a scrape every second fills it);
        AssertionError naming the targets' last scrape error when none comes within `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.query(promql)
            if got:
                return got
            if time.monotonic() > deadline:
                targets = self.api("targets")["activeTargets"]
                why = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
                raise AssertionError(f"no answer to {promql} within {timeout:.0f} s; targets: {why}")
            time.sleep(0.2)


def start(workdir: Path, targets: Sequence[str], rule_files: Sequence[Path] = (), timeout: float = 60.0) -> Prometheus:
    """Prometheus scraping `targets` (host:port, path /metrics) every second, with `rule_files` evaluated
    every second, its TSDB under `workdir`; returns once /-/ready answers."""
    exe = require_tool("prometheus", INSTALL)
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": "ckptvault", "static_configs": [{"targets": list(targets)}]}],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    args = [
        exe,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return prom
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(prom)
            raise RuntimeError(f"Prometheus did not start ({' '.join(args)}): {log.read_text()}")
        time.sleep(0.1)


def stop(prom: Prometheus) -> None:
    prom.proc.terminate()
    try:
        prom.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        prom.proc.kill()
        prom.proc.wait(timeout=10)
