"""The list of flows (ckptvault_prefect/deployments/flow_list.py) against what it describes and what is
rendered from it: the deployments of prefect.yaml (names, schedules, event triggers), `ckptvault serve
--help` (from the list, with Prefect not imported), and the links of the README's generated table. That the
README's and the site's tables are the list's current rendering: test_docs_reference.py."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckptvault_prefect.deployments import flow_list
from ckptvault_prefect.deployments.flow_list import FLOWS, FlowDoc

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = ROOT / "ckptvault_prefect" / "deployments" / "prefect.yaml"


@pytest.fixture(scope="module")
def deployments() -> dict[str, dict[str, Any]]:
    specs = yaml.safe_load(PREFECT_YAML.read_text(encoding="utf-8"))["deployments"]
    return {spec["name"]: spec for spec in specs}


def mismatches(flows: tuple[FlowDoc, ...], deployments: dict[str, dict[str, Any]]) -> list[str]:
    """Where the list and prefect.yaml's deployments disagree: a name, a schedule, an event trigger."""
    names = [f.name for f in flows]
    out = [f"{n}: listed twice" for n in sorted({n for n in names if names.count(n) > 1})]
    out += [f"{n}: not in the list" for n in sorted(set(deployments) - set(names))]
    out += [f"{n}: not in prefect.yaml" for n in sorted(set(names) - set(deployments))]
    for f in flows:
        spec = deployments.get(f.name)
        if spec is None:
            continue
        if f.schedules() != (spec.get("schedules") or []):
            out.append(f"{f.name}: schedules {f.schedules()} in the list, {spec.get('schedules')} in prefect.yaml")
        events = [e for t in spec.get("triggers") or [] for e in t.get("expect", [])]
        if events != ([f.event] if f.event else []):
            out.append(f"{f.name}: event {f.event} in the list, {events} in prefect.yaml")
    return out


def test_the_list_is_prefect_yamls_deployments(deployments: dict[str, dict[str, Any]]) -> None:
    assert len(FLOWS) == 7
    assert mismatches(FLOWS, deployments) == []


def test_a_difference_from_prefect_yaml_is_found(deployments: dict[str, dict[str, Any]]) -> None:
    changed = copy.deepcopy(deployments)
    changed["tier"]["schedules"] = [{"cron": "30 2 * * *", "timezone": "UTC"}]
    changed["replicate"]["schedules"] = [{"interval": 1800}]
    del changed["ingest"]["triggers"]
    changed["compact"] = {"name": "compact", "schedules": []}
    found = mismatches(FLOWS, changed)
    assert [m.split(":")[0] for m in found] == ["compact", "ingest", "tier", "replicate"], found
    assert mismatches((*FLOWS, FLOWS[0]), deployments) == ["ingest: listed twice"]


@pytest.mark.parametrize(
    ("flow", "words"),
    [
        (FlowDoc("a", "x", interval_s=600), "every 10 minutes"),
        (FlowDoc("a", "x", interval_s=3600), "hourly"),
        (FlowDoc("a", "x", interval_s=7200), "every 2 hours"),
        (FlowDoc("a", "x", interval_s=86400), "daily"),
        (FlowDoc("a", "x", cron="30 3 * * *"), "daily at 03:30 UTC"),
        (FlowDoc("a", "x", cron="0 5 * * 0"), "weekly, Sundays at 05:00 UTC"),
        (FlowDoc("a", "x", cron="15 22 * * 7"), "weekly, Sundays at 22:15 UTC"),
        (FlowDoc("a", "x"), "on demand"),
    ],
)
def test_when_in_words(flow: FlowDoc, words: str) -> None:
    assert flow.when() == words


@pytest.mark.parametrize("cron", ["*/5 * * * *", "0 5 1 * *", "0 5 * * 1-5"])
def test_a_schedule_without_words_is_refused(cron: str) -> None:
    with pytest.raises(ValueError, match="no words for the schedule"):
        FlowDoc("a", "x", cron=cron).when()


def test_links_follow_the_text_they_go_in() -> None:
    replicate = next(f for f in FLOWS if f.name == "replicate")
    assert "([Replicas](replicas.md))" in replicate.what_it_does("")
    assert "([Replicas](docs/replicas.md))" in replicate.what_it_does("docs/")
    plain = replicate.what_it_does(None)
    assert plain.endswith("its manifest last (docs/replicas.md)") and "](" not in plain
    ingest = next(f for f in FLOWS if f.name == "ingest")
    assert ingest.when(None) == "every 10 minutes, and seconds after each save a framework hook reports"


def test_serve_help_is_the_list_and_imports_no_prefect() -> None:
    code = (
        "import contextlib, io, json, sys\n"
        "from ckptvault_cli.parser import build_parser\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    build_parser().parse_args(['serve', '--help'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('prefect'))\n"
        "print(json.dumps({'help': out.getvalue(), 'prefect': loaded}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["prefect"] == [], got["prefect"][:10]
    help_text: str = got["help"]
    assert flow_list.serve_description() in help_text
    for f in FLOWS:  # each flow's line: its name, then when it runs
        assert re.search(rf"^  {f.name} +{re.escape(f.when(None).split()[0])}", help_text, re.M), (f.name, help_text)
    assert f"Serves the {len(FLOWS)} deployments" in help_text


def test_the_readme_tables_links_lead_to_files() -> None:
    """docs/index.md's links are checked by `mkdocs build --strict`; the README's only here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("<!-- flows:")
    block = readme[start : readme.index("<!-- /flows -->", start)]
    links = re.findall(r"\]\(([^)#\s]+)", block)
    assert "docs/replicas.md" in links and "docs/hooks.md" in links, links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing
