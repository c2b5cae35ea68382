"""A real Prometheus (Debian's package, tests/prometheus.py) scraping the `/metrics` server `ckptvault
serve` starts (ckptvault_cli/commands/serve.py start_metrics, run in this process from the test's config)
after an ingest and a drill on SeaweedFS through the CLI, asked over its HTTP API with PromQL: each
run's newest checkpoint's age equal to what `ls --json` says, bytes per class equal to `catalog stats
--json`, the drill's result per run, every query of the Grafana dashboard answered, and the alert rules
(infra/prometheus/ckptvault-rules.yml) loaded and CkptvaultDrillFailed firing for the run whose drill
failed. No Prefect: the CLI runs the flows directly (ckptvault_cli/running.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ckptvault.checkpoint.manifest import checkpoint_prefix
from ckptvault.config import load_config
from ckptvault.store import open_store
from ckptvault_cli.commands.serve import start_metrics
from ckptvault_cli.main import main
from ckptvault_cli.synthetic import write_checkpoint
from tests.helpers import write_config
from tests.prometheus import Prometheus, free_port
from tests.promql import metric_names

KiB = 2**10
RULES = Path(__file__).resolve().parents[2] / "infra" / "prometheus" / "ckptvault-rules.yml"
DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "ckptvault.json"
# series this test's config has none of: no [[replicas]], no stale_after_hours, no restore, no failed upload
NOTHING_HERE = {
    "ckptvault_replica_saves", "ckptvault_run_stale_after_seconds", "ckptvault_restore_bytes_total",
    "ckptvault_restore_seconds_total", "ckptvault_restore_failures_total", "ckptvault_upload_failures_total",
}  # fmt: skip


def _unix(iso: str) -> float:
    """`ls --json`'s times ("2026-12-04T19:22:25Z", floored to the second) as unix seconds."""
    return datetime.fromisoformat(iso).timestamp()


def _by_run(result: list[dict[str, Any]], label: str = "run") -> dict[str, float]:
    return {r["metric"][label]: float(r["value"][1]) for r in result}


def test_prometheus_scrapes_serve_after_an_ingest_and_a_drill(
    seaweedfs: Any, bucket_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], prometheus: Callable[..., Prometheus],
) -> None:  # fmt: skip
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    bucket = bucket_factory(seaweedfs)
    # run a: two good saves; run b: one, damaged after ingest, so its drill fails and it has no good save
    for run, steps in (("a", (100, 200)), ("b", (100,))):
        for step in steps:
            write_checkpoint(tmp_path / run, "hf", step, 16 * KiB, shards=1, seed=step)
    port = free_port()
    extra = (
        f'[validation]\nenabled = false\n[drill]\nscratch = "{tmp_path / "scratch"}"\nsample = 1\n'
        f"[notify]\nbudget_usd_per_month = 100\n[metrics]\nport = {port}\n"
    )
    sources = [("a", tmp_path / "a", "hf"), ("b", tmp_path / "b", "hf")]
    cfg_path = write_config(tmp_path / "c.toml", seaweedfs, bucket, sources, extra=extra)

    def doc(*argv: str, rc: int = 0) -> Any:
        capsys.readouterr()
        assert main(["--config", str(cfg_path), *argv, "--json"]) == rc, argv
        return json.loads(capsys.readouterr().out)

    assert doc("ingest")["ok"] is True
    client = seaweedfs.client()
    key = checkpoint_prefix("t", "b", 100) + "model.safetensors"
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=body[:-1] + bytes([body[-1] ^ 0xFF]))
    drilled = {(r["run"], r["step"]): r["ok"] for r in doc("drill", rc=1)["drilled"]}
    assert drilled == {("a", 200): True, ("a", 100): True, ("b", 100): False}
    rows = doc("ls")
    stats = doc("catalog", "stats")

    cfg = load_config(str(cfg_path))
    server = start_metrics(cfg, open_store(cfg.store))
    assert server is not None
    try:
        prom = prometheus([f"127.0.0.1:{port}"], rule_files=(RULES,))
        prom.wait_for("ckptvault_catalog_up == 1")  # the first scrape after the drill

        # each run's newest good save's age, at one evaluation time: the truth is that time minus its
        # commit time in `ls` (to the second: within 1 s); b has no good save left, so no series
        newest = {r["run"]: r for r in sorted(rows, key=lambda r: (r["step"], r["save"])) if r["state"] == "verified"}
        ages = prom.query("time() - ckptvault_run_newest_verified_timestamp_seconds")
        assert {r["metric"]["run"] for r in ages} == set(newest) == {"a"}
        for r in ages:
            at, age = float(r["value"][0]), float(r["value"][1])
            assert abs(age - (at - _unix(newest[r["metric"]["run"]]["uploaded_at"]))) < 1.0, (r, newest)

        by_class = stats["by_class"]
        assert by_class and _by_run(prom.query("ckptvault_class_bytes"), "class") == {
            c: float(v["bytes"]) for c, v in by_class.items()
        }
        assert _by_run(prom.query("ckptvault_class_stored_bytes"), "class") == {
            c: float(v["stored_bytes"]) for c, v in by_class.items()
        }

        # the drill's result: per run, its newest drill (as `ls` folds it), passed or not
        last: dict[str, dict[str, Any]] = {}
        for r in sorted((r for r in rows if r["last_drill_at"] is not None), key=lambda r: r["last_drill_at"]):
            last[r["run"]] = r
        assert _by_run(prom.query("ckptvault_run_last_drill_success")) == {"a": 1.0, "b": 0.0}
        assert {run: r["last_drill_ok"] for run, r in last.items()} == {"a": True, "b": False}
        drill_at = _by_run(prom.query("ckptvault_run_last_drill_timestamp_seconds"))
        assert drill_at.keys() == last.keys()
        for run, r in last.items():
            assert 0 <= drill_at[run] - _unix(r["last_drill_at"]) < 1.0, (run, drill_at, r)
        assert _by_run(prom.query("ckptvault_run_suspect_saves")) == {"a": 0.0, "b": 1.0}

        # what the flows did, from the bucket: the catalog's committed bytes per run, the ledger's drill
        # bytes (every save drilled, failed included) and alerts; ingest ended well, the drill did not
        committed: dict[str, float] = {}
        for r in rows:
            committed[r["run"]] = committed.get(r["run"], 0.0) + float(r["bytes"])
        assert _by_run(prom.query("ckptvault_ingest_bytes_total")) == committed
        assert [float(r["value"][1]) for r in prom.query("ckptvault_drill_bytes_total")] == [sum(committed.values())]
        assert float(prom.query("ckptvault_drill_seconds_total")[0]["value"][1]) > 0
        assert _by_run(prom.query("ckptvault_alerts_sent_total"), "kind")["drill_failed"] >= 1
        succeeded = _by_run(prom.query("ckptvault_flow_last_success_timestamp_seconds"), "flow")
        assert succeeded.keys() == {"ingest"} and 0 < time.time() - succeeded["ingest"] < 600

        # the Grafana dashboard's every query (tests/infra/test_grafana_dashboard.py), the run variable
        # at All: valid PromQL, and an answer but where this config has nothing to say
        dashboard = json.loads(DASHBOARD.read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
        assert len(exprs) >= 10
        prom.wait_for("count_over_time(ckptvault_catalog_up[1m]) >= 2")  # rate() needs two scrapes
        for expr in exprs:
            got = prom.query(expr.replace("$run", ".*"))
            assert got or metric_names(expr) <= NOTHING_HERE, expr

        # the rules as shipped, evaluated by Prometheus itself: the failed drill fires at once
        firing = prom.wait_for('ALERTS{alertstate="firing"}')
        assert {(a["metric"]["alertname"], a["metric"]["run"]) for a in firing} == {("CkptvaultDrillFailed", "b")}
    finally:
        server.shutdown()
