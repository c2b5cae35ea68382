"""Every name the Kubernetes and Terraform docs cite exists: docs/OPERATIONS.md's Kubernetes sections,
infra/k8s/README.md and infra/terraform/README.md are what a platform team types from, so a renamed file,
variable, output, object or target must fail here, not on their cluster.

What is checked, in each of those texts (code blocks included):
- repository paths (`infra/k8s/worker.yaml`, `ckptvault/store/*.py`, and in backticks a file or folder
  name relative to the doc's folder, `components/dask/`, `networkpolicy.yaml`): the file or folder exists;
- Terraform names (`terraform output -raw NAME`, `-var NAME=...`, `var.NAME`): a `variable "NAME"` or
  `output "NAME"` block of infra/terraform/*.tf;
- Kubernetes objects (`kubectl -n ckptvault ... deploy/NAME`, `job/NAME`, `"serviceAccountName":"NAME"`,
  and every backticked `ckptvault-...` / `dask-...` name): an object of that kind and name in `kubectl
  kustomize` of infra/k8s with its Dask component, or a name listed in NOT_OBJECTS with why;
- `prefect deployment run FLOW/NAME`: a deployment of infra/k8s/prefect.yaml;
- `make TARGET`: a target of the Makefile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import require_tool

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
TERRAFORM = ROOT / "infra" / "terraform"

# The top-level folders a repository path starts with.
ROOTS = ("infra", "docs", "tests", "ckptvault", "ckptvault_cli", "ckptvault_prefect", "bench", "deployments", "flows")
# A repository path in running text: not the tail of a longer path, URL or ${VAR}/..., nor an absolute path.
REPO_PATH = re.compile(rf"(?<![\w$./<>:@-])((?:{'|'.join(ROOTS)})/[\w.*/-]*)")
# A backticked file or folder name relative to the doc's folder (a README cites its neighbours so).
LOCAL_FILE = re.compile(
    r"^[\w./-]*(?:\.(?:ya?ml|json|py|tf|tftpl|hcl|example|txt|md|sh)|Dockerfile)$|^[\w-]+(?:/[\w-]+)*/$"
)
BACKTICKED = re.compile(r"`([^`\n]+)`")
# Backticked names that look like files but are not the repository's, with why.
NOT_FILES: dict[str, str] = {
    "ckptvault.toml": "the config's file name inside the ConfigMap ckptvault-config, mounted at /etc/ckptvault",
    "ckptvault.digest": "written by `buildah push --digestfile` / kaniko's --digest-file, in the reader's checkout",
}

TF_OUTPUT = re.compile(r"terraform(?:\s+-chdir=\S+)?\s+output\s+(?:-(?:raw|json)\s+)?([a-z]\w*)")
TF_VAR = re.compile(r"(?:(?<![\w-])-var(?:\s+|=)|\bvar\.)([a-z]\w*)")
# a command, not the verb: backticked (`make up`) or a code block's line
MAKE = re.compile(r"(?:^|`)make\s+([a-z][\w-]*)", re.M)
DEPLOYMENT_RUN = re.compile(r"prefect\s+deployment\s+run\s+[\w-]+/([\w-]+)")

KIND_ALIASES = {
    "deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
    "job": "Job", "jobs": "Job", "svc": "Service", "service": "Service",
    "sa": "ServiceAccount", "serviceaccount": "ServiceAccount", "cm": "ConfigMap", "configmap": "ConfigMap",
    "pvc": "PersistentVolumeClaim", "persistentvolumeclaim": "PersistentVolumeClaim",
    "netpol": "NetworkPolicy", "networkpolicy": "NetworkPolicy", "secret": "Secret",
}  # fmt: skip
KUBECTL_OBJECT = re.compile(rf"\b({'|'.join(KIND_ALIASES)})/([a-z0-9][a-z0-9.-]*)")
NAMESPACE = re.compile(r"(?:-n|--namespace)[ =]([a-z0-9-]+)")
SERVICE_ACCOUNT_JSON = re.compile(r'"serviceAccountName"\s*:\s*"([a-z0-9-]+)"')
# Backticked names of ours that should be Kubernetes objects (ckptvault-..., dask-...).
OBJECT_NAME = re.compile(r"^(?:ckptvault|dask)-[a-z0-9-]*[a-z0-9]$")
# ckptvault-/dask- names the docs cite that are not objects infra/k8s renders, with why.
NOT_OBJECTS: dict[str, str] = {
    "ckptvault-k8s": "the Prefect work pool, made in the Prefect server by the Job ckptvault-work-pool",
    "ckptvault-credentials": "the Secret the operator creates with kubectl (secret.example.yaml: keys, no values)",
    "ckptvault-dask-tls": "the Secret of the Dask certificates, created with kubectl from openssl's files",
    "ckptvault-dask-ca": "the CN of the Dask CA certificate",
    "ckptvault-abort-incomplete-mpu": "a lifecycle rule ID's stem (Terraform, main.tf)",
    "ckptvault-tier-": "a lifecycle rule ID's stem",
}
NAMESPACE_OURS = "ckptvault"
# A backticked snake_case name: a Terraform variable or output, a job variable of the work pool
# (base-job-template.json), a config key (docs/reference/config.md, generated from the code), or one of these.
SNAKE_NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
OTHER_NAMES: dict[str, str] = {
    "ensure_bucket": "a function of ckptvault/store (the demo's bucket creation)",
    "job_variables": "the key of a deployment's work_pool in prefect.yaml",
}


@dataclass
class Facts:
    """What exists: the names a citation is checked against."""

    root: Path
    variables: set[str]
    outputs: set[str]
    objects: set[tuple[str, str]]  # (kind, name) in the namespace ckptvault
    deployments: set[str]
    make_targets: set[str]
    job_variables: set[str]
    config_keys: set[str]
    pools: set[str] = field(default_factory=set)  # infra/k8s/prefect.yaml's definitions (gpu_drill_pool, ...)
    object_names: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.object_names = {name for _, name in self.objects}


def tf_names(kind: str) -> set[str]:
    return {m for f in TERRAFORM.glob("*.tf") for m in re.findall(rf'^{kind} "(\w+)"', f.read_text(), re.M)}


def make_targets(makefile: str) -> set[str]:
    return {t for line in makefile.splitlines() if (m := re.match(r"^([\w-]+)\s*:(?!=)", line)) for t in [m[1]]}


def config_keys(reference: str) -> set[str]:
    """The last part of every key the configuration reference documents (`### `store.max_concurrency``)."""
    return {key.split(".")[-1] for key in re.findall(r"^### `([\w.\[\]]+)`", reference, re.M)}


def kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl", "apt-get install kubernetes-client (Debian's; .ci/run does when it is missing)")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def rendered_objects(tmp: Path) -> set[tuple[str, str]]:
    """The base and its Dask component, through an overlay outside infra/k8s as an operator writes one."""
    rel = Path(os.path.relpath(K8S, tmp))
    (tmp / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": [str(rel)], "components": [str(rel / "components" / "dask")]})
    )
    objects = {(d["kind"], d["metadata"]["name"]) for d in kustomize(tmp)}
    # a generated ConfigMap's name carries a hash of its content; the docs cite the generator's name
    generated = {(k, m[1]) for k, n in objects if k == "ConfigMap" and (m := re.match(r"(.+)-[a-z0-9]{10}$", n))}
    return objects | generated


def kubernetes_sections(markdown: str) -> str:
    """The sections of a page whose heading names Kubernetes, each to the next heading of its level or above."""
    out: list[str] = []
    keep_level: int | None = None
    fence = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fence = not fence
        heading = None if fence else re.match(r"^(#+)\s+(.*)", line)
        if heading:
            level = len(heading[1])
            if keep_level is not None and level <= keep_level:
                keep_level = None
            if keep_level is None and "kubernetes" in heading[2].lower():
                keep_level = level
        if keep_level is not None:
            out.append(line)
    return "\n".join(out)


def _exists(root: Path, doc_dir: Path, path: str) -> bool:
    path = path.rstrip(".,;:")
    for base in (root, doc_dir):
        if "*" in path:
            if any(base.glob(path)):
                return True
        elif (base / path).exists():
            return True
    # a bare name a README cites from one of its subfolders (networkpolicy.yaml of components/dask/)
    return "/" not in path.rstrip("/") and any(doc_dir.rglob(path.rstrip("/")))


def broken_references(text: str, doc_dir: Path, facts: Facts) -> list[str]:
    """Every citation in `text` that names nothing that exists, as 'kind: name'."""
    found: list[str] = []
    made_here = set(re.findall(r"\bcp\s+\S+\s+(\S+)", text))  # the reader makes these (cp X.example X)
    for m in REPO_PATH.finditer(text):
        path = m[1].rstrip(".,;:")
        if path not in made_here and not _exists(facts.root, doc_dir, path):
            found.append(f"path: {path}")
    for m in BACKTICKED.finditer(text):
        token = m[1].strip()
        local = LOCAL_FILE.match(token) and not REPO_PATH.match(token) and token not in set(NOT_FILES) | made_here
        if local and not _exists(facts.root, doc_dir, token):
            found.append(f"path: {token}")
        if OBJECT_NAME.match(token) and token not in facts.object_names and token not in NOT_OBJECTS:
            found.append(f"object name: {token}")
        known = facts.variables | facts.outputs | facts.job_variables | facts.config_keys | facts.pools
        known |= set(OTHER_NAMES)
        if SNAKE_NAME.match(token) and token not in known:
            found.append(f"name: {token}")
    found += [f"terraform output: {n}" for n in TF_OUTPUT.findall(text) if n not in facts.outputs]
    found += [f"terraform variable: {n}" for n in TF_VAR.findall(text) if n not in facts.variables]
    found += [f"make target: {n}" for n in MAKE.findall(text) if n not in facts.make_targets]
    found += [f"deployment: {n}" for n in DEPLOYMENT_RUN.findall(text) if n not in facts.deployments]
    # a command is one logical line: join the backslash continuations of code blocks
    for command in re.sub(r"\\\n\s*", " ", text).splitlines():
        if "kubectl" not in command:
            continue
        ns = NAMESPACE.search(command)
        if ns is None or ns[1] != NAMESPACE_OURS:
            continue  # another namespace's objects (the Helm chart's prefect-server) are not ours to render
        for alias, name in KUBECTL_OBJECT.findall(command):
            if (KIND_ALIASES[alias], name) not in facts.objects and name not in NOT_OBJECTS:
                found.append(f"object: {KIND_ALIASES[alias]}/{name}")
        for name in SERVICE_ACCOUNT_JSON.findall(command):
            if ("ServiceAccount", name) not in facts.objects:
                found.append(f"object: ServiceAccount/{name}")
    return sorted(set(found))


def cited_texts() -> dict[str, tuple[str, Path]]:
    operations = ROOT / "docs" / "OPERATIONS.md"
    return {
        "docs/OPERATIONS.md (Kubernetes sections)": (kubernetes_sections(operations.read_text()), operations.parent),
        "infra/k8s/README.md": ((K8S / "README.md").read_text(), K8S),
        "infra/terraform/README.md": ((TERRAFORM / "README.md").read_text(), TERRAFORM),
    }


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> Facts:
    prefect_yaml = yaml.safe_load((K8S / "prefect.yaml").read_text())
    return Facts(
        root=ROOT,
        variables=tf_names("variable"),
        outputs=tf_names("output"),
        objects=rendered_objects(tmp_path_factory.mktemp("overlay")),
        deployments={d["name"] for d in prefect_yaml["deployments"]},
        make_targets=make_targets((ROOT / "Makefile").read_text()),
        job_variables=set(json.loads((K8S / "base-job-template.json").read_text())["variables"]["properties"]),
        config_keys=config_keys((ROOT / "docs" / "reference" / "config.md").read_text()),
        pools=set(prefect_yaml["definitions"]),
    )


def _all_cited(pattern: re.Pattern[str], texts: Iterable[str]) -> set[str]:
    return {m if isinstance(m, str) else m[0] for t in texts for m in pattern.findall(t)}


def test_the_facts_are_not_empty(facts: Facts) -> None:
    # a broken parse of the .tf files, the render or the Makefile would make every citation "missing", or
    # (with an empty set and a wrong test) none: both ends are pinned by names that must be there
    assert {"region", "bucket_name", "oidc_provider_arn", "object_lock_mode"} <= facts.variables
    assert {"ingest_role_arn", "tier_role_arn", "store_config"} <= facts.outputs
    assert {("Deployment", "ckptvault-worker"), ("Deployment", "ckptvault-worker-tier"),
            ("ServiceAccount", "ckptvault-ingest"), ("ServiceAccount", "ckptvault-tier"),
            ("Job", "ckptvault-work-pool"), ("ConfigMap", "ckptvault-work-pool"),
            ("Service", "dask-scheduler")} <= facts.objects  # fmt: skip
    assert {"ingest", "tier", "restore"} <= facts.deployments
    assert {"up", "down", "docs", "test"} <= facts.make_targets
    assert {"image", "service_account_name", "restore_volume"} <= facts.job_variables
    assert {"bucket", "deletes", "lifecycle", "max_concurrency", "dask_address"} <= facts.config_keys


def test_the_kubernetes_walkthrough_is_there_and_cites_what_it_must() -> None:
    text = kubernetes_sections((ROOT / "docs" / "OPERATIONS.md").read_text())
    assert text.startswith("## Kubernetes on AWS"), text[:200]
    for needed in ("infra/terraform/backend.tf.example", "infra/k8s/Dockerfile", "infra/k8s/kustomization.yaml",
                   "infra/k8s/config.yaml", "kubectl apply -k infra/k8s", "infra/k8s/prefect.yaml",
                   "CKPTVAULT_HOME", "prefect-server", "runbook.md#on-kubernetes"):  # fmt: skip
        assert needed in text, needed
    texts = [t for t, _ in cited_texts().values()]
    # the walkthrough's Terraform steps are checked names, not prose the checker passes over
    assert {"ingest_role_arn", "tier_role_arn", "store_config"} <= _all_cited(TF_OUTPUT, texts)
    assert {"region", "bucket_name", "prefix", "oidc_provider_arn"} <= _all_cited(TF_VAR, texts)


@pytest.mark.parametrize("doc", list(cited_texts()))
def test_every_cited_name_exists(doc: str, facts: Facts) -> None:
    text, doc_dir = cited_texts()[doc]
    assert broken_references(text, doc_dir, facts) == []


PLANTED = """
## Kubernetes on AWS
Edit `infra/k8s/workr.yaml` and `components/dasq/`; `config.yaml` is fine, so is `infra/k8s/worker.yaml`.
```
cp infra/terraform/backend.tf.example infra/terraform/backend.tf
terraform -chdir=infra/terraform output -raw ingest_role_rn
terraform -chdir=infra/terraform apply -var region=us-east-1 -var oidc_provider=arn:aws:iam::1:oidc-provider/x
kubectl -n ckptvault exec deploy/ckptvault-wroker -- prefect deployment run restore/restor --watch
kubectl -n ckptvault run x --overrides='{"spec":{"serviceAccountName":"ckptvault-ingst"}}' -- true
kubectl -n prefect port-forward svc/prefect-server 4200:4200
make dmeo
```
The worker `ckptvault-worker-teir` reads `var.bucket_nme`; set `memory_limt` and `max_concurency` of `[store]`.
"""


def test_the_checker_catches_a_planted_bad_reference(facts: Facts) -> None:
    assert broken_references(PLANTED, K8S, facts) == sorted(
        [
            "path: infra/k8s/workr.yaml",
            "path: components/dasq/",
            "terraform output: ingest_role_rn",
            "terraform variable: oidc_provider",
            "terraform variable: bucket_nme",
            "object: Deployment/ckptvault-wroker",
            "object: ServiceAccount/ckptvault-ingst",
            "object name: ckptvault-worker-teir",
            "deployment: restor",
            "make target: dmeo",
            "name: memory_limt",
            "name: max_concurency",
        ]
    )
    # the same text with every name right reports nothing: the checker is not merely noisy
    fixed = (
        PLANTED.replace("workr", "worker").replace("dasq", "dask").replace("role_rn", "role_arn")
        .replace("oidc_provider=", "oidc_provider_arn=").replace("wroker", "worker").replace("ingst", "ingest")
        .replace("teir", "tier").replace("restor ", "restore ").replace("dmeo", "demo").replace("nme", "name")
        .replace("limt", "limit").replace("concurency", "concurrency")
    )  # fmt: skip
    assert broken_references(fixed, K8S, facts) == []


def test_kubernetes_sections_end_at_the_next_heading_of_their_level() -> None:
    page = "# T\n## A\nx\n## Kubernetes on AWS\nk1\n```\n# a shell comment, not a heading\n```\n"
    page += "### Restore\nk2\n## B\nb\n"
    assert kubernetes_sections(page).splitlines() == [
        "## Kubernetes on AWS", "k1", "```", "# a shell comment, not a heading", "```", "### Restore", "k2"
    ]  # fmt: skip
