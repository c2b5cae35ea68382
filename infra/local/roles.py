"""The two roles of docs/OPERATIONS.md ("Two roles") as SeaweedFS users: the one place that renders
infra/terraform's policy templates (as Terraform's templatefile does) and translates them for SeaweedFS's
embedded IAM API. tests/infra/test_iam_policy.py and tests/integration/test_roles_live.py import it, and
`make up` (infra/local/up.sh) runs it as a script to give its two workers their own users and keys:

    python infra/local/roles.py CONFIG KEYS_FILE

CONFIG is the stack's ckptvault config (its [store] names the endpoint, bucket and prefix); the admin key is
AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY. Idempotent: the users `ckptvault-ingest` (ingest policy: no delete at
all) and `ckptvault-tier` (worker policy: may delete under the prefix) are created if missing, their policy is
(re)attached on every run (a changed template takes effect), and the key recorded in KEYS_FILE is kept while the
store still knows it; otherwise a new key is made and the user's other keys are deleted. As Terraform does on AWS,
it installs the bucket's abort rule for incomplete uploads with the admin key: the ingest user may not write the
lifecycle (the config says `[store] lifecycle = "external"`). KEYS_FILE (mode 600)
gets INGEST_ACCESS_KEY, INGEST_SECRET_KEY, TIER_ACCESS_KEY, TIER_SECRET_KEY lines. Exit 2 with a message on
failure.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

TERRAFORM = Path(__file__).resolve().parents[1] / "terraform"
WORKER_TEMPLATE = TERRAFORM / "worker-policy.json.tftpl"  # the tier role's: may delete under the prefix
INGEST_TEMPLATE = TERRAFORM / "ingest-policy.json.tftpl"  # the ingest role's: no s3:DeleteObject at all
# the break-glass role's (`recover --since TIME --apply`): deletes a delete marker by its version id, never a
# plain delete; held by an on-call human, not by a flow (docs/OPERATIONS.md, "The break-glass role")
RECOVER_TEMPLATE = TERRAFORM / "recover-policy.json.tftpl"
# a replica's credentials (its `profile`), on the replica bucket: no delete; without [lock]'s two actions,
# which replica.tf adds with replica_object_lock
REPLICA_TEMPLATE = TERRAFORM / "replica-policy.json.tftpl"
# role -> (SeaweedFS user name, policy template)
ROLES: dict[str, tuple[str, Path]] = {
    "ingest": ("ckptvault-ingest", INGEST_TEMPLATE),
    "tier": ("ckptvault-tier", WORKER_TEMPLATE),
}

# SeaweedFS 4.x's policy validator does not know some action names ("not a valid action"): the rendered
# policies are translated to its names before they are attached. It has no action name for the bucket's
# lifecycle configuration, so the bucket-level wildcard stands in (on the bucket ARN only: no object
# action widens); RestoreObject it does not implement. Nor does it know the `...IfExists` condition
# operators (a statement with one never matches), so the ListBucket statement loses its s3:prefix
# condition here: that limit is checked statically (tests/infra/test_iam_policy.py) and holds on AWS.
# Its `s3:ListMultipartUploads` is accepted but does not authorise the ListMultipartUploads call (tried
# on SeaweedFS 4.x: `s3:List*` or `s3:Put*` on the bucket does). So the bucket's `s3:List*` stands in:
# lists only, on the bucket ARN only. Only the tier (worker) template has the lifecycle write, so only
# its user gets the bucket's `s3:Put*`.
SEAWEEDFS_NAMES: dict[str, str | None] = {
    "s3:GetLifecycleConfiguration": "s3:Get*",
    "s3:PutLifecycleConfiguration": "s3:Put*",
    "s3:ListBucketMultipartUploads": "s3:List*",
    "s3:RestoreObject": None,
}


class RolesError(Exception):
    """What went wrong, for the operator (the script prints it and exits 2)."""


def render_policy(bucket: str, prefix: str, partition: str = "aws", template: Path = WORKER_TEMPLATE) -> dict[str, Any]:
    """A policy template as Terraform renders it (iam.tf: templatefile with these values)."""
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    key_prefix = f"{prefix}/" if prefix else ""
    values = {
        "bucket_arn": bucket_arn,
        "objects_arn": f"{bucket_arn}/{key_prefix}*",
        "list_prefix": f"{key_prefix}*",
    }
    text = template.read_text()
    # Plain JSON with ${name} values keeps this renderer exact; a directive would need Terraform itself.
    if "%{" in text:
        raise RolesError(f"{template}: the policy template must stay plain JSON with ${{name}} values (no directives)")
    rendered = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)
    if "${" in rendered:
        raise RolesError(f"{template}: an interpolation that is not a plain variable name")
    doc: dict[str, Any] = json.loads(rendered)
    return doc


def for_seaweedfs(policy: dict[str, Any]) -> dict[str, Any]:
    """The policy with SeaweedFS's action names and without `...IfExists` conditions (see SEAWEEDFS_NAMES)."""
    statements = []
    for st in policy["Statement"]:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        kept = sorted({n for a in actions if (n := SEAWEEDFS_NAMES.get(a, a)) is not None})
        if kept:
            conditions = {op: v for op, v in st.get("Condition", {}).items() if not op.endswith("IfExists")}
            out = {k: v for k, v in st.items() if k != "Condition"} | {"Action": kept}
            statements.append(out | ({"Condition": conditions} if conditions else {}))
    return {**policy, "Statement": statements}


def read_keys(path: Path) -> dict[str, str]:
    """KEYS_FILE's VAR=value lines (empty if there is none)."""
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")


def ensure_user(iam: Any, user: str, policy: dict[str, Any], known: tuple[str, str] | None) -> tuple[str, str]:
    """The user with this inline policy and one key: `known` (key id, secret) if the store still has it."""
    from botocore.exceptions import ClientError

    try:
        iam.get_user(UserName=user)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "NoSuchEntity":
            raise
        iam.create_user(UserName=user)
    # Always attached again: a policy template changed since the last `make up` takes effect.
    iam.put_user_policy(UserName=user, PolicyName=user, PolicyDocument=json.dumps(for_seaweedfs(policy)))
    ids = [k["AccessKeyId"] for k in iam.list_access_keys(UserName=user).get("AccessKeyMetadata", [])]
    if known is not None and known[0] in ids:
        return known
    # The recorded secret is gone (new store, deleted file): a fresh key, and no stray keys left behind.
    for key_id in ids:
        iam.delete_access_key(UserName=user, AccessKeyId=key_id)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def wait_until_accepted(endpoint: str, region: str, key: tuple[str, str], bucket: str, prefix: str) -> None:
    """A new key and policy reach SeaweedFS's S3 gateway through its filer a moment later: wait (at most 30 s)
    until the key may list its prefix, so that a flow run started right after `make up` does not fail on it."""
    import boto3
    from botocore.exceptions import ClientError

    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=key[0], aws_secret_access_key=key[1]
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/" if prefix else "", MaxKeys=1)
            return
        except ClientError as e:
            if time.monotonic() > deadline:
                raise RolesError(f"the key {key[0]} is still refused after 30 s: {e}") from e
            time.sleep(0.2)


def ensure_roles(config_path: Path, keys_file: Path) -> dict[str, tuple[str, str]]:
    """Both users for the config's bucket and prefix, their keys written to keys_file: role -> key."""
    import boto3

    from ckptvault.config import load_config

    store = load_config(os.fspath(config_path)).store
    if not store.endpoint_url:
        raise RolesError(f"{config_path} has no [store] endpoint_url: the roles are for the local store only")
    region = store.region or "us-east-1"
    iam = boto3.client("iam", endpoint_url=store.endpoint_url, region_name=region)  # the admin key, from the env
    saved = read_keys(keys_file)
    keys: dict[str, tuple[str, str]] = {}
    for role, (user, template) in ROLES.items():
        var = role.upper()
        known = (saved[f"{var}_ACCESS_KEY"], saved[f"{var}_SECRET_KEY"]) if f"{var}_SECRET_KEY" in saved else None
        keys[role] = ensure_user(iam, user, render_policy(store.bucket, store.prefix, template=template), known)
    # Terraform's part on AWS (infra/terraform main.tf): the rule the ingest flow would otherwise write, same
    # ID and content (days 1), so a config with lifecycle = "managed" finds it too and writes nothing.
    from ckptvault.store import open_store

    open_store(store).ensure_abort_incomplete_mpu_rule(1)  # the admin key, from the env
    lines = [f"# written by infra/local/roles.py for {store.endpoint_url}: the two roles' keys (make up's workers)"]
    for role, (key_id, secret) in keys.items():
        lines += [f"{role.upper()}_ACCESS_KEY={key_id}", f"{role.upper()}_SECRET_KEY={secret}"]
    tmp = keys_file.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o600)
    tmp.replace(keys_file)
    for key in keys.values():
        wait_until_accepted(store.endpoint_url, region, key, store.bucket, store.prefix)
    return keys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python infra/local/roles.py CONFIG KEYS_FILE   (the admin key in AWS_ACCESS_KEY_ID/...)",
              file=sys.stderr)  # fmt: skip
        return 2
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        keys = ensure_roles(Path(argv[0]), Path(argv[1]))
    except (RolesError, ClientError, BotoCoreError, OSError, ValueError) as e:
        print(f"roles: could not set up the ingest and tier users: {e}", file=sys.stderr)
        return 2
    for role, (key_id, _) in keys.items():
        print(f"roles: {ROLES[role][0]} ({role} policy) has key {key_id}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # Run as a script from up.sh: the checkout first on the path, for ckptvault.config.
    sys.path.insert(0, os.fspath(Path(__file__).resolve().parents[2]))
    sys.exit(main(sys.argv[1:]))
