"""infra/k8s: every manifest parses, has the kinds we expect, mounts the hot tier read-only into the flow-run
jobs, takes credentials from a Secret only, and holds no literal secret; the Dask cluster's port, address and
node resources agree with the config and with ckptvault's node placement."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.helpers import require_tool

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
TEMPLATE = K8S / "base-job-template.json"
POOL = "ckptvault-k8s"

EXPECTED_KINDS = {
    "namespace.yaml": ["Namespace"],
    "worker-rbac.yaml": ["ServiceAccount", "Role", "RoleBinding"],
    "flow-serviceaccount.yaml": ["ServiceAccount"],
    "hot-tier.yaml": ["PersistentVolume", "PersistentVolumeClaim"],
    "config.yaml": ["ConfigMap", "ConfigMap"],
    "worker.yaml": ["Deployment", "Job"],
    "dask.yaml": ["Deployment", "Service", "Deployment", "Deployment"],
    "secret.example.yaml": ["Secret"],
    "kustomization.yaml": ["Kustomization"],
}

SECRET_NAME = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|AUTH|WEBHOOK)", re.I)
SECRET_VALUE = [
    re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bxox[abposr]-[0-9A-Za-z-]{10,}"),  # Slack token
    re.compile(r"hooks\.slack\.com/services/\w+"),  # Slack webhook URL
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"(?i)aws_secret_access_key\s*[=:]\s*['\"]?[A-Za-z0-9/+]{40}"),
]


def manifests() -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(K8S.iterdir()):
        if path.suffix in (".yaml", ".yml"):
            out[path.name] = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return out


def template() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text())  # JSON is YAML: the same loader
    return doc


def walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    if doc.get("kind") in ("Deployment", "Job"):
        return [spec["template"]["spec"]]
    return []


def rendered_job() -> dict[str, Any]:
    """The Job the Kubernetes worker would create, rendered with Prefect's own templating from the
    template's variable defaults (plus what Prefect fills in at run time)."""
    from prefect.utilities.templating import apply_values

    tpl = template()
    values = {k: v["default"] for k, v in tpl["variables"]["properties"].items() if "default" in v}
    values |= {"name": "ingest-run", "command": "prefect flow-run execute", "labels": {"a": "b"}}
    config = apply_values(tpl["job_configuration"], values)
    job: dict[str, Any] = config["job_manifest"]
    return job


def test_every_manifest_parses_with_the_expected_kinds() -> None:
    found = {name: [d["kind"] for d in docs] for name, docs in manifests().items()}
    assert found == EXPECTED_KINDS
    for name, docs in manifests().items():
        for d in docs:
            assert d.get("apiVersion"), f"{name}: {d['kind']} without apiVersion"
            assert d.get("metadata", {}).get("name") or d["kind"] == "Kustomization", f"{name}: unnamed {d['kind']}"
    assert template()["job_configuration"]["job_manifest"]["kind"] == "Job"


def test_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    kust = manifests()["kustomization.yaml"][0]
    listed = set(kust["resources"])
    assert listed == set(EXPECTED_KINDS) - {"kustomization.yaml", "secret.example.yaml"}
    assert all((K8S / r).is_file() for r in listed)
    assert kust["configMapGenerator"] == [{"name": "ckptvault-work-pool", "files": ["base-job-template.json"]}]


def test_every_template_placeholder_is_a_declared_variable() -> None:
    tpl = template()
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", json.dumps(tpl["job_configuration"])))
    declared = set(tpl["variables"]["properties"])
    assert used <= declared, f"undeclared: {sorted(used - declared)}"


def test_the_hot_tier_is_mounted_read_only_into_flow_run_jobs() -> None:
    job = rendered_job()
    spec = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    hot = [
        name for name, v in volumes.items() if v.get("persistentVolumeClaim", {}).get("claimName") == "ckptvault-hot"
    ]
    assert hot == ["hot-tier"]
    assert volumes["hot-tier"]["persistentVolumeClaim"]["readOnly"] is True
    (container,) = spec["containers"]
    mounts = [m for m in container["volumeMounts"] if m["name"] == "hot-tier"]
    assert mounts == [{"name": "hot-tier", "mountPath": "/hot", "readOnly": True}]
    # ...and every mount of the claim anywhere is read-only, and the volume itself only offers ReadOnlyMany
    for docs in manifests().values():
        for d in docs:
            if d["kind"] in ("PersistentVolume", "PersistentVolumeClaim"):
                assert d["spec"]["accessModes"] == ["ReadOnlyMany"], d["metadata"]["name"]
            for ps in pod_specs(d):
                claims = {v["name"] for v in ps.get("volumes", []) if "persistentVolumeClaim" in v}
                for c in ps["containers"]:
                    for m in c.get("volumeMounts", []):
                        assert m["name"] not in claims or m.get("readOnly") is True, m
    # the config's sources live on that mount
    toml = next(d for d in manifests()["config.yaml"] if d["metadata"]["name"] == "ckptvault-config")
    assert 'path = "/hot/' in toml["data"]["ckptvault.toml"]


def test_credentials_come_from_the_secret_or_the_service_account() -> None:
    job = rendered_job()
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "ckptvault-flow"
    (container,) = spec["containers"]
    assert {"secretRef": {"name": "ckptvault-credentials", "optional": True}} in container["envFrom"]
    sa = manifests()["flow-serviceaccount.yaml"][0]
    assert "eks.amazonaws.com/role-arn" in sa["metadata"]["annotations"]  # IRSA
    secret = manifests()["secret.example.yaml"][0]
    assert {"CKPTVAULT_SLACK_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret["stringData"])


def test_no_literal_secrets() -> None:
    docs = [d for ds in manifests().values() for d in ds] + [template()]
    for d in docs:
        if d.get("kind") == "Secret":
            for k, v in {**d.get("data", {}), **d.get("stringData", {})}.items():
                assert v in ("", None), f"Secret {d['metadata']['name']} holds a value for {k}"
        for node in walk(d):
            # an env entry that looks secret must come from a secretKeyRef, never a literal value
            if not (isinstance(node, dict) and "name" in node and ("value" in node or "valueFrom" in node)):
                continue
            name = str(node["name"])
            if SECRET_NAME.search(name) and not name.endswith(("_HOST", "_PORT")):
                assert "value" not in node, f"literal value for {name}"
                assert "secretKeyRef" in node["valueFrom"], node
        if d.get("kind") == "ConfigMap":
            assert not [k for k in d.get("data", {}) if SECRET_NAME.search(k)], "a secret-looking ConfigMap key"
    for path in K8S.iterdir():
        text = path.read_text()
        for pattern in SECRET_VALUE:
            assert not pattern.search(text), f"{path.name}: looks like a credential ({pattern.pattern})"


def test_worker_and_pool_job_agree_on_the_pool() -> None:
    deployment, pool_job = manifests()["worker.yaml"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["prefect", "worker", "start"]
    assert args[args.index("--pool") + 1] == POOL and args[args.index("--type") + 1] == "kubernetes"
    create = pool_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert create[:4] == ["prefect", "work-pool", "create", POOL]
    assert create[create.index("--base-job-template") + 1] == "/etc/ckptvault-pool/base-job-template.json"


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_dask_cluster_agrees_with_the_config_and_the_node_placement() -> None:
    """The scheduler's port, its Service and the config's dask_address name one address; every worker
    dials it; a node-local worker's resource is the name ckptvault pins that node's work to."""
    from ckptvault.config import parse_config
    from ckptvault.transfer.placement import Placement, missing_workers

    docs = {(d["kind"], d["metadata"]["name"]): d for d in manifests()["dask.yaml"]}
    scheduler = docs[("Deployment", "dask-scheduler")]["spec"]["template"]["spec"]["containers"][0]
    (port,) = docs[("Service", "dask-scheduler")]["spec"]["ports"]
    (container_port,) = scheduler["ports"]
    assert int(_arg(scheduler["args"], "--port")) == port["port"] == container_port["containerPort"] == 8786
    assert port["targetPort"] == container_port["name"]
    toml = next(d for d in manifests()["config.yaml"] if d["metadata"]["name"] == "ckptvault-config")
    address = parse_config(toml["data"]["ckptvault.toml"]).scale.dask_address
    assert address == f"tcp://dask-scheduler.ckptvault.svc.cluster.local:{port['port']}"

    workers = {name: d for (kind, name), d in docs.items() if kind == "Deployment" and name != "dask-scheduler"}
    assert set(workers) == {"dask-worker", "dask-worker-node-0"}
    for name, d in workers.items():
        spec = d["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert c["args"][:3] == ["dask", "worker", address], name
        assert int(_arg(c["args"], "--nworkers")) >= 1 and _arg(c["args"], "--nthreads") == "1", name
        assert {"configMapRef": {"name": "ckptvault-env"}} in c["envFrom"], name  # PREFECT_API_URL
    assert "--resources" not in workers["dask-worker"]["spec"]["template"]["spec"]["containers"][0]["args"]

    spec = workers["dask-worker-node-0"]["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    resource, amount = _arg(c["args"], "--resources").split("=")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    assert resource == Placement.name(0) == env["CKPTVAULT_NODE"] == spec["nodeSelector"]["ckptvault.io/node"]
    assert missing_workers(Placement(1, r"__(?P<rank>\d+)_", 1), [{resource: float(amount)}]) == []
    assert float(amount) == 1  # one task per worker process, as OPERATIONS.md sizes it


def test_kustomize_builds_offline() -> None:
    kubectl = require_tool("kubectl", "apt-get install kubernetes-client (Debian's; .ci/run does when it is missing)")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(kinds) == sorted(
        ["Namespace", "ServiceAccount", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "ConfigMap",
         "ConfigMap", "PersistentVolume", "PersistentVolumeClaim", "Deployment", "Job",
         "Deployment", "Service", "Deployment", "Deployment"]
    )  # fmt: skip
    assert "kind: Secret" not in out.stdout
