"""checkov over infra/ (the Kubernetes manifests, the Dockerfile, the Terraform): no failed check. A check
that does not apply to ckptvault is skipped inline, next to what it flags, with its reason (checkov's
`checkov.io/skipN` annotation, `# checkov:skip=ID:reason` comment); a skip without a reason fails here.

checkov is not in .venv (its pins would downgrade boto3 and botocore): it is `checkov` on PATH or
$CKPTVAULT_CHECKOV; infra/ci/check-tools.sh --install puts it in a virtualenv of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import missing_tool

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
FRAMEWORKS = ("kubernetes", "dockerfile", "terraform")
INSTALL = "bash infra/ci/check-tools.sh --install (its own virtualenv, checkov==3.3.30), or set CKPTVAULT_CHECKOV"


@pytest.fixture(scope="module")
def checkov() -> str:
    exe = os.environ.get("CKPTVAULT_CHECKOV") or shutil.which("checkov")
    if not exe or not os.access(exe, os.X_OK):
        missing_tool(f"checkov is not installed (not on PATH, nor at $CKPTVAULT_CHECKOV): {INSTALL}")
    return exe


def run_checkov(exe: str, *target: str, frameworks: tuple[str, ...] = FRAMEWORKS) -> dict[str, dict[str, Any]]:
    """checkov's JSON report, one entry per framework. --skip-download: no Prisma Cloud account, and the
    CI machine may have no network; the built-in checks are all we run."""
    proc = subprocess.run(
        [exe, *target, "--framework", *frameworks, "--output", "json", "--skip-download"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    # exit 1 is "some check failed"; anything else is checkov itself failing
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]  # one framework: a single object
    return {r["check_type"]: r for r in reports}


def describe(check: dict[str, Any]) -> str:
    first, last = check.get("file_line_range") or ["?", "?"]
    where = f"{check['repo_file_path']}:{first}-{last}"
    return f"{check['check_id']} {check['resource']} ({where}): {check['check_name']}"


def test_infra_passes_checkov_with_every_skip_explained(checkov: str) -> None:
    reports = run_checkov(checkov, "--directory", "infra")
    assert set(reports) == set(FRAMEWORKS), sorted(reports)  # each framework found something to scan
    failed, unexplained = [], []
    for framework, report in reports.items():
        summary = report["summary"]
        assert summary["parsing_errors"] == 0, (framework, summary)
        assert summary["passed"] > 0 and summary["resource_count"] > 0, (framework, summary)
        failed += [describe(c) for c in report["results"]["failed_checks"]]
        for c in report["results"]["skipped_checks"]:
            reason = (c["check_result"].get("suppress_comment") or "").strip()
            if not reason or reason.lower() == "no comment provided":
                unexplained.append(describe(c))
    print("\n".join(["checkov failures:", *failed]) if failed else "checkov: no failure")
    assert not failed, "checkov failed checks (fix them, or skip inline with the reason):\n" + "\n".join(failed)
    assert not unexplained, "skipped without a reason:\n" + "\n".join(unexplained)


def test_the_inline_skips_are_what_silences_the_checks(checkov: str, tmp_path: Path) -> None:
    """The same Dockerfile and worker manifests with their skips taken out fail the checks they name,
    so the test above passes because of the reasoned skips, not because checkov scanned nothing."""
    docker = [ln for ln in (INFRA / "k8s" / "Dockerfile").read_text().splitlines() if "checkov:skip=" not in ln]
    (tmp_path / "Dockerfile").write_text("\n".join(docker) + "\n")
    worker = [ln for ln in (INFRA / "k8s" / "worker.yaml").read_text().splitlines() if "checkov.io/skip" not in ln]
    (tmp_path / "worker.yaml").write_text("\n".join(ln for ln in worker if not ln.strip().startswith("annotations:")))
    reports = run_checkov(checkov, "--directory", str(tmp_path), frameworks=("kubernetes", "dockerfile"))
    failed = {c["check_id"] for r in reports.values() for c in r["results"]["failed_checks"]}
    assert {"CKV_DOCKER_2", "CKV_K8S_14", "CKV_K8S_43", "CKV_K8S_38", "CKV_K8S_35"} <= failed, sorted(failed)
