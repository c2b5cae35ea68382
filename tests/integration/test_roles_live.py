"""The two roles of docs/OPERATIONS.md ("Two roles") against a live IAM engine: SeaweedFS's embedded IAM
API (on the S3 port; infra/local/seaweedfs.sh allows the admin key to write it) evaluates identity
policies with S3 action names and resource ARNs, as AWS IAM does. The policies attached are
infra/terraform's templates rendered as Terraform renders them and translated for SeaweedFS
(infra/local/roles.py, which `make up` uses for its two workers' users too), so this
proves both halves the static IAM test cannot: the ingest role's policy is enough for everything that
role runs (ingest with [lock], ls, hold, release, restore, a drill, under `[store] deletes = "tier-only"`),
and a delete with its key, of a checkpoint or of the catalog, is refused by the server, not by
ckptvault's good manners; the tier role's policy is enough for `tier --apply`. And a replica's policy
(infra/terraform/replica-policy.json.tftpl plus replica.tf's lock statement) is enough for replicate,
scrub --repair and a restore from that copy, with [lock], the primary side run with the ingest role's
key; a delete with the replica's key is refused.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from ckptvault.checkpoint.manifest import MANIFEST_NAME, checkpoint_prefix
from ckptvault_cli.synthetic import write_checkpoint
from infra.local.roles import INGEST_TEMPLATE, REPLICA_TEMPLATE, WORKER_TEMPLATE, for_seaweedfs, render_policy
from tests.helpers import write_config
from tests.reliability.conftest import cli_env, run_cli
from tests.servers import S3Endpoint

MiB = 2**20


def _iam(endpoint: S3Endpoint) -> Any:
    import boto3

    return boto3.client(
        "iam", endpoint_url=endpoint.url, aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key, region_name=endpoint.region,
    )  # fmt: skip


@pytest.fixture
def iam_user(seaweedfs: S3Endpoint) -> Iterator[Callable[[str, dict[str, Any]], S3Endpoint]]:
    """A SeaweedFS user with one inline policy and its own key: the endpoint as that user reaches it."""
    iam = _iam(seaweedfs)
    made: list[tuple[str, str]] = []

    def make(role: str, policy: dict[str, Any]) -> S3Endpoint:
        name = f"ckv-{role}-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName=role, PolicyDocument=json.dumps(for_seaweedfs(policy)))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        made.append((name, key["AccessKeyId"]))
        return replace(seaweedfs, access_key=key["AccessKeyId"], secret_key=key["SecretAccessKey"])

    yield make
    for name, key_id in made:
        with contextlib.suppress(ClientError):
            iam.delete_access_key(UserName=name, AccessKeyId=key_id)
            iam.delete_user_policy(UserName=name, PolicyName=name.split("-")[1])
            iam.delete_user(UserName=name)


def _until_allowed(endpoint: S3Endpoint, bucket: str, key: str) -> None:
    """A new key and policy reach the S3 gateway through the filer: wait until a PUT the policy allows
    goes through (a condition, not a sleep), at most 20 s."""
    client = endpoint.client()
    deadline = time.monotonic() + 20
    while True:
        try:
            client.put_object(Bucket=bucket, Key=key, Body=b"")
            return
        except ClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _refused(call: Callable[[], object]) -> str:
    with pytest.raises(ClientError) as e:
        call()
    # SeaweedFS's IAM API answers a refusal with a bare 403 and no error document
    return str(e.value.response.get("Error", {}).get("Code") or e.value.response["ResponseMetadata"]["HTTPStatusCode"])


def test_the_ingest_role_runs_its_flows_and_cannot_delete_a_checkpoint(
    prefect_api: None,
    seaweedfs: S3Endpoint,
    locked_bucket: Any,
    iam_user: Any,
    tmp_path: Path,
) -> None:
    bucket = locked_bucket(seaweedfs)
    ingest = iam_user("ingest", render_policy(bucket, "t", template=INGEST_TEMPLATE))
    tier = iam_user("tier", render_policy(bucket, "t", template=WORKER_TEMPLATE))
    _until_allowed(ingest, bucket, "t/_state/role-ready")
    _until_allowed(tier, bucket, "t/_state/role-ready")

    root = tmp_path / "hot"
    write_checkpoint(root, "deepspeed", 100, 12 * MiB, shards=1, seed=5)  # 5 MiB parts: multipart too
    extra = f'[lock]\nmode = "governance"\ndays = 1\n[drill]\nscratch = "{tmp_path / "scratch"}"\n'
    cfg = write_config(tmp_path / "c.toml", seaweedfs, bucket, [("r", root, "deepspeed")], extra=extra)
    # the ingest role cannot delete at all, nor write the lifecycle: its flows must be told (docs/OPERATIONS.md,
    # "Two roles"; docs/configuration.md)
    two_roles = '[store]\ndeletes = "tier-only"\nlifecycle = "external"\n'
    cfg.write_text(cfg.read_text().replace("[store]\n", two_roles, 1))
    env = cli_env(ingest)
    for args in (
        ("ingest",),
        ("ls", "--json"),
        ("hold", "r", "--step", "100", "--reason", "audit"),
        ("release", "r", "--step", "100", "--reason", "audit done"),
        ("restore", "r", "--dest", str(tmp_path / "back")),
        ("drill", "--json"),
        ("ingest",),  # of step 200, written just before: its compaction has the events above to fold
    ):
        if args == ("ingest",) and (tmp_path / "back").exists():
            write_checkpoint(root, "deepspeed", 200, 2 * MiB, shards=1, seed=6)
        out = run_cli(cfg, *args, env=env)
        assert out.returncode == 0, (args, out.stderr[-3000:])
        assert "Traceback" not in out.stderr, args
    rows = {r["step"]: r for r in json.loads(run_cli(cfg, "ls", "--json", env=env).stdout)}
    assert sorted(rows) == [100, 200] and rows[100]["locked_until"] is not None and not rows[100]["legal_hold"]

    manifest = checkpoint_prefix("t", "r", 100) + MANIFEST_NAME
    version = seaweedfs.client().head_object(Bucket=bucket, Key=manifest)["VersionId"]
    as_ingest = ingest.client()
    # The ingest key cannot delete a checkpoint, not even by adding a delete marker; nor reach IAM.
    assert _refused(lambda: as_ingest.delete_object(Bucket=bucket, Key=manifest)) == "AccessDenied"
    assert _refused(lambda: as_ingest.delete_object(Bucket=bucket, Key=manifest, VersionId=version)) == "AccessDenied"
    bulk = as_ingest.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": manifest}]})
    assert [e["Code"] for e in bulk.get("Errors", [])] == ["AccessDenied"], bulk
    catalog = next(
        o["Key"] for o in seaweedfs.client().list_objects_v2(Bucket=bucket, Prefix="t/_catalog/")["Contents"]
    )
    assert _refused(lambda: as_ingest.delete_object(Bucket=bucket, Key=catalog)) == "AccessDenied"
    # nor install an expiration rule, which would delete as surely
    expire_all = {"Rules": [{"ID": "x", "Status": "Enabled", "Filter": {"Prefix": ""}, "Expiration": {"Days": 1}}]}
    assert _refused(
        lambda: as_ingest.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=expire_all)
    ) == "AccessDenied"  # fmt: skip
    assert _refused(lambda: _iam(ingest).create_user(UserName=f"x{uuid.uuid4().hex[:6]}")) in (
        "AccessDenied", "AccessDeniedException", "403",
    )  # fmt: skip
    # The tier key may delete under the prefix, but a locked version only with the governance bypass,
    # which its policy does not grant.
    as_tier = tier.client()
    assert _refused(lambda: as_tier.delete_object(Bucket=bucket, Key=manifest, VersionId=version)) == "AccessDenied"
    assert _refused(
        lambda: as_tier.delete_object(Bucket=bucket, Key=manifest, VersionId=version, BypassGovernanceRetention=True)
    ) == "AccessDenied"  # fmt: skip
    assert seaweedfs.client().head_object(Bucket=bucket, Key=manifest)["VersionId"] == version  # still there
    # The tier role's policy is enough for the daily run, whose compaction deletes what ingest left.
    tiered = run_cli(cfg, "tier", "--apply", env=cli_env(tier))
    assert tiered.returncode == 0, tiered.stderr[-3000:]


def test_the_replica_policy_is_enough_to_replicate_scrub_repair_and_restore_and_cannot_delete(
    prefect_api: None, seaweedfs: S3Endpoint, locked_bucket: Any, iam_user: Any, tmp_path: Path
) -> None:
    primary, copy = locked_bucket(seaweedfs), locked_bucket(seaweedfs)
    ingest = iam_user("ingest", render_policy(primary, "t", template=INGEST_TEMPLATE))
    policy = render_policy(copy, "dr", template=REPLICA_TEMPLATE)
    policy["Statement"].append(  # replica.tf's, with replica_object_lock (test_iam_policy checks it is)
        {"Sid": "LockTheCopies", "Effect": "Allow", "Action": ["s3:PutObjectLegalHold", "s3:PutObjectRetention"],
         "Resource": f"arn:aws:s3:::{copy}/dr/*"}
    )  # fmt: skip
    replica = iam_user("replica", policy)
    _until_allowed(ingest, primary, "t/_state/role-ready")
    _until_allowed(replica, copy, "dr/_state/role-ready")
    creds = tmp_path / "credentials"
    creds.write_text(f"[dr]\naws_access_key_id = {replica.access_key}\naws_secret_access_key = {replica.secret_key}\n")

    root = tmp_path / "hot"
    src = write_checkpoint(root, "deepspeed", 100, 12 * MiB, shards=1, seed=7)  # 5 MiB parts: multipart too
    extra = (
        f'[lock]\nmode = "governance"\ndays = 1\n[[replicas]]\nname = "dr"\nbucket = "{copy}"\nprefix = "dr"\n'
        f'endpoint_url = "{seaweedfs.url}"\nregion = "{seaweedfs.region}"\nprofile = "dr"\npart_size_mb = 5\n'
        'lifecycle = "external"\n'  # the replica's credentials cannot write its lifecycle either
    )
    cfg = write_config(tmp_path / "c.toml", seaweedfs, primary, [("r", root, "deepspeed")], extra=extra)
    two_roles = '[store]\ndeletes = "tier-only"\nlifecycle = "external"\n'
    cfg.write_text(cfg.read_text().replace("[store]\n", two_roles, 1))
    env = cli_env(ingest, AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_CONFIG_FILE=str(tmp_path / "no-config"))

    def ok(*args: str) -> str:
        out = run_cli(cfg, *args, env=env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stdout[-2000:] + out.stderr[-3000:])
        return out.stdout

    ok("ingest")
    ok("replicate")
    admin = seaweedfs.client()
    victim = max(
        (o for o in admin.list_objects_v2(Bucket=copy, Prefix="dr/r/")["Contents"]), key=lambda o: o["Size"]
    )  # the multipart shard: a new version of other bytes beside the locked one
    admin.put_object(Bucket=copy, Key=victim["Key"], Body=b"\0" * victim["Size"])
    assert "1 repaired, 0 left" in ok("scrub", "--replica", "dr", "--repair")
    ok("restore", "r", "--from", "dr", "--dest", str(tmp_path / "back"))
    back = tmp_path / "back" / src.name
    assert {p.relative_to(back): p.read_bytes() for p in back.rglob("*") if p.is_file()} == {
        p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()
    }
    as_replica = replica.client()
    assert _refused(lambda: as_replica.delete_object(Bucket=copy, Key=victim["Key"])) == "AccessDenied"
    assert _refused(lambda: as_replica.get_object(Bucket=primary, Key="t/_state/role-ready")) in ("AccessDenied", "403")
