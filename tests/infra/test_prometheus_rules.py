"""infra/prometheus/ckptvault-rules.yml: valid for Prometheus (`promtool check rules`), each alert firing
when it should in `promtool test rules` (ckptvault-rules.test.yml: CkptvaultRunStale for a run that
stopped, not for one that trains or one nobody watches), every metric an expression names exported by
ckptvault/observe/metrics.py (tests/promql.py), and a runbook line on every alert. promtool is Debian's
`prometheus` package; missing it fails in CI (tests/helpers.py require_tool)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.helpers import require_tool
from tests.promql import exported_names, metric_names

RULES_DIR = Path(__file__).resolve().parents[2] / "infra" / "prometheus"
RULES = RULES_DIR / "ckptvault-rules.yml"
INSTALL = "apt-get install prometheus (Debian's; infra/ci/check-tools.sh --install does)"


def _alerts() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_and_tests_the_rules() -> None:
    promtool = require_tool("promtool", INSTALL)
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in out.stdout
    out = subprocess.run(
        [promtool, "test", "rules", "ckptvault-rules.test.yml"],
        cwd=RULES_DIR, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    tested = set(re.findall(r"alertname: (\w+)", (RULES_DIR / "ckptvault-rules.test.yml").read_text()))
    assert tested == {str(a["alert"]) for a in _alerts()}  # every alert has a test case


def test_every_rule_names_only_exported_metrics_and_has_a_runbook() -> None:
    exported = exported_names()
    alerts = _alerts()
    assert "CkptvaultRunStale" in {a["alert"] for a in alerts}
    for a in alerts:
        named = metric_names(str(a["expr"]))  # every series, not only ckptvault_ ones: a typo is caught too
        assert named and named <= exported, (a["alert"], named - exported)
        annotations = a["annotations"]
        assert isinstance(annotations, dict) and annotations.get("runbook") and annotations.get("summary"), a["alert"]
