"""parliament (duo-labs' IAM linter) over the policies Terraform renders: the ingest, tier (worker), recover
(break-glass) and replica templates, with the statements iam.tf and replica.tf add (SSE-KMS, the replica's
lock), rendered as tests/infra/test_iam_policy.py and `make up` render them (infra/local/roles.py). Every
finding must be one of EXPECTED, each with why it stays; a new one (an unknown action, an action on a
resource type it does not apply to, a malformed condition) fails the test by its text.
"""

from __future__ import annotations

import importlib.resources
import json
import sys
import types
from typing import Any

import pytest

from infra.local.roles import INGEST_TEMPLATE, RECOVER_TEMPLATE, REPLICA_TEMPLATE, WORKER_TEMPLATE, render_policy


def _parliament() -> Any:
    # parliament 1.6.4 (the newest) imports pkg_resources for two resource_filename calls at import time, and
    # the setuptools of this environment (>= 82) no longer ships pkg_resources. A stand-in with that one
    # function, from importlib.resources, is set only when the real module is missing.
    try:
        import pkg_resources  # noqa: F401
    except ImportError:
        shim = types.ModuleType("pkg_resources")
        shim.resource_filename = lambda package, name: str(importlib.resources.files(package) / name)  # type: ignore[attr-defined]
        sys.modules["pkg_resources"] = shim
    return pytest.importorskip("parliament", reason="pip install parliament (the dev extra)")


KMS = {"Sid": "UseTheBucketKmsKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
       "Resource": "arn:aws:kms:us-east-1:111122223333:key/00000000-0000-0000-0000-000000000000"}  # fmt: skip
REPLICA_LOCK = {"Sid": "LockTheCopies", "Effect": "Allow", "Action": ["s3:PutObjectLegalHold", "s3:PutObjectRetention"],
                "Resource": "arn:aws:s3:::acme-dr/dr/*"}  # fmt: skip


def policies(prefix: str) -> dict[str, dict[str, Any]]:
    """Every document Terraform can attach: iam.tf's three (ingest, tier, the break-glass recover) with and
    without SSE-KMS, replica.tf's with and without replica_object_lock (its lock statement as replica.tf
    writes it)."""
    out: dict[str, dict[str, Any]] = {}
    for role, template in (("ingest", INGEST_TEMPLATE), ("tier", WORKER_TEMPLATE), ("recover", RECOVER_TEMPLATE)):
        doc = render_policy("acme-ckpts", prefix, template=template)
        out[role] = doc
        out[f"{role} with SSE-KMS"] = {**doc, "Statement": [*doc["Statement"], KMS]}
    replica = render_policy("acme-dr", "dr", template=REPLICA_TEMPLATE)
    out["replica"] = replica
    out["replica with Object Lock"] = {**replica, "Statement": [*replica["Statement"], REPLICA_LOCK]}
    return out


def findings(policy: dict[str, Any]) -> list[str]:
    parliament = _parliament()
    analysed = parliament.analyze_policy_string(json.dumps(policy), include_community_auditors=True)
    return sorted(f"{f.issue}: {f.detail}" for f in analysed.findings)


# (policy, finding) -> why it stays. parliament compares each statement's resources with the others'.
EXPECTED: dict[tuple[str, str], str] = {
    (
        role,
        "RESOURCE_POLICY_PRIVILEGE_ESCALATION: Possible resource policy privilege escalation on "
        "arn:aws:s3:::acme-ckpts due to s3:DeleteObject not being allowed, but does allow "
        "s3:PutLifecycleConfiguration",
    ): (
        "the tier role may delete under <prefix>/ only, and s3:PutLifecycleConfiguration cannot be limited "
        "to a prefix (a bucket action): a lifecycle rule it writes could expire objects outside the prefix. "
        "Known and documented (infra/terraform/README.md, 'Notes and limits'); it is the tier role's alone, "
        'for lifecycle = "managed"; with Terraform owning the rules nothing sends it'
    )
    for role in ("tier", "tier with SSE-KMS")
}


@pytest.mark.parametrize("prefix", ["prod", "", "teams/llm"])
def test_parliament_finds_nothing_unexplained(prefix: str) -> None:
    seen: set[tuple[str, str]] = set()
    for name, policy in policies(prefix).items():
        found = {(name, f) for f in findings(policy)}
        assert found <= set(EXPECTED), sorted(found - set(EXPECTED))
        seen |= found
    # an explained finding that no longer appears is stale: drop it from EXPECTED. With no prefix the
    # delete covers the whole bucket, so the lifecycle write widens nothing and parliament is silent.
    assert seen == (set(EXPECTED) if prefix else set()), sorted(set(EXPECTED) ^ seen)


@pytest.mark.parametrize(
    ("planted", "issue"),
    [
        ({"Action": "s3:GetObjectt", "Resource": "arn:aws:s3:::acme-ckpts/prod/*"}, "UNKNOWN_ACTION"),
        ({"Action": "s3:GetObject", "Resource": "arn:aws:s3:::acme-ckpts"}, "RESOURCE_MISMATCH"),
        (
            {
                "Action": "s3:ListBucket",
                "Resource": "arn:aws:s3:::acme-ckpts",
                "Condition": {"StringLike": {"s3:prefixx": "prod/*"}},
            },
            "UNKNOWN_CONDITION_FOR_ACTION",
        ),
    ],
)
def test_parliament_sees_a_planted_mistake(planted: dict[str, Any], issue: str) -> None:
    clean = policies("prod")["ingest"]
    assert findings(clean) == []
    bad = {**clean, "Statement": [*clean["Statement"], {"Sid": "Planted", "Effect": "Allow", **planted}]}
    assert any(f.startswith(f"{issue}: ") for f in findings(bad)), findings(bad)
