"""infra/grafana/ckptvault.json, the Grafana dashboard (docs/metrics.md "Grafana"): every PromQL expression
names only series ckptvault/observe/metrics.py exports (tests/promql.py), the per-run panels follow the `run`
template variable, the panels the issue asks for are there, and the layout is one Grafana can place.
tests/integration/test_prometheus_scrape.py runs every expression on a real Prometheus too."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.promql import exported_names, metric_names, names_with_label

DASHBOARD = Path(__file__).resolve().parents[2] / "infra" / "grafana" / "ckptvault.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def load() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested ones included (a collapsed row holds its panels)."""
    for p in doc["panels"]:
        yield p
        yield from p.get("panels", [])


def expressions(doc: dict[str, Any]) -> list[str]:
    """Every panel target's expr."""
    return [t["expr"] for p in panels(doc) for t in p.get("targets", [])]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))", {"x_bucket"}),
        ('time() - a{run=~"$run", class="b c"} > on(run) group_left b', {"a", "b"}),
        ("sum without (class) (c) offset 1h and bool d", {"c", "d"}),
        ("1e3 * d + 0x1f - ns:e_total", {"d", "ns:e_total"}),
        ("label_values(e{run!=''}, run)", {"e"}),
        ('max_over_time(f[${__range}:1m]) unless on() absent(g{job="x"})', {"f", "g"}),
    ],
)
def test_metric_names_reads_the_series_an_expression_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_every_expression_names_only_exported_series() -> None:
    exported = exported_names()
    doc = load()
    exprs = expressions(doc) + [v["query"]["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    assert len(exprs) >= 10
    for expr in exprs:
        named = metric_names(expr)
        assert named and named <= exported, (expr, named - exported)
    # the panels: per run the newest archived age, the lag, bytes per class, drills, cost
    read = set().union(*(metric_names(e) for e in exprs))
    assert {
        "ckptvault_run_newest_verified_timestamp_seconds", "ckptvault_run_newest_archive_lag_seconds",
        "ckptvault_archive_lag_seconds_bucket", "ckptvault_class_bytes", "ckptvault_class_stored_bytes",
        "ckptvault_run_last_drill_success", "ckptvault_run_last_drill_timestamp_seconds",
        "ckptvault_class_monthly_cost_usd",
    } <= read  # fmt: skip


def test_per_run_panels_follow_the_run_variable() -> None:
    doc = load()
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    run = variables["run"]
    assert run["type"] == "query" and run["multi"] and run["includeAll"] and run["allValue"] == ".*"
    assert re.fullmatch(r"label_values\(\w+, run\)", run["query"]["query"])
    assert metric_names(run["query"]["query"]) <= names_with_label("run")
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    per_run = names_with_label("run")
    assert per_run
    followed = [e for e in expressions(doc) if metric_names(e) & per_run]
    assert followed
    for expr in followed:
        # every per-run series selected by the variable (a regex match: `All` is .*, several runs a|b)
        selectors = re.findall(r"(ckptvault_\w+)(\{[^}]*\})?", expr)
        for name, matchers in selectors:
            if name in per_run:
                assert 'run=~"$run"' in matchers, expr


def test_panels_are_placeable_and_read_the_chosen_datasource() -> None:
    doc = load()
    assert doc["uid"] == "ckptvault" and doc["title"] == "ckptvault" and isinstance(doc["schemaVersion"], int)
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels(doc):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["title"] and p.get("description"), p
        assert p["datasource"] == DATASOURCE, p["title"]
        targets = p["targets"]
        assert targets and all(t["datasource"] == DATASOURCE for t in targets), p["title"]
        assert len({t["refId"] for t in targets}) == len(targets), p["title"]
