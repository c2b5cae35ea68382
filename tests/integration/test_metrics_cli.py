"""`ckptvault metrics` through the CLI on SeaweedFS (docs/metrics.md): the text on stdout, the same in a
`--textfile` replaced whole, `--json`, a push to a real Pushgateway (Debian's prometheus-pushgateway,
started here on loopback) under the grouping key job/config, and bad input (a textfile path that
cannot be written, an address that is not one, a Pushgateway that does not answer): exit 2 naming it."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ckptvault.catalog import Catalog, Event
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault_cli.main import main
from tests.helpers import require_tool, write_config

NOW = time.time()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _config(tmp_path: Path, seaweedfs: Any, bucket: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [])
    cat = Catalog(open_store(load_config(str(cfg)).store), "t")
    cat.append([
        Event("a", 100, "verified", NOW - 600, bytes=4000, files=2, storage_class="STANDARD", created_at=NOW - 900),
        Event("b", 10, "verified", NOW - 5000, bytes=8000, files=3, storage_class="GLACIER", created_at=NOW - 5060),
        Event("b", 10, "drilled", NOW - 100, ok=False),
    ])  # fmt: skip
    return cfg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.seaweedfs
def test_metrics_printed_written_and_refused(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    cfg = _config(tmp_path, seaweedfs, bucket_factory(seaweedfs), monkeypatch)
    assert main(["--config", str(cfg), "metrics"]) == 0
    m = _samples(capsys.readouterr().out)
    assert m[("ckptvault_catalog_up", ())] == 1.0
    assert m[("ckptvault_run_newest_verified_timestamp_seconds", (("run", "a"),))] == pytest.approx(NOW - 600)
    assert m[("ckptvault_run_last_drill_success", (("run", "b"),))] == 0.0
    assert m[("ckptvault_saves", (("state", "suspect"),))] == 1.0
    assert main(["--config", str(cfg), "catalog", "stats", "--json"]) == 0
    by_class = json.loads(capsys.readouterr().out)["by_class"]
    assert {c: m[("ckptvault_class_bytes", (("class", c),))] for c in by_class} == {
        c: float(v["bytes"]) for c, v in by_class.items()
    }
    assert m[("ckptvault_class_monthly_cost_usd", (("class", "GLACIER"),))] > 0

    out = tmp_path / "textfile" / "ckptvault.prom"
    out.parent.mkdir()
    out.write_text("stale\n")
    assert main(["--config", str(cfg), "metrics", "--textfile", str(out)]) == 0
    assert capsys.readouterr().out == ""  # written, not printed
    again = _samples(out.read_text())
    assert again.keys() == m.keys()  # replaced whole: nothing of the old file left
    assert [p.name for p in out.parent.iterdir()] == ["ckptvault.prom"]  # no temporary file left behind

    assert main(["--config", str(cfg), "metrics", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["catalog_up"] is True
    runs = next(f for f in doc["metrics"] if f["name"] == "ckptvault_run_newest_verified_timestamp_seconds")
    assert runs["type"] == "gauge" and [s["labels"] for s in runs["samples"]] == [{"run": "a"}]

    for flags, needle in (
        (["--textfile", str(tmp_path / "nowhere" / "x.prom")], f"the directory {tmp_path / 'nowhere'} does not exist"),
        (["--textfile", str(tmp_path / "x.txt")], "reads only *.prom files"),
        (["--push", "ftp://127.0.0.1:9091"], "--push ftp://127.0.0.1:9091: not a Pushgateway address"),
        (["--push", "http://127.0.0.1:notaport"], "not a Pushgateway address"),
        (["--push", f"http://127.0.0.1:{_free_port()}"], "the Pushgateway did not take the metrics"),
    ):
        assert main(["--config", str(cfg), "metrics", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err

    # `serve` with [metrics] on a port another process holds: exit 2 naming it, before Prefect starts
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg.write_text(cfg.read_text() + f"\n[metrics]\nport = {port}\n")
        assert main(["--config", str(cfg), "serve"]) == 2
    err = capsys.readouterr().err
    assert f"[metrics] cannot listen on 127.0.0.1 port {port}: Address already in use" in err, err
    assert "Prefect" not in err and "Traceback" not in err


@pytest.fixture
def pushgateway(tmp_path: Path) -> Iterator[str]:
    exe = require_tool(
        "prometheus-pushgateway", "apt-get install prometheus-pushgateway (infra/ci/check-tools.sh --install does)"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "pushgateway.log").open("wb")
    # in memory only: Debian's build persists to /var/lib/prometheus by default, shared by every run
    args = [exe, f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    why = (tmp_path / "pushgateway.log").read_text()
                    raise RuntimeError(f"the Pushgateway did not start: {why}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.mark.seaweedfs
def test_metrics_pushed_under_a_stable_grouping_key(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pushgateway: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    bucket = bucket_factory(seaweedfs)
    cfg = _config(tmp_path, seaweedfs, bucket, monkeypatch)
    for _ in range(2):  # pushed twice: one group, replaced, not a second one
        assert main(["--config", str(cfg), "metrics", "--push", pushgateway]) == 0
    assert f"metrics pushed to {pushgateway} (job=ckptvault, config={bucket}/t)" in capsys.readouterr().err
    with urllib.request.urlopen(f"{pushgateway}/api/v1/metrics", timeout=10) as r:
        groups = json.load(r)["data"]
    assert [g["labels"] for g in groups] == [{"job": "ckptvault", "config": f"{bucket}/t"}]
    with urllib.request.urlopen(f"{pushgateway}/metrics", timeout=10) as r:
        m = _samples(r.read().decode())
    key = (("config", f"{bucket}/t"), ("instance", ""), ("job", "ckptvault"))
    assert m[("ckptvault_runs", key)] == 2.0
    newest = ("ckptvault_run_newest_verified_timestamp_seconds", tuple(sorted((*key, ("run", "a")))))
    assert m[newest] == pytest.approx(NOW - 600)
