"""infra/k8s: every manifest parses, has the kinds we expect, mounts the hot tier read-only into the flow-run
jobs, takes credentials from a Secret only, and holds no literal secret; the Dask cluster's port, address and
node resources agree with the config and with ckptvault's node placement, and it speaks TLS only, with the
certificates of a read-only Secret (the flow pods the client pair)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import missing_tool, require_tool

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
TEMPLATE = K8S / "base-job-template.json"
DASK = K8S / "components" / "dask"
K8S_VERSION = "1.32"  # the namespace's Pod Security enforce-version, and the schemas the objects must pass
POOL = "ckptvault-k8s"
DASK_TLS_VAR = "DASK_DISTRIBUTED__COMM__TLS__"
DASK_TLS_DIR = "/etc/dask-tls"  # where the Secret ckptvault-dask-tls is mounted, in Dask pods and flow pods
DASK_TLS_SECRET = "ckptvault-dask-tls"

EXPECTED_KINDS = {
    "namespace.yaml": ["Namespace"],
    "worker-rbac.yaml": ["ServiceAccount", "Role", "RoleBinding"],
    "flow-serviceaccounts.yaml": ["ServiceAccount", "ServiceAccount"],
    "hot-tier.yaml": ["PersistentVolume", "PersistentVolumeClaim"],
    "restore.yaml": ["PersistentVolumeClaim"],
    "config.yaml": ["ConfigMap", "ConfigMap"],
    "worker.yaml": ["Deployment", "Deployment", "Job", "NetworkPolicy"],
    "secret.example.yaml": ["Secret"],
    "kustomization.yaml": ["Kustomization"],
}
# Not Kubernetes objects: kustomize's transformer configuration and the Kubernetes pool's deployments
NOT_MANIFESTS = {"images-config.yaml", "prefect.yaml"}
RESTORE_CLAIM = "ckptvault-restore"
ROLES = {"ingest": "ckptvault-ingest", "tier": "ckptvault-tier"}  # infra/terraform's IRSA trust names these

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
        if path.suffix in (".yaml", ".yml") and path.name not in NOT_MANIFESTS:
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


def rendered_job(job_variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Job the Kubernetes worker would create, rendered with Prefect's own templating from the
    template's variable defaults (plus what Prefect fills in at run time)."""
    from prefect.utilities.templating import apply_values

    tpl = template()
    values = {k: v["default"] for k, v in tpl["variables"]["properties"].items() if "default" in v}
    values |= {"name": "ingest-run", "command": "prefect flow-run execute", "labels": {"a": "b"}}
    values |= job_variables or {}
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
    assert kust["configurations"] == ["images-config.yaml"]


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
                writable = d["metadata"]["name"] == RESTORE_CLAIM  # restores' destination: see the test below
                assert d["spec"]["accessModes"] == ["ReadWriteMany" if writable else "ReadOnlyMany"], d["metadata"]
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
    assert spec["serviceAccountName"] == "ckptvault-ingest"  # the role that cannot delete, unless a deployment says
    (container,) = spec["containers"]
    assert {"secretRef": {"name": "ckptvault-credentials", "optional": True}} in container["envFrom"]
    secret = manifests()["secret.example.yaml"][0]
    assert {"CKPTVAULT_SLACK_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret["stringData"])


def test_no_literal_secrets() -> None:
    component = [d for p in sorted(DASK.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    docs = [d for ds in manifests().values() for d in ds] + [template()] + component
    for d in docs:
        if d.get("kind") == "Secret":
            for k, v in {**d.get("data", {}), **d.get("stringData", {})}.items():
                assert v in ("", None), f"Secret {d['metadata']['name']} holds a value for {k}"
        for node in walk(d):
            # an env entry that looks secret must come from a secretKeyRef, never a literal value
            if not (isinstance(node, dict) and "name" in node and ("value" in node or "valueFrom" in node)):
                continue
            name = str(node["name"])
            if SECRET_NAME.search(name) and not name.endswith(("_HOST", "_PORT")) and not _tls_path(name, node):
                assert "value" not in node, f"literal value for {name}"
                assert "secretKeyRef" in node["valueFrom"], node
        if d.get("kind") == "ConfigMap":
            data = d.get("data", {})
            secret_looking = [k for k in data if SECRET_NAME.search(k) and not _tls_path(k, {"value": data[k]})]
            assert not secret_looking, "a secret-looking ConfigMap key"
    for path in K8S.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text()
        for pattern in SECRET_VALUE:
            assert not pattern.search(text), f"{path.name}: looks like a credential ({pattern.pattern})"


def _tls_path(name: str, node: dict[str, Any]) -> bool:
    """A Dask TLS setting whose value is the path of a file in the mounted Secret, not the key itself."""
    return name.startswith(DASK_TLS_VAR) and str(node.get("value", "")).startswith(DASK_TLS_DIR + "/")


def test_worker_and_pool_job_agree_on_the_pool() -> None:
    *workers, pool_job, _policy = manifests()["worker.yaml"]
    for w in workers:
        args = w["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:3] == ["prefect", "worker", "start"]
        assert _arg(args, "--pool") == POOL and _arg(args, "--type") == "kubernetes"
    (script,) = pool_job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"prefect work-pool create {POOL} --type kubernetes --base-job-template /tmp/template.json" in script
    assert "/etc/ckptvault-pool/base-job-template.json" in script


def test_two_workers_two_queues_two_service_accounts() -> None:
    """One worker per role's queue, each polling only its own (a worker without --work-queue polls every
    queue, and would run tier's deletes as whichever role it has); one service account per role, named as
    the Terraform trust policies name them; the tier deployment alone runs as the tier role."""
    *workers, _job, _policy = manifests()["worker.yaml"]
    queues = {w["metadata"]["name"]: _arg(w["spec"]["template"]["spec"]["containers"][0]["args"], "--work-queue")
              for w in workers}  # fmt: skip
    assert queues == {"ckptvault-worker": "default", "ckptvault-worker-tier": "tier"}
    for w in workers:  # the workers only create Jobs: no store role on them
        assert w["spec"]["template"]["spec"]["serviceAccountName"] == "ckptvault-worker"

    sas = {d["metadata"]["name"]: d for d in manifests()["flow-serviceaccounts.yaml"]}
    assert set(sas) == set(ROLES.values())
    for role, name in ROLES.items():
        assert sas[name]["metadata"]["namespace"] == "ckptvault"
        assert sas[name]["metadata"]["labels"]["ckptvault.io/role"] == role
        assert sas[name]["automountServiceAccountToken"] is False

    # the pool's template may run as either role and nothing else, the ingest one by default
    prop = template()["variables"]["properties"]["service_account_name"]
    assert prop["default"] == ROLES["ingest"] and sorted(prop["enum"]) == sorted(ROLES.values())
    assert rendered_job({"service_account_name": ROLES["tier"]})["spec"]["template"]["spec"][
        "serviceAccountName"] == ROLES["tier"]  # fmt: skip

    k8s = {d["name"]: d for d in yaml.safe_load((K8S / "prefect.yaml").read_text())["deployments"]}
    for name, d in k8s.items():
        pool = d["work_pool"]
        role = "tier" if name == "tier" else "ingest"
        assert pool["name"] == POOL, name
        assert pool["work_queue_name"] == ("tier" if role == "tier" else "default"), name
        assert pool["job_variables"]["service_account_name"] == ROLES[role], name
        assert pool["job_variables"]["service_account_name"] in prop["enum"]


def test_the_kubernetes_deployments_are_the_process_pools_but_for_the_pool() -> None:
    """infra/k8s/prefect.yaml repeats the seven deployments for the Kubernetes pool: everything but
    work_pool must equal ckptvault_prefect/deployments/prefect.yaml's, so schedules cannot drift apart."""
    process = yaml.safe_load((ROOT / "ckptvault_prefect" / "deployments" / "prefect.yaml").read_text())
    k8s = yaml.safe_load((K8S / "prefect.yaml").read_text())
    assert k8s["pull"] == process["pull"] and k8s["prefect-version"] == process["prefect-version"]
    assert k8s["build"] is None and k8s["push"] is None  # the code is in the image
    strip = [{k: v for k, v in d.items() if k != "work_pool"} for d in process["deployments"]]
    assert [{k: v for k, v in d.items() if k != "work_pool"} for d in k8s["deployments"]] == strip
    env = next(d for d in manifests()["config.yaml"] if d["metadata"]["name"] == "ckptvault-env")["data"]
    assert env["CKPTVAULT_HOME"] == "/opt/ckptvault"  # the pull step's directory: the Dockerfile's WORKDIR
    assert "WORKDIR /opt/ckptvault" in (K8S / "Dockerfile").read_text()


def test_irsa_role_arns_are_set_in_one_place() -> None:
    """Each role's service account gets its IAM role from kustomization.yaml's patches (the one place to
    put the real ARNs), and the rendered objects carry them: the ingest role's ARN on the ingest SA."""
    for path in K8S.rglob("*.yaml"):
        code = [line.split("#")[0] for line in path.read_text().splitlines()]
        if path != K8S / "kustomization.yaml":
            assert not [c for c in code if "eks.amazonaws.com/role-arn" in c], path
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in kustomize(K8S)}
    for name in ROLES.values():
        arn = rendered[("ServiceAccount", name)]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
        assert re.fullmatch(rf"arn:aws:iam::\d{{12}}:role/{name}", arn), arn


def test_the_config_lets_only_tier_delete() -> None:
    from ckptvault.config import parse_config

    toml = next(d for d in manifests()["config.yaml"] if d["metadata"]["name"] == "ckptvault-config")
    store = parse_config(toml["data"]["ckptvault.toml"]).store
    assert (store.deletes, store.lifecycle) == ("tier-only", "external")  # the ingest role may not write either


def k8s_deployments() -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in yaml.safe_load((K8S / "prefect.yaml").read_text())["deployments"]}


def gpu_drill_variables() -> dict[str, Any]:
    """The job variables of infra/k8s/prefect.yaml's gpu_drill_pool, the drill deployment's pool on GPU nodes."""
    pool: dict[str, Any] = yaml.safe_load((K8S / "prefect.yaml").read_text())["definitions"]["gpu_drill_pool"]
    assert pool["name"] == POOL and pool["work_queue_name"] == "default"  # polled by ckptvault-worker
    return dict(pool["job_variables"])


def test_the_gpu_drill_pool_puts_the_drill_on_a_gpu_node() -> None:
    """gpu_drill_pool's flow-run pod asks for one GPU (nvidia.com/gpu), is placed on a GPU node (its
    nodeSelector and the GPU taint's toleration) and runs as the ingest role; the template's defaults, and
    every shipped deployment, ask for none. Its variables pass the pool's schema, which refuses 0 GPUs.
    The process pool's gpu_pool (ckptvault_prefect/deployments/prefect.yaml) is a pool of its own."""
    import jsonschema

    schema = template()["variables"]
    variables = gpu_drill_variables()
    jsonschema.validate(variables, schema)
    pod = rendered_job(variables)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["serviceAccountName"] == ROLES["ingest"]
    for variables in [{}, *(dict(d["work_pool"]["job_variables"]) for d in k8s_deployments().values())]:
        pod = rendered_job(variables)["spec"]["template"]["spec"]
        assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
        assert "nodeSelector" not in pod and "tolerations" not in pod
    for bad in ({"gpu_count": 0}, {"tolerations": [{"key": "x", "operator": "Sometimes"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(gpu_drill_variables() | bad, schema)
    process = yaml.safe_load((ROOT / "ckptvault_prefect" / "deployments" / "prefect.yaml").read_text())
    pools = process["definitions"]
    assert pools["gpu_pool"]["name"] == "ckptvault-gpu" != pools["work_pool"]["name"]
    assert pools["gpu_pool"]["job_variables"] == pools["work_pool"]["job_variables"]


def writable_claims(job: dict[str, Any]) -> dict[str, str]:
    """{claim: mount path} of every PVC the Job's container mounts without readOnly."""
    spec = job["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
    (container,) = spec["containers"]
    return {
        claims[m["name"]]["claimName"]: m["mountPath"]
        for m in container["volumeMounts"]
        if m["name"] in claims and not m.get("readOnly") and not claims[m["name"]].get("readOnly")
    }


def test_only_the_restore_deployment_mounts_a_writable_destination() -> None:
    """The restore deployment's job variables add the writable claim ckptvault-restore at /restore (the
    runbook's dest); every other deployment's Jobs, and the template's defaults, mount no claim writable.
    Its job variables pass the pool's variable schema (what Prefect checks them against), and that schema
    refuses a restore volume that is not a claim, a read-only one, or one mounted over the hot tier."""
    import jsonschema

    schema = template()["variables"]
    assert writable_claims(rendered_job()) == {}
    for name, d in k8s_deployments().items():
        variables = dict(d["work_pool"]["job_variables"])
        jsonschema.validate(variables, schema)
        job = rendered_job(variables)
        hot = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "hot-tier"]
        assert hot[0]["persistentVolumeClaim"]["readOnly"] is True, name
        assert writable_claims(job) == ({RESTORE_CLAIM: "/restore"} if name == "restore" else {}), name
        if name == "restore":
            pod = job["spec"]["template"]["spec"]
            assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]  # the run may write
        else:
            assert "fsGroup" not in job["spec"]["template"]["spec"]["securityContext"], name
    good = k8s_deployments()["restore"]["work_pool"]["job_variables"]
    for bad in (
        {"restore_volume": {"name": "restore", "hostPath": {"path": "/"}}},
        {"restore_volume": {"name": "restore", "persistentVolumeClaim": {"claimName": "x", "readOnly": True}}},
        {"restore_mount": {"name": "restore", "mountPath": "/hot/x"}},
        {"restore_mount": {"name": "restore", "mountPath": "/restore", "readOnly": True}},
        {"run_as_user": 0},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(good | bad, schema)
    # the claim exists, and the runbook's command names this deployment and a dest under the mount
    assert any(d["metadata"]["name"] == RESTORE_CLAIM for d in manifests()["restore.yaml"])
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    assert re.search(r"prefect deployment run restore/restore --param run=\S+ --param dest=/restore/\S+", runbook)


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_dask_cluster_agrees_with_the_config_and_the_node_placement() -> None:
    """The scheduler's port, its Service and the config's dask_address name one address; every worker
    dials it; a node-local worker's resource is the name ckptvault pins that node's work to."""
    from ckptvault.config import parse_config
    from ckptvault.transfer.placement import Placement, missing_workers

    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((DASK / "dask.yaml").read_text())}
    scheduler = docs[("Deployment", "dask-scheduler")]["spec"]["template"]["spec"]["containers"][0]
    (port,) = docs[("Service", "dask-scheduler")]["spec"]["ports"]
    (container_port,) = [p for p in scheduler["ports"] if p["name"] == "dask"]  # and "http", the health probe's
    assert int(_arg(scheduler["args"], "--port")) == port["port"] == container_port["containerPort"] == 8786
    assert port["targetPort"] == container_port["name"]
    toml = next(d for d in manifests()["config.yaml"] if d["metadata"]["name"] == "ckptvault-config")
    address = parse_config(toml["data"]["ckptvault.toml"]).scale.dask_address
    assert address == f"tls://dask-scheduler.ckptvault.svc.cluster.local:{port['port']}"

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
    pv = docs[("PersistentVolume", "ckptvault-node-0-nvme")]["spec"]  # the node's disk, on that node only
    (term,) = pv["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "ckptvault.io/node", "operator": "In", "values": [resource]}]
    assert missing_workers(Placement(1, r"__(?P<rank>\d+)_", 1), [{resource: float(amount)}]) == []
    assert float(amount) == 1  # one task per worker process, as OPERATIONS.md sizes it


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl", "apt-get install kubernetes-client (Debian's; .ci/run does when it is missing)")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kustomize_builds_offline() -> None:
    docs = kustomize(K8S)
    kinds = [d["kind"] for d in docs]
    assert sorted(kinds) == sorted(
        ["Namespace", "ServiceAccount", "ServiceAccount", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
         "ConfigMap", "ConfigMap", "PersistentVolume", "PersistentVolumeClaim", "PersistentVolumeClaim",
         "Deployment", "Deployment", "Job", "NetworkPolicy"]
    )  # fmt: skip
    assert "Secret" not in kinds


def with_dask(tmp_path: Path) -> list[dict[str, Any]]:
    """The base plus the Dask component, through an overlay outside infra/k8s as an operator writes one."""
    rel = Path(os.path.relpath(K8S, tmp_path))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [str(rel)], "components": [str(rel / "components" / "dask")]})
    )
    return kustomize(tmp_path)


def every_object(tmp_path: Path) -> list[dict[str, Any]]:
    """Everything that reaches the cluster: the base with the Dask component, and the Job each
    deployment's flow runs get from the pool's template (the default and the restore one, and the
    drill's on GPU nodes)."""
    jobs = [rendered_job(dict(d["work_pool"]["job_variables"])) for d in k8s_deployments().values()]
    jobs.append(rendered_job(gpu_drill_variables()))  # the drill's on GPU nodes
    image = next(d for d in kustomize(K8S) if d["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]
    flow_image = next(e["value"] for e in image["env"] if e["name"] == "FLOW_IMAGE")
    for job in jobs:  # what the pool Job's sed writes in, and what the worker does before it creates the Job
        job["metadata"]["name"] = "flow-run"
        for c in job["spec"]["template"]["spec"]["containers"]:
            c["image"] = c["image"].replace("@FLOW_IMAGE@", flow_image)
            c["args"] = shlex.split(c["args"])
            c["env"] = [{"name": k, "value": v} for k, v in c["env"].items()]
    return with_dask(tmp_path) + jobs


def test_every_object_passes_the_kubernetes_schema(tmp_path: Path) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        missing_tool("kubernetes-validate is not installed: pip install -e '.[dev]' (pyproject's dev extra)")
    objects = every_object(tmp_path)
    assert len(objects) > 20
    for d in objects:
        # strict: a misspelt or misplaced field fails here instead of being dropped by the API server
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    bad = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automountToken": False}
    with pytest.raises(kubernetes_validate.ValidationError):  # the check can fail
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def pods(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"]] if d["kind"] in ("Deployment", "Job") else []


def test_every_pod_is_hardened(tmp_path: Path) -> None:
    """Pod Security "restricted" and more, pod by pod: non-root, RuntimeDefault seccomp, no escalation, no
    capabilities, a read-only root file system with /tmp an emptyDir, CPU, memory and ephemeral-storage
    requests and limits, no hostPath; every Job with a deadline; the namespace enforcing restricted."""
    objects = every_object(tmp_path)
    (ns,) = [d for d in objects if d["kind"] == "Namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == f"v{K8S_VERSION}"
    checked = 0
    for d in objects:
        for ps in pods(d):
            where = f"{d['kind']} {d['metadata'].get('name')}"
            sc = ps["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            volumes = {v["name"]: v for v in ps.get("volumes", [])}
            assert not [v for v in volumes.values() if "hostPath" in v], where
            for c in ps["containers"]:
                csc = c["securityContext"]
                assert csc["allowPrivilegeEscalation"] is False, where
                assert csc["capabilities"] == {"drop": ["ALL"]}, where
                assert csc["readOnlyRootFilesystem"] is True, where
                tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
                assert len(tmp) == 1 and "emptyDir" in volumes[tmp[0]["name"]], where
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory", "ephemeral-storage"} <= set(c["resources"][kind]), (where, kind)
                checked += 1
        if d["kind"] == "Job":
            assert int(d["spec"]["activeDeadlineSeconds"]) > 0, d["metadata"]["name"]
    assert checked >= 7 + 3  # 2 workers, the pool Job, 3 Dask pods, the flow runs' Jobs


def test_images_are_pinned_and_named_in_one_place(tmp_path: Path) -> None:
    """No `:latest`, no untagged image anywhere rendered; the manifests name images without a tag
    (kustomization.yaml's `images:` alone sets it); the flow runs' image is the Dask pods' image."""
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    pins = {i["name"]: i for i in kust["images"]}
    assert set(pins) == {"ghcr.io/acme/ckptvault", "prefecthq/prefect"}
    for i in pins.values():
        assert i.get("digest") or re.fullmatch(r"\d+\.\d+\.\d+(-[\w.-]+)?", i["newTag"]), i  # a version
    images = []
    for d in every_object(tmp_path):
        for ps in pods(d):
            images += [c["image"] for c in ps["containers"]]
    assert images and len(set(images)) == 2
    for image in images:
        name, _, tag = image.partition("@")[0].rpartition(":")
        assert name in pins and tag and tag != "latest", image
    for path in [*K8S.glob("*.yaml"), *DASK.glob("*.yaml")]:
        if path.name != "kustomization.yaml":
            assert not re.search(r"image: \S+:", path.read_text()), f"{path.name}: a tag outside kustomization.yaml"


def test_only_flow_pods_and_dask_reach_dask(tmp_path: Path) -> None:
    objects = with_dask(tmp_path)
    (policy,) = [d for d in objects if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "dask-ingress"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    dask_pods = [d for d in objects if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("dask-")]
    assert len(dask_pods) == 3
    for d in dask_pods:  # every Dask pod is behind the policy
        assert selected.items() <= d["spec"]["template"]["metadata"]["labels"].items(), d["metadata"]["name"]
    (rule,) = policy["spec"]["ingress"]
    peers = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    assert all(set(p) == {"podSelector"} for p in rule["from"])  # no namespaceSelector or ipBlock: this namespace
    assert peers == [{"ckptvault.io/dask-client": "true"}, selected]
    flow_pod = rendered_job()["spec"]["template"]["metadata"]["labels"]
    assert flow_pod == peers[0]  # the flow runs carry the client label...
    for d in objects:  # ...and no other pod does
        for ps_owner in [d] if d["kind"] in ("Deployment", "Job") else []:
            labels = ps_owner["spec"]["template"].get("metadata", {}).get("labels", {})
            assert "ckptvault.io/dask-client" not in labels, d["metadata"]["name"]


def test_the_image_is_built_pinned_and_non_root() -> None:
    text = (K8S / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", base), base
    assert re.search(r"pip install [^\n]*-c constraints\.txt", text)
    assert re.search(r"^ENV HOME=/tmp\b", text, re.M)
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    assert user.split(":")[0] not in ("0", "root") and user.split(":")[0].isdigit()  # numeric: runAsNonRoot checks it
    pins = [line for line in (K8S / "constraints.txt").read_text().splitlines() if not line.startswith("#")]
    assert all(re.fullmatch(r"[\w.-]+==[\w.+!-]+", p) for p in pins), pins
    names = {p.split("==")[0].lower() for p in pins}
    assert {"prefect", "boto3", "pyarrow", "distributed", "prefect-dask"} <= names
    assert not {"pytest", "ruff", "mypy", "moto"} & names  # run-time dependencies only


def _tls_files(spec: dict[str, Any], container: dict[str, Any]) -> set[str]:
    """The files of the Dask TLS Secret this pod's container sees: its volume mounted read-only, and only
    the keys the volume projects."""
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == DASK_TLS_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == DASK_TLS_SECRET
    assert {i["key"] for i in volume["secret"]["items"]} == {i["path"] for i in volume["secret"]["items"]}
    return {f"{DASK_TLS_DIR}/{i['path']}" for i in volume["secret"]["items"]}


def _security(env: dict[str, str]) -> Any:
    """distributed's Security as a process with these variables builds it (dask's own parsing of
    DASK_* variables): a misspelt name would leave its field None."""
    import dask.config
    from distributed.security import Security

    def dotted(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
        for k, v in tree.items():
            yield from dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    # dotted keys: a nested dict would replace all of `distributed` rather than set these leaves
    with dask.config.set(dict(dotted(dask.config.collect_env(env)))):
        return Security()  # type: ignore[no-untyped-call]


def test_dask_speaks_only_tls_with_the_secrets_certificates(tmp_path: Path) -> None:
    """Rendered with the component: the scheduler listens on tls only; every Dask pod requires encryption
    and names the CA and its node pair in files of the Secret, mounted read-only; every worker and the
    config dial tls://; the flow pods get the client pair (and not the node key) from the same Secret and
    their settings from the component's ConfigMap, which the base template reads optionally."""
    objects = with_dask(tmp_path)
    config = next(d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ckptvault-config")
    from ckptvault.config import parse_config

    address = parse_config(config["data"]["ckptvault.toml"]).scale.dask_address
    assert address is not None and address.startswith("tls://")
    dask_pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in objects
                 if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("dask-")}  # fmt: skip
    assert len(dask_pods) == 3
    for name, spec in dask_pods.items():
        (c,) = spec["containers"]
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        sec = _security(env)
        assert sec.require_encryption is True, name
        files = _tls_files(spec, c)
        assert files == {f"{DASK_TLS_DIR}/{f}" for f in ("ca.crt", "node.crt", "node.key")}, name
        roles = ("scheduler", "worker", "client")
        named = {sec.tls_ca_file} | {getattr(sec, f"tls_{r}_{k}") for r in roles for k in ("cert", "key")}
        assert named == files, name  # every role's pair set, each a file the pod has
        if name == "dask-scheduler":
            assert _arg(c["args"], "--protocol") == "tls"
            for probe in ("readinessProbe", "livenessProbe"):  # not a TCP probe on the TLS port
                assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
            assert {"name": "http", "containerPort": 8787} in c["ports"]
        else:
            assert c["args"][2] == address, name
    assert not [a for d in objects for a in json.dumps(d).split('"') if a.startswith("tcp://")]

    (client_cm,) = [d for d in objects if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ckptvault-dask-client"]
    job = rendered_job()
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert {"configMapRef": {"name": "ckptvault-dask-client", "optional": True}} in c["envFrom"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "dask-tls"]
    assert volume["secret"]["optional"] is True  # a pool without the component starts its runs as before
    files = _tls_files(spec, c)
    assert files == {f"{DASK_TLS_DIR}/{f}" for f in ("ca.crt", "client.crt", "client.key")}
    sec = _security(client_cm["data"])
    assert sec.require_encryption is True
    assert {sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key} == files
    assert sec.tls_worker_key is None and sec.tls_scheduler_key is None  # a flow pod can serve as neither


def test_the_prefect_workers_accept_no_connections_and_report_health() -> None:
    """The two worker Deployments: a NetworkPolicy with no ingress rule selects both pods (they only dial
    out, to the Prefect and Kubernetes APIs), and liveness and readiness both ask the worker's /health on
    the port its webserver listens on."""
    *workers, _job, policy = manifests()["worker.yaml"]
    assert policy["kind"] == "NetworkPolicy" and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == []
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected
    for w in workers:
        name = w["metadata"]["name"]
        assert selected.items() <= w["spec"]["template"]["metadata"]["labels"].items(), name
        (c,) = w["spec"]["template"]["spec"]["containers"]
        assert "--with-healthcheck" in c["args"], name
        env = {e["name"]: e.get("value") for e in c["env"]}
        (port,) = [p for p in c["ports"] if p["name"] == "health"]
        assert port["containerPort"] == int(env["PREFECT_WORKER_WEBSERVER_PORT"]), name
        for probe in ("livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "health"}, (name, probe)


def test_only_pods_that_call_the_kubernetes_api_get_a_token(tmp_path: Path) -> None:
    """The Prefect workers create Jobs, so their pods keep the service account token; every other pod
    (the pool Job, the Dask pods) turns it off in its own spec or through its service account."""
    objects = with_dask(tmp_path)
    sas = {d["metadata"]["name"]: d for d in objects if d["kind"] == "ServiceAccount"}
    token = {}
    for d in objects:
        for ps in pods(d):
            sa_default = sas.get(ps.get("serviceAccountName", "default"), {}).get("automountServiceAccountToken", True)
            token[d["metadata"]["name"]] = ps.get("automountServiceAccountToken", sa_default)
    assert {name for name, mounted in token.items() if mounted} == {"ckptvault-worker", "ckptvault-worker-tier"}
    assert len(token) == 6, token  # 2 workers, the pool Job, 3 Dask pods
