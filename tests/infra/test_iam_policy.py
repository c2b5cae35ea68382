"""The worker's IAM policy (infra/terraform) grants exactly the S3 actions the code calls, on the right
resources, and nothing more.

The S3 calls are found statically: every `<client>.<method>(...)` and `<client>.get_paginator("<op>")` in
ckptvault/store/*.py (the only package that imports boto3, checked below), where <client> is `client`,
`x.client`, a parameter annotated S3Client or a name bound to make_client(...)/session.client(...); any
call whose method name is an S3 operation of botocore's service model counts too, whatever it is called
on. Each method maps to its IAM actions through METHOD_ACTIONS, an explicit table: a method missing there
fails the test by name, so a new S3 call cannot land without a decision about its permission. Where the
function decides the action (a read or delete by version id: s3:GetObjectVersion, s3:DeleteObjectVersion),
CALL_ACTIONS maps the (function, method) call site, and every call the scan sees naming a version must be
there; WITHHELD says which of those actions the flows' roles go without, and why.

The policy is infra/terraform/worker-policy.json.tftpl, rendered here as Terraform's templatefile would
(and, where terraform is installed, compared with Terraform's own rendering of the module's policy).

The ingest role's policy (infra/terraform/ingest-policy.json.tftpl: ingest, drills, restore, hold and
release, the watch) is the same without s3:DeleteObject at all. The flows run under it need
`[store] deletes = "tier-only"`: the library's delete call sites are found statically, the expiry is
reached only from the tier flow, and every call of a function that deletes (catalog compaction, the
alert-state save, the probes) passes that switch, except the tier flow's own. That the switch does stop
every delete: tests/unit/test_no_delete_role.py, on a store that refuses them.

The break-glass role's policy (infra/terraform/recover-policy.json.tftpl: `recover --since TIME --apply`):
exactly what the calls reachable from recover's path need (RECOVER_APPLY_PATH, followed into the S3
adapter), the one policy with s3:DeleteObjectVersion; neither flow role has it.

A replica's policy (infra/terraform/replica-policy.json.tftpl, on the replica bucket, for the credentials
of its `profile`): exactly REPLICA_ACTIONS, each an action the store's code needs (so the table cannot
grant what nothing calls), each with the replica call that sends it; no delete (its lifecycle rules,
which the pass puts, expire what goes). Which S3 policy is enough for replicate, scrub --repair and a
restore from the replica, with [lock], and refuses a delete: tests/integration/test_roles_live.py,
against SeaweedFS's IAM engine.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest

from infra.local.roles import (
    INGEST_TEMPLATE,
    RECOVER_TEMPLATE,
    REPLICA_TEMPLATE,
    TERRAFORM,
    WORKER_TEMPLATE,
    for_seaweedfs,
    render_policy,
)
from tests.helpers import missing_tool, require_tool

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "ckptvault" / "store"
# The renderer and the templates are infra/local/roles.py's, which `make up` also uses for its two users.
TEMPLATE = WORKER_TEMPLATE

# boto3 S3 client method -> the IAM actions it needs (AWS "Actions, resources, and condition keys for
# Amazon S3" and each API's "Permissions" section).
METHOD_ACTIONS: dict[str, frozenset[str]] = {
    "head_bucket": frozenset({"s3:ListBucket"}),
    "list_objects_v2": frozenset({"s3:ListBucket"}),
    # HEAD answers with a version's lock (ObjectLockMode/RetainUntilDate, LegalHoldStatus) only where the
    # caller may read them: without these two AWS leaves the headers out, and the code that reads a lock
    # from a HEAD (object_lock.from_head: the probe, raising a retention, tier's postponed expiry, the drift
    # check, recover's relock) would see every object unlocked
    "head_object": frozenset({"s3:GetObject", "s3:GetObjectRetention", "s3:GetObjectLegalHold"}),
    "get_object": frozenset({"s3:GetObject"}),
    # with the x-amz-tagging header (ingest tags every object it uploads) PutObjectTagging is needed too
    "put_object": frozenset({"s3:PutObject", "s3:PutObjectTagging"}),
    "create_multipart_upload": frozenset({"s3:PutObject", "s3:PutObjectTagging"}),
    "upload_part": frozenset({"s3:PutObject"}),
    "complete_multipart_upload": frozenset({"s3:PutObject"}),
    "abort_multipart_upload": frozenset({"s3:AbortMultipartUpload"}),
    "list_multipart_uploads": frozenset({"s3:ListBucketMultipartUploads"}),
    # a same-key copy to change the storage class: read the source, write the copy; TaggingDirective=COPY
    # reads the source's tags and writes them on the copy
    "copy_object": frozenset({"s3:GetObject", "s3:PutObject", "s3:GetObjectTagging", "s3:PutObjectTagging"}),
    "upload_part_copy": frozenset({"s3:GetObject", "s3:PutObject"}),
    "delete_object": frozenset({"s3:DeleteObject"}),
    "delete_objects": frozenset({"s3:DeleteObject"}),  # DeleteObjects: checked per key as DeleteObject
    "restore_object": frozenset({"s3:RestoreObject"}),
    "put_object_tagging": frozenset({"s3:PutObjectTagging"}),
    "get_object_tagging": frozenset({"s3:GetObjectTagging"}),
    "get_bucket_lifecycle_configuration": frozenset({"s3:GetLifecycleConfiguration"}),
    "put_bucket_lifecycle_configuration": frozenset({"s3:PutLifecycleConfiguration"}),
    "delete_bucket_lifecycle": frozenset({"s3:PutLifecycleConfiguration"}),  # there is no Delete action
    "create_bucket": frozenset({"s3:CreateBucket"}),
    # [lock] (docs/FORMAT.md, "Object Lock"): the bucket check, and raising a save's retention (only ever
    # lengthened; shortening a GOVERNANCE lock would also need s3:BypassGovernanceRetention, which the
    # worker does not have). The lock probe's delete by version id and its cleanup with the bypass are
    # delete_object calls the worker's policy is meant to refuse.
    "get_object_lock_configuration": frozenset({"s3:GetBucketObjectLockConfiguration"}),
    "put_object_retention": frozenset({"s3:PutObjectRetention"}),
    "put_object_legal_hold": frozenset({"s3:PutObjectLegalHold"}),  # ckptvault hold / release
    # point-in-time reads and the tamper check (docs/object-lock.md, "After an attack"): read-only
    "get_bucket_versioning": frozenset({"s3:GetBucketVersioning"}),
    "list_object_versions": frozenset({"s3:ListBucketVersions"}),
}

_READ_A_VERSION = frozenset({"s3:GetObject", "s3:GetObjectVersion"})

# (function, method) -> the actions of that call site where the method alone does not say: the same method
# needs another action by what the call names. A read with VersionId is s3:GetObjectVersion on AWS (and
# s3:GetObject is then not consulted); a delete with VersionId is s3:DeleteObjectVersion. The functions
# below read the current version, or in a point-in-time view (`restore --as-of`, `ls --as-of`, `recover`:
# `**self._pinned(key)`, `**req.version_args()`) the version current then, so they need both. Every call
# the scan sees naming a version (a VersionId argument, or a `**` of the view's arguments) must be here:
# test_every_call_that_names_a_version_has_its_own_actions.
CALL_ACTIONS: dict[tuple[str, str], frozenset[str]] = {
    ("head", "head_object"): METHOD_ACTIONS["head_object"] | {"s3:GetObjectVersion"},
    ("get_bytes", "get_object"): _READ_A_VERSION,
    ("read_crc32c", "get_object"): _READ_A_VERSION,
    ("read_range", "get_object"): _READ_A_VERSION,  # restore's small files, recover's streamed copy
    ("_fetch_once", "get_object"): _READ_A_VERSION,  # a restore's ranged download (download.py)
    ("_fetch_group_once", "get_object"): _READ_A_VERSION,  # and of a compressed file's frames (framed.py)
    ("restore_object", "restore_object"): frozenset({"s3:RestoreObject"}),  # of a version: the same action
    # recover --apply: a delete marker removed by its version id (S3Store.remove_delete_marker)
    ("remove_delete_marker", "delete_object"): frozenset({"s3:DeleteObjectVersion"}),
    # the Object Lock probe: its delete by version id is the test (refused: the lock holds), and its cleanup
    # deletes by version id with the governance bypass (or, versioning off, plainly)
    ("probe_enforced", "delete_object"): frozenset({"s3:DeleteObjectVersion"}),
    ("_remove", "delete_object"): frozenset(
        {"s3:DeleteObject", "s3:DeleteObjectVersion", "s3:BypassGovernanceRetention"}
    ),
}

# What the worker (tier) and ingest roles are never granted although a call they may make asks for it:
# (function, method) -> (the actions withheld, why the call still works, or works as meant, without them).
WITHHELD: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    ("probe_enforced", "delete_object"): (
        frozenset({"s3:DeleteObjectVersion"}),
        "the probe's delete by version id is the test: IAM refusing it, as the lock would, is the answer",
    ),
    ("_remove", "delete_object"): (
        frozenset({"s3:DeleteObjectVersion", "s3:BypassGovernanceRetention"}),
        "the probe's cleanup is best effort: its locked version stays, unlocked 60 s later, expired by the "
        "noncurrent-version rule",
    ),
    ("remove_delete_marker", "delete_object"): (
        frozenset({"s3:DeleteObjectVersion"}),
        "recover --apply only, under the break-glass role (recover-policy.json.tftpl)",
    ),
}

# Calls the worker never makes, so its policy must not allow them: method -> (the only functions that may
# call it, why). In AWS the bucket is Terraform's; ensure_bucket is the demo's and a first user's convenience.
NOT_FOR_THE_WORKER: dict[str, tuple[frozenset[str], str]] = {
    "create_bucket": (frozenset({"ensure_bucket"}), "the bucket is created by Terraform, not by the worker"),
}

BUCKET_ACTIONS = frozenset(
    {
        "s3:ListBucket",
        "s3:ListBucketMultipartUploads",
        "s3:GetLifecycleConfiguration",
        "s3:PutLifecycleConfiguration",
        "s3:GetBucketObjectLockConfiguration",
        "s3:GetBucketVersioning",
        "s3:ListBucketVersions",
    }
)

CLIENT_FACTORIES = frozenset({"make_client", "client"})  # make_client(cfg, ...), boto3 session.client("s3")


@dataclass(frozen=True)
class S3Call:
    where: str  # path:line
    function: str  # the innermost enclosing function ("<module>" at top level)
    method: str  # the client method; for a paginator, the paginated operation
    names_a_version: bool = False  # a VersionId argument, or the `**` of a point-in-time view's arguments


def s3_operations() -> frozenset[str]:
    """The snake_case names of every S3 operation botocore knows (its bundled service model, offline)."""
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model("s3")
    return frozenset(xform_name(op) for op in model.operation_names)


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, where: str, operations: frozenset[str]) -> None:
        self.where = where
        self.operations = operations
        self.calls: list[S3Call] = []
        self.functions: list[str] = ["<module>"]
        self.clients: list[set[str]] = [set()]  # names bound to an S3 client, per function scope
        # ckptvault.store's own modules imported by name (`from ckptvault.store import copy_stream`): a call
        # on one (`copy_stream.copy_object(req, ...)`) is ours, whatever S3 operation its name matches
        self.own_modules: set[str] = set()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        typed = {a.arg for a in args if a.annotation is not None and "S3Client" in ast.unparse(a.annotation)}
        self.functions.append(node.name)
        self.clients.append(typed)
        self.generic_visit(node)
        self.clients.pop()
        self.functions.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "ckptvault.store":
            self.own_modules.update(a.asname or a.name for a in node.names if (STORE / f"{a.name}.py").exists())

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and _callee(node.value.func) in CLIENT_FACTORIES:
            self.clients[-1].update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def _is_client(self, expr: ast.expr) -> bool:
        if isinstance(expr, ast.Attribute):
            return expr.attr == "client"  # self.client, req.client, store.client
        if isinstance(expr, ast.Name):
            return expr.id == "client" or expr.id.endswith("_client") or any(expr.id in s for s in self.clients)
        return False

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            at = f"{self.where}:{node.lineno}"
            if func.attr == "get_paginator" and self._is_client(func.value):
                arg = node.args[0] if node.args else None
                op = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "<dynamic>"
                self.calls.append(S3Call(at, self.functions[-1], op))
            elif isinstance(func.value, ast.Name) and func.value.id in self.own_modules:
                pass
            elif self._is_client(func.value) or func.attr in self.operations:
                self.calls.append(S3Call(at, self.functions[-1], func.attr, _names_a_version(node)))
        self.generic_visit(node)


def _names_a_version(call: ast.Call) -> bool:
    """VersionId=..., or **x where x is a point-in-time view's arguments (`self._pinned(key)`, `pinned`,
    `req.version_args()`): the request may name a version, not the current object."""
    for k in call.keywords:
        if k.arg == "VersionId":
            return True
        if k.arg is None and re.search(r"pinned|version", ast.unparse(k.value), re.I):
            return True
    return False


def scan_source(source: str, where: str, operations: frozenset[str] | None = None) -> list[S3Call]:
    scanner = _Scanner(where, operations if operations is not None else s3_operations())
    scanner.visit(ast.parse(source, filename=where))
    return scanner.calls


def scan_store() -> list[S3Call]:
    ops = s3_operations()
    calls: list[S3Call] = []
    for path in sorted(STORE.glob("*.py")):
        calls += scan_source(path.read_text(), str(path.relative_to(ROOT)), ops)
    return calls


def worker_calls() -> list[S3Call]:
    return [c for c in scan_store() if c.method not in NOT_FOR_THE_WORKER]


def call_actions(c: S3Call) -> frozenset[str]:
    """The IAM actions one call site needs: its own entry in CALL_ACTIONS, else its method's."""
    return CALL_ACTIONS.get((c.function, c.method), METHOD_ACTIONS[c.method])


def needed_actions(
    calls: Iterable[S3Call], withheld: Mapping[tuple[str, str], tuple[frozenset[str], str]] | None = None
) -> set[str]:
    """What `calls` need, less what `withheld` says the role goes without at each call site."""
    none: tuple[frozenset[str], str] = (frozenset(), "")
    return {a for c in calls for a in call_actions(c) - (withheld or {}).get((c.function, c.method), none)[0]}


def worker_actions() -> set[str]:
    """What the worker (tier) role needs: every call it may make, less WITHHELD."""
    return needed_actions(worker_calls(), WITHHELD)


def _as_list(v: str | list[str]) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def granted(policy: dict[str, Any]) -> dict[str, set[str]]:
    """action -> resources it is allowed on."""
    out: dict[str, set[str]] = {}
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow", st
        assert "NotAction" not in st and "NotResource" not in st and "NotPrincipal" not in st, st
        for action in _as_list(st["Action"]):
            out.setdefault(action, set()).update(_as_list(st["Resource"]))
    return out


# -- the scan itself ------------------------------------------------------------------------------------


def test_every_s3_call_in_the_store_is_mapped_to_iam_actions() -> None:
    calls = scan_store()
    assert len(calls) > 20, "the scan found almost nothing: has the store moved?"
    unmapped = sorted({f"{c.method} ({c.where})" for c in calls if c.method not in METHOD_ACTIONS})
    assert not unmapped, (
        "S3 calls with no IAM mapping: add each to METHOD_ACTIONS in tests/infra/test_iam_policy.py and the "
        f"action to infra/terraform/worker-policy.json.tftpl: {', '.join(unmapped)}"
    )


def test_every_call_that_names_a_version_has_its_own_actions() -> None:
    """A read or delete by version id needs another action than the method's (s3:GetObjectVersion,
    s3:DeleteObjectVersion): each such call site is in CALL_ACTIONS, and each entry there is a call site
    that exists (a renamed function fails here, not silently back to the method's actions)."""
    calls = scan_store()
    versioned = sorted({(c.function, c.method) for c in calls if c.names_a_version})
    assert [v for v in versioned if v not in CALL_ACTIONS] == [], "calls naming a version: add them to CALL_ACTIONS"
    sites = {(c.function, c.method) for c in calls}
    assert [k for k in CALL_ACTIONS if k not in sites] == [], "CALL_ACTIONS names call sites the scan does not find"
    assert [k for k in WITHHELD if k not in CALL_ACTIONS] == [], "WITHHELD names only call sites of CALL_ACTIONS"
    # the ones we know of: the point-in-time reads, recover's marker removal, the lock probe's deletes
    assert {("head", "head_object"), ("read_range", "get_object"), ("_fetch_once", "get_object")} <= set(versioned)
    assert {("remove_delete_marker", "delete_object"), ("probe_enforced", "delete_object")} <= set(versioned)
    # the same method, two actions by the function: a plain delete and a marker's removal
    (delete,) = [c for c in calls if (c.function, c.method) == ("delete", "delete_object")]
    assert call_actions(delete) == {"s3:DeleteObject"} and not delete.names_a_version
    (marker,) = [c for c in calls if (c.function, c.method) == ("remove_delete_marker", "delete_object")]
    assert call_actions(marker) == {"s3:DeleteObjectVersion"}


def test_the_scanner_tells_a_call_that_names_a_version() -> None:
    source = """
def a(self, key):
    self.client.get_object(Bucket="b", Key=key, **self._pinned(key))
def b(self, key):
    self.client.delete_object(Bucket="b", Key=key, VersionId="v")
def c(req):
    req.client.get_object(Bucket="b", Key="k", **req.version_args())
def d(self, key):
    self.client.get_object(Bucket="b", Key=key, **self._put_args())
"""
    found = {c.function: c.names_a_version for c in scan_source(source, "example.py")}
    assert found == {"a": True, "b": True, "c": True, "d": False}


def test_calls_the_worker_must_not_make_stay_where_they_are() -> None:
    for c in scan_store():
        if c.method in NOT_FOR_THE_WORKER:
            allowed, why = NOT_FOR_THE_WORKER[c.method]
            assert c.function in allowed, f"{c.method} called from {c.function} ({c.where}): {why}"


def test_the_scan_sees_the_calls_we_know_of() -> None:
    methods = {c.method for c in scan_store()}
    # one of each way of calling: self.client.x, req.client.x, client.x (parameter), a local client
    # (quick.head_bucket in check_bucket), and both paginators
    assert {"head_object", "upload_part", "copy_object", "head_bucket", "list_objects_v2"} <= methods
    assert {"list_multipart_uploads", "restore_object", "put_bucket_lifecycle_configuration"} <= methods


def test_the_scanner_catches_a_new_call_however_it_is_written() -> None:
    source = """
def a(self):
    self.client.delete_bucket(Bucket="b")
def b(req):
    req.client.get_object_attributes(Bucket="b", Key="k", ObjectAttributes=[])
def c(client: "S3Client"):
    client.get_paginator("list_parts").paginate(Bucket="b", Key="k", UploadId="u")
def d(cfg):
    c = make_client(cfg, 2)
    c.put_bucket_policy(Bucket="b", Policy="{}")
def e(anything):
    anything.select_object_content(Bucket="b")
def not_s3(req):
    upload.upload_file(req)
    store.head("k")
def ours(req):
    from ckptvault.store import copy_stream
    copy_stream.copy_object(req, read, size=1, crc32c="", source="s")
"""
    found = {c.method: c.function for c in scan_source(source, "example.py")}
    assert found == {
        "delete_bucket": "a",
        "get_object_attributes": "b",
        "list_parts": "c",
        "put_bucket_policy": "d",
        "select_object_content": "e",
    }
    assert not set(found) & set(METHOD_ACTIONS), "these must be unmapped, so that adding one fails the test"


_S3_CLIENT_USE = re.compile(r"^\s*(import boto3|from boto3|import botocore|from botocore)|S3FileSystem|s3fs", re.M)


def test_only_the_store_package_talks_to_s3() -> None:
    """The scan covers ckptvault/store only: nothing else may reach S3 by another route."""
    offenders = []
    for package in ("ckptvault", "ckptvault_cli", "ckptvault_prefect"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if STORE in path.parents:
                continue
            if _S3_CLIENT_USE.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"S3 access outside ckptvault/store (not covered by the IAM scan): {offenders}"


# -- the policy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["prod", "", "teams/llm"])
def test_the_policy_grants_exactly_the_called_actions_on_the_right_resources(prefix: str) -> None:
    bucket = "acme-ckpts"
    policy = render_policy(bucket, prefix)
    assert policy["Version"] == "2012-10-17"
    grants = granted(policy)
    need = worker_actions()

    missing, extra = need - set(grants), set(grants) - need
    assert not missing, f"the code calls S3 APIs the policy does not allow: {sorted(missing)}"
    assert not extra, f"the policy grants actions the code never uses: {sorted(extra)}"
    assert not [a for a in grants if "*" in a or "?" in a], "no wildcard actions"

    bucket_arn = f"arn:aws:s3:::{bucket}"
    objects = f"{bucket_arn}/{prefix}/*" if prefix else f"{bucket_arn}/*"
    for action, resources in grants.items():
        want = bucket_arn if action in BUCKET_ACTIONS else objects
        assert resources == {want}, f"{action} on {sorted(resources)}, expected {want}"


# Where the library deletes from the store (outside ckptvault/store), and what: a new call site fails the
# test until someone decides which role may send it.
DELETERS: dict[str, str] = {
    # merged event files and old snapshots: the tier flow's compaction, and with deletes = "every-flow" the
    # ingest flow's too (GUARDED below: with "tier-only" the ingest flow's deletes nothing)
    "ckptvault/catalog/compaction.py": "_catalog/",
    "ckptvault/alerts/sending.py": "_state/",  # the alert state files a save folded (GUARDED likewise)
    "ckptvault/observe/ledger.py": "_state/",  # the metrics' ledger objects a record folded (GUARDED likewise)
    "ckptvault/tiering/apply.py": "checkpoints",  # tier --apply's expiry: the worker (tier) role only
}
# Besides ckptvault/tiering itself, the only module that may call the expiry: the tier flow's task.
EXPIRY_CALLERS = frozenset({"ckptvault_prefect/tasks/tier.py"})


def _library_files() -> list[Path]:
    return [
        p
        for package in ("ckptvault", "ckptvault_cli", "ckptvault_prefect")
        for p in sorted((ROOT / package).rglob("*.py"))
        if STORE not in p.parents
    ]


def test_only_the_known_modules_delete_from_the_store() -> None:
    sites: dict[str, list[int]] = {}
    for path in _library_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("delete", "delete_many")
            ):
                sites.setdefault(str(path.relative_to(ROOT)), []).append(node.lineno)
    assert set(sites) == set(DELETERS), (
        f"store deletes in {sites}; each module that deletes must be in DELETERS (tests/infra/test_iam_policy.py) "
        "with the keys it deletes, and those keys must be where its role's policy allows s3:DeleteObject"
    )


def _expiry_users(path: Path) -> bool:
    """Does the module call ckptvault.tiering.apply.expire (imported by name or through the module)?"""
    tree = ast.parse(path.read_text())
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "ckptvault.tiering.apply"
            and any(a.name == "expire" for a in node.names)
        ):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "ckptvault.tiering":
            aliases.update(a.asname or a.name for a in node.names if a.name == "apply")
    return any(
        isinstance(n, ast.Attribute) and n.attr == "expire" and isinstance(n.value, ast.Name) and n.value.id in aliases
        for n in ast.walk(tree)
    )


def test_the_expiry_is_reached_from_the_tier_flow_only() -> None:
    tiering = ROOT / "ckptvault" / "tiering"
    users = {str(p.relative_to(ROOT)) for p in _library_files() if tiering not in p.parents and _expiry_users(p)}
    assert users == EXPIRY_CALLERS, f"ckptvault.tiering.apply.expire called from {sorted(users)}"
    flows = ROOT / "ckptvault_prefect" / "flows"
    callers = {p.name for p in flows.glob("*.py") if "expire_task" in p.read_text()}
    assert callers == {"tier.py"}, (
        f"expire_task used by the flows {sorted(callers)}: only tier runs under the tier role"
    )


# Functions that delete, each with the parameter that turns its deletes off: every call of one in the
# shipped code passes that parameter, either as the switch itself (`<cfg>.store.flows_delete` or the store's
# `self.cfg.flows_delete`) or as the caller's own parameter of that name passed through. Only the calls in
# TIER_ROLE_CALLS may leave it out: they run under the tier role, which may delete.
GUARDED: dict[str, str] = {
    "compact": "deletes",  # Catalog.compact and ckptvault.catalog.compaction.compact
    "compact_catalog_task": "deletes",
    "save_alert_state": "delete",
    "record_ledger": "delete",
    "note_ledger": "delete",
    "ledger_task": "delete",
    "detect_capabilities": "delete",  # the capability probe's cleanup
    "probe_enforced": "cleanup",  # the Object Lock probe's cleanup (its delete by version is the probe)
}
TIER_ROLE_CALLS = frozenset(
    {
        ("ckptvault_prefect/flows/tier.py", "compact_catalog_task"),  # tier --apply's full compaction
        ("ckptvault/alerts/sending.py", "save_alert_state"),  # in fold_alert_state only (checked below)
        ("ckptvault_prefect/flows/tier.py", "ledger_task"),  # tier --apply's record folds the ledger
    }
)
# The tier flow's alert-state fold deletes whatever the switch says: only the tier flow may reach it.
TIER_ONLY = frozenset({"fold_alert_state", "fold_alert_state_task"})


def _shipped_files() -> list[Path]:
    packages = ("ckptvault", "ckptvault_cli", "ckptvault_prefect")
    return [p for package in packages for p in sorted((ROOT / package).rglob("*.py"))]


def _calls_in_functions(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """(innermost enclosing function name, call) for every call in the module."""
    out: list[tuple[str, ast.Call]] = []

    def walk(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                walk(child, child.name)
            else:
                if isinstance(child, ast.Call):
                    out.append((fn, child))
                walk(child, fn)

    walk(tree, "<module>")
    return out


def test_with_the_switch_no_flow_but_tier_reaches_a_delete() -> None:
    """`[store] deletes = "tier-only"`: ingest, drill, restore, hold/release and watch send no delete."""
    unguarded, tier_only, seen = [], [], set()
    for path in _shipped_files():
        rel = str(path.relative_to(ROOT))
        for fn, call in _calls_in_functions(ast.parse(path.read_text())):
            name = _callee(call.func)
            if name in TIER_ONLY:
                tier_only.append(f"{rel}:{call.lineno} in {fn}")
            if name not in GUARDED:
                continue
            seen.add(name)
            guard = GUARDED[name]
            value = next((k.value for k in call.keywords if k.arg == guard), None)
            switch = isinstance(value, ast.Attribute) and value.attr == "flows_delete"
            passed_on = isinstance(value, ast.Name) and value.id == guard
            if switch or passed_on:
                continue
            if (rel, name) in TIER_ROLE_CALLS and (name != "save_alert_state" or fn == "fold_alert_state"):
                continue
            unguarded.append(f"{rel}:{call.lineno}: {name}(...) in {fn} without {guard}=<...>.flows_delete")
    assert seen == set(GUARDED), f"calls not found any more (moved? renamed?): {set(GUARDED) - seen}"
    assert not unguarded, (
        "a call that may delete and does not pass the [store] deletes switch: under the ingest role (no "
        "s3:DeleteObject) it would be refused. Pass it, or list the call in TIER_ROLE_CALLS if only tier runs "
        f"it: {unguarded}"
    )
    # the fold is defined in sending.py, declared a task in tasks/notify.py and called by the tier flow only
    assert sorted(t.split(":")[0] for t in tier_only) == ["ckptvault_prefect/flows/tier.py"], tier_only
    flows = ROOT / "ckptvault_prefect" / "flows"
    no_delete_flows = [p for p in flows.glob("*.py") if p.name not in ("tier.py", "__init__.py")]
    assert {p.name for p in no_delete_flows} >= {"ingest.py", "drill.py", "restore.py", "watch.py"}
    for p in no_delete_flows:
        assert "expire_task" not in p.read_text() and "fold_alert_state" not in p.read_text(), p.name


# What only the tier role may be granted: every way to remove or expire an object, or to shorten what keeps
# it. s3:PutObjectRetention is not among them: without s3:BypassGovernanceRetention S3 lets it only lengthen a
# retention or add one (a COMPLIANCE date never moves back, a GOVERNANCE one only with the bypass header and
# that permission), and the ingest role needs it to lock each save as it is written ([lock]) and to raise a
# milestone's lock. s3:PutObjectLegalHold stays too (`ckptvault hold`/`release` run under the ingest role):
# releasing a hold deletes nothing, and a delete still needs this list's actions.
DESTRUCTIVE = frozenset(
    {
        "s3:DeleteObject",
        "s3:DeleteObjectVersion",
        "s3:DeleteBucket",
        "s3:PutLifecycleConfiguration",  # an Expiration rule removes every unlocked object
        "s3:PutBucketLifecycle",  # its older name, still accepted in policies
        "s3:BypassGovernanceRetention",  # shortens or removes a GOVERNANCE lock
        "s3:PutBucketObjectLockConfiguration",  # the bucket's default retention
        "s3:PutBucketVersioning",  # suspended versioning: an overwrite replaces the only copy
        "s3:PutBucketPolicy",  # a policy may grant any of these
        "s3:DeleteBucketPolicy",
        "s3:PutReplicationConfiguration",  # replicates delete markers elsewhere
    }
)


def destructive_grants(policy: dict[str, Any]) -> list[str]:
    """Each Allow in `policy` that grants one of DESTRUCTIVE, however written: a wildcard (`s3:*`, `s3:Put*`,
    `*`), another case (IAM action names are case-insensitive), or a NotAction (which allows everything it
    does not name). Empty: the policy cannot delete, expire or shorten anything."""
    found = []
    for i, st in enumerate(policy["Statement"]):
        if st.get("Effect") != "Allow":
            continue
        where = st.get("Sid", f"statement {i}")
        if "NotAction" in st:
            excluded = {a.lower() for a in _as_list(st["NotAction"])}
            found += [f"{where}: NotAction allows {a}" for a in sorted(DESTRUCTIVE) if a.lower() not in excluded]
            continue
        for pattern in _as_list(st.get("Action", [])):
            found += [
                f"{where}: {pattern} allows {a}" for a in sorted(DESTRUCTIVE) if fnmatchcase(a.lower(), pattern.lower())
            ]
    return found


def _all_non_tier_policies(prefix: str) -> dict[str, dict[str, Any]]:
    """The ingest and replica policies as Terraform renders them, the replica's with replica.tf's lock
    statement (replica_object_lock = true), the one place that adds actions outside a template."""
    replica = render_policy("acme-dr", prefix, template=REPLICA_TEMPLATE)
    lock = {"Sid": "LockTheCopies", "Effect": "Allow", "Action": sorted(REPLICA_LOCK_ACTIONS),
            "Resource": "arn:aws:s3:::acme-dr/*"}  # fmt: skip
    return {
        "ingest": render_policy("acme-ckpts", prefix, template=INGEST_TEMPLATE),
        "replica": replica,
        "replica with Object Lock": {**replica, "Statement": [*replica["Statement"], lock]},
    }


@pytest.mark.parametrize("prefix", ["prod", ""])
def test_no_policy_but_the_tiers_can_delete_expire_or_shorten_anything(prefix: str) -> None:
    for name, policy in _all_non_tier_policies(prefix).items():
        assert destructive_grants(policy) == [], name
    # the tier role's may delete, and the check sees it: the check is not blind
    assert destructive_grants(render_policy("acme-ckpts", prefix)) == [
        "BucketUploadsAndLifecycle: s3:PutLifecycleConfiguration allows s3:PutLifecycleConfiguration",
        "CheckpointObjects: s3:DeleteObject allows s3:DeleteObject",
    ]


@pytest.mark.parametrize(
    "planted",
    [
        {"Action": "s3:DeleteObjectVersion"},
        {"Action": ["s3:GetObject", "s3:PutLifecycleConfiguration"]},
        {"Action": "s3:PutBucketLifecycle"},
        {"Action": "s3:bypassGovernanceRetention"},
        {"Action": "s3:Put*"},
        {"Action": "s3:Delete*"},
        {"Action": "s3:*"},
        {"Action": "*"},
        {"NotAction": ["s3:GetObject"]},
    ],
)
@pytest.mark.parametrize("policy", ["ingest", "replica", "replica with Object Lock"])
def test_the_check_catches_a_planted_grant(policy: str, planted: dict[str, Any]) -> None:
    clean = _all_non_tier_policies("prod")[policy]
    st = {"Sid": "Planted", "Effect": "Allow", "Resource": "*", **planted}
    found = destructive_grants({**clean, "Statement": [*clean["Statement"], st]})
    assert found and all(f.startswith("Planted: ") for f in found), found
    # a Deny of the same is no grant
    assert destructive_grants({**clean, "Statement": [*clean["Statement"], {**st, "Effect": "Deny"}]}) == []


@pytest.mark.parametrize("prefix", ["prod", "", "teams/llm"])
def test_the_ingest_policy_is_the_worker_policy_without_any_delete(prefix: str) -> None:
    worker = granted(render_policy("acme-ckpts", prefix))
    ingest = granted(render_policy("acme-ckpts", prefix, template=INGEST_TEMPLATE))
    assert not [a for a in ingest if a.startswith("s3:Delete") or "Bypass" in a], sorted(ingest)
    # nor a lifecycle write: an expiration rule would delete as surely ([store] lifecycle = "external")
    assert ingest == {a: r for a, r in worker.items() if a not in ("s3:DeleteObject", "s3:PutLifecycleConfiguration")}
    assert "s3:GetLifecycleConfiguration" in ingest and "s3:PutObjectRetention" in ingest
    # the tier role may delete, and only under the prefix
    key_prefix = f"{prefix}/" if prefix else ""
    assert worker["s3:DeleteObject"] == {f"arn:aws:s3:::acme-ckpts/{key_prefix}*"}
    never = {"s3:DeleteObjectVersion", "s3:BypassGovernanceRetention", "s3:PutBucketObjectLockConfiguration",
             "s3:PutBucketVersioning", "s3:DeleteBucket"}  # fmt: skip
    assert not never & (set(worker) | set(ingest))


# A replica's credentials: the action -> what sends it to the replica. The lock's two are added by
# replica.tf with replica_object_lock (a PutObject carrying a retention or a legal hold needs them).
REPLICA_ACTIONS: dict[str, str] = {
    "s3:ListBucket": "the bucket check (HeadBucket), the pass's listing of a save, a restore's LIST",
    "s3:ListBucketMultipartUploads": "the pass finds a killed pass's incomplete uploads",
    "s3:GetBucketObjectLockConfiguration": "the [lock] check of the bucket, and repair's",
    "s3:GetLifecycleConfiguration": 'each pass checks Terraform\'s retention rule (lifecycle = "external")',
    "s3:AbortMultipartUpload": "the pass aborts those uploads, and its own on a failed copy",
    "s3:GetObject": "HEAD (kept objects of a rerun, scrub), scrub's read-back, repair's source, restore",
    "s3:GetObjectTagging": "scrub reads the crc32c tag of a multipart object",
    "s3:PutObject": "the copies, the manifest last, and repair",
    "s3:PutObjectTagging": "the crc32c tag on a multipart copy once verified",
    "s3:RestoreObject": "a restore or drill reading an archived copy thaws it",
    "s3:PutObjectRetention": "[lock]: each copy locked as its save (replica_object_lock)",
    "s3:PutObjectLegalHold": "[lock]: a held save's copy held too, and repair's (replica_object_lock)",
}
REPLICA_LOCK_ACTIONS = frozenset({"s3:PutObjectRetention", "s3:PutObjectLegalHold"})


@pytest.mark.parametrize("prefix", ["dr", "", "teams/dr"])
def test_the_replica_policy_grants_what_a_replica_is_sent_and_never_a_delete(prefix: str) -> None:
    grants = granted(render_policy("acme-dr", prefix, template=REPLICA_TEMPLATE))
    assert set(grants) == set(REPLICA_ACTIONS) - REPLICA_LOCK_ACTIONS, sorted(grants)
    # every action granted is one the store's code calls: nothing stale, no wildcard
    assert set(REPLICA_ACTIONS) <= worker_actions(), set(REPLICA_ACTIONS) - worker_actions()
    never = {a for a in needed_actions(scan_store()) if a.startswith("s3:Delete")} | {"s3:PutLifecycleConfiguration"}
    # deletes never travel: the replica's own lifecycle rules (its abort rule, expire_after_days) expire
    # what goes, and Terraform installs them (replica.tf), not these credentials
    assert never == {"s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutLifecycleConfiguration"}
    assert not never & set(REPLICA_ACTIONS)
    bucket_arn = "arn:aws:s3:::acme-dr"
    objects = f"{bucket_arn}/{prefix}/*" if prefix else f"{bucket_arn}/*"
    for action, resources in grants.items():
        assert resources == {bucket_arn if action in BUCKET_ACTIONS else objects}, (action, resources)
    (listing,) = [st for st in render_policy("acme-dr", prefix, template=REPLICA_TEMPLATE)["Statement"]
                  if "s3:ListBucket" in _as_list(st["Action"])]  # fmt: skip
    assert listing["Condition"] == {"StringLikeIfExists": {"s3:prefix": [f"{prefix}/*" if prefix else "*"]}}
    # the replica.tf lock statement grants the other two, on the objects
    tf = (TERRAFORM / "replica.tf").read_text()
    assert 'Action   = ["s3:PutObjectLegalHold", "s3:PutObjectRetention"]' in tf
    assert sorted(REPLICA_LOCK_ACTIONS) == ["s3:PutObjectLegalHold", "s3:PutObjectRetention"]


# -- the break-glass role: `ckptvault recover --since TIME --apply` ------------------------------------------
# Which S3 calls recover --apply can send is computed: the ObjectStore methods called in the functions of its
# path (RECOVER_APPLY_PATH: the command, its preflight and view, the plan and its carrying out), then every
# function of the S3 adapter (ckptvault/store, not the in-memory store) those reach by name, transitively;
# the calls the scan finds in those functions are what the role needs. By name, so it errs towards more
# (a function sharing a name with one on the path counts), never towards fewer.
RECOVER_APPLY_PATH: dict[str, frozenset[str] | None] = {  # module -> its functions on the path (None: all)
    "ckptvault_cli/commands/recover.py": None,
    "ckptvault_cli/preflight.py": frozenset({"preflight_store", "past_view"}),  # need_sources=False
    "ckptvault/command/memo.py": frozenset({"checked_store"}),
    "ckptvault/history/view.py": None,
    "ckptvault/history/recovery.py": None,
    "ckptvault/history/apply.py": None,
    "ckptvault/history/created.py": None,  # the verdict on each key written since
    "ckptvault/history/tamper.py": frozenset({"crc"}),  # a version's CRC32C, for the put-back content check
}
# What the break-glass role goes without although a function on the path may send it.
RECOVER_WITHHELD: dict[tuple[str, str], tuple[frozenset[str], str]] = {
    ("_cleanup", "delete_object"): (
        frozenset({"s3:DeleteObject"}),
        'the capability probe\'s cleanup, sent only with [store] deletes = "every-flow"; the config recover '
        'runs with says "tier-only" (Terraform\'s store_config): it leaves its probe objects, as ingest does',
    ),
}
# The break-glass policy, action -> what on recover --apply's path sends it (the test checks this table
# against the computed set, and the template against both).
RECOVER_ACTIONS: dict[str, str] = {
    "s3:ListBucket": "the bucket check (HeadBucket) of every command's preflight",
    "s3:ListBucketVersions": "the plan: every version and delete marker under the prefix, and each pinned read",
    "s3:GetBucketVersioning": "the refusal of a bucket that keeps no versions",
    "s3:GetLifecycleConfiguration": "the warning when --since is older than the noncurrent versions are kept",
    "s3:GetBucketObjectLockConfiguration": "a write into a bucket with a default retention (its date)",
    "s3:GetObject": "HEAD and GET of the current objects: the capability probe, a put-back copy's verification",
    "s3:GetObjectVersion": "the versions read by id: the save's first manifest, the version put back, its lock",
    "s3:GetObjectRetention": "a version's retention, read on its HEAD, to lock its put-back copy as it was",
    "s3:GetObjectLegalHold": "a version's legal hold, read on its HEAD, to hold its put-back copy as it was",
    "s3:DeleteObjectVersion": "the removal of a delete marker, by its version id (never a data version)",
    "s3:PutObject": "the put-back copy (one PUT, or a multipart upload), and the capability probe",
    "s3:PutObjectTagging": "the crc32c tag of a multipart copy where the server keeps no CRC32C",
    "s3:AbortMultipartUpload": "a copy whose bytes do not match the manifest is aborted, not completed",
    "s3:PutObjectRetention": "the copy locked as the version it copies was (the write's lock, or raised after)",
    "s3:PutObjectLegalHold": "the copy held as the version it copies was",
    "s3:RestoreObject": "the capability probe asks whether the server implements RestoreObject",
}


def _store_methods() -> frozenset[str]:
    tree = ast.parse((STORE / "port.py").read_text())
    (port,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ObjectStore"]
    return frozenset(n.name for n in port.body if isinstance(n, ast.FunctionDef))


def recover_path_roots(path: Mapping[str, frozenset[str] | None] = RECOVER_APPLY_PATH) -> set[str]:
    """The ObjectStore methods the functions of `path` call."""
    methods, roots = _store_methods(), set()
    for module, functions in path.items():
        tree = ast.parse((ROOT / module).read_text())
        found = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert functions is None or functions <= set(found), f"{module}: no {sorted(set(functions or ()) - set(found))}"
        for name, node in found.items():
            if functions is None or name in functions:
                roots |= {c.func.attr for c in ast.walk(node) if isinstance(c, ast.Call)
                          and isinstance(c.func, ast.Attribute) and c.func.attr in methods}  # fmt: skip
    return roots


def _adapter_calls_by_function() -> dict[str, set[str]]:
    """function name -> the names it calls, over ckptvault/store's S3 side (not the in-memory store)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(STORE.glob("*.py")):
        if path.name.startswith("memory"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                called = {_callee(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
                graph.setdefault(node.name, set()).update(n for n in called if n)
    return graph


def recover_apply_calls(path: Mapping[str, frozenset[str] | None] = RECOVER_APPLY_PATH) -> list[S3Call]:
    """The S3 calls of every adapter function the path reaches."""
    graph, seen, todo = _adapter_calls_by_function(), set(), sorted(recover_path_roots(path))
    while todo:
        name = todo.pop()
        if name in graph and name not in seen:
            seen.add(name)
            todo += sorted(graph[name])
    return [c for c in scan_store() if c.function in seen and not Path(c.where).name.startswith("memory")]


def test_the_recover_path_is_the_one_we_scan() -> None:
    roots = recover_path_roots()
    # what recover --apply does to the store: the check, the view, the plan, and the three kinds of step
    assert {"check_bucket", "versioning", "get_lifecycle", "as_of", "list_versions", "pinned"} <= roots
    assert {"remove_delete_marker", "copy_from", "with_retention", "extend_retention", "put_legal_hold"} <= roots
    sites = {(c.function, c.method) for c in recover_apply_calls()}
    assert {("remove_delete_marker", "delete_object"), ("read_range", "get_object"), ("head", "head_object")} <= sites
    assert {
        ("put_single", "put_object"),
        ("create_upload", "create_multipart_upload"),
        ("abort", "abort_multipart_upload"),
    } <= sites
    # and not what it never does: a plain delete, a lifecycle write, a storage-class move, the lock probe
    never = {
        ("delete", "delete_object"),
        ("delete_many", "delete_objects"),
        ("put_lifecycle", "put_bucket_lifecycle_configuration"),
        ("copy_in_place", "copy_object"),
        ("probe_enforced", "delete_object"),
    }
    assert not sites & never, sorted(sites & never)
    assert [k for k in RECOVER_WITHHELD if k not in sites] == [], "RECOVER_WITHHELD names a call not on the path"


def recover_actions() -> set[str]:
    return needed_actions(recover_apply_calls(), RECOVER_WITHHELD)


def test_recover_without_apply_needs_only_the_ingest_role() -> None:
    """The dry run (the plan, and its content check of each put-back candidate) reads only: the ingest role
    runs it, as it runs `restore --as-of` and `ls --as-of`; the break-glass role is for --apply alone."""
    dry_run = {**RECOVER_APPLY_PATH, "ckptvault/history/apply.py": frozenset({"__call__"})}
    roots = recover_path_roots(dry_run)
    assert {"list_versions", "pinned", "read_crc32c"} <= roots
    assert not roots & {"remove_delete_marker", "copy_from", "extend_retention", "put_legal_hold"}, roots
    need = needed_actions(recover_apply_calls(dry_run))
    ingest = set(granted(render_policy("acme-ckpts", "prod", template=INGEST_TEMPLATE)))
    assert need <= ingest, sorted(need - ingest)
    assert {"s3:ListBucketVersions", "s3:GetObjectVersion"} <= need and not {a for a in need if "Put" in a}


@pytest.mark.parametrize("prefix", ["prod", "", "teams/llm"])
def test_the_break_glass_policy_grants_exactly_what_recover_apply_calls(prefix: str) -> None:
    need = recover_actions()
    assert need == set(RECOVER_ACTIONS), (
        f"recover --apply's calls need {sorted(need - set(RECOVER_ACTIONS))} beyond RECOVER_ACTIONS and no longer "
        f"{sorted(set(RECOVER_ACTIONS) - need)}: update RECOVER_ACTIONS and infra/terraform/recover-policy.json.tftpl"
    )
    policy = render_policy("acme-ckpts", prefix, template=RECOVER_TEMPLATE)
    grants = granted(policy)
    assert set(grants) == need, (sorted(need - set(grants)), sorted(set(grants) - need))
    bucket_arn = "arn:aws:s3:::acme-ckpts"
    objects = f"{bucket_arn}/{prefix}/*" if prefix else f"{bucket_arn}/*"
    for action, resources in grants.items():
        assert resources == {bucket_arn if action in BUCKET_ACTIONS else objects}, (action, resources)
    (listing,) = [st for st in policy["Statement"] if "s3:ListBucket" in _as_list(st["Action"])]
    assert listing["Condition"] == {"StringLikeIfExists": {"s3:prefix": [f"{prefix}/*" if prefix else "*"]}}
    # it removes delete markers and nothing else: no plain delete (a delete marker of its own), no bypass of a
    # lock, no lifecycle or bucket setting; the one destructive grant the check sees is the version delete
    assert destructive_grants(policy) == [
        "PutBackAndRelockCheckpointObjects: s3:DeleteObjectVersion allows s3:DeleteObjectVersion"
    ]


@pytest.mark.parametrize("prefix", ["prod", "", "teams/llm"])
def test_only_the_break_glass_role_may_delete_a_version(prefix: str) -> None:
    """The worker and ingest roles never delete a version, though the code they run holds calls that do:
    WITHHELD says why each still works without it."""
    for template in (WORKER_TEMPLATE, INGEST_TEMPLATE, REPLICA_TEMPLATE):
        grants = granted(render_policy("acme-ckpts", prefix, template=template))
        assert "s3:DeleteObjectVersion" not in grants and "s3:BypassGovernanceRetention" not in grants, template.name
    assert "s3:DeleteObjectVersion" not in worker_actions() and "s3:DeleteObjectVersion" in needed_actions(scan_store())
    assert "s3:DeleteObjectVersion" in granted(render_policy("acme-ckpts", prefix, template=RECOVER_TEMPLATE))
    # the point-in-time reads (restore --as-of, ls --as-of, a drill, scrub's tamper check) are the roles' own
    for template in (WORKER_TEMPLATE, INGEST_TEMPLATE):
        grants = granted(render_policy("acme-ckpts", prefix, template=template))
        assert {"s3:GetObjectVersion", "s3:ListBucketVersions", "s3:GetObjectRetention"} <= set(grants), template.name


@pytest.mark.parametrize("template", [WORKER_TEMPLATE, INGEST_TEMPLATE, REPLICA_TEMPLATE])
def test_the_seaweedfs_translation_widens_nothing_on_the_objects(template: Path) -> None:
    """`make up`'s users (infra/local/roles.py) get the templates translated for SeaweedFS: the wildcards that
    stand in for the lifecycle actions stay on the bucket ARN, no object action is added (the ingest user
    still cannot delete), and only the listing's IfExists condition goes."""
    policy = render_policy("ckpts", "local", template=template)
    seaweed = for_seaweedfs(policy)
    bucket, objects = "arn:aws:s3:::ckpts", "arn:aws:s3:::ckpts/local/*"
    before, after = granted(policy), granted(seaweed)
    on_objects = {a for a, r in after.items() if objects in r}
    assert on_objects == {a for a, r in before.items() if objects in r} - {"s3:RestoreObject"}
    tier = template == WORKER_TEMPLATE
    # s3:Put* stands in for the lifecycle write, which only the tier role has: the ingest user gets no s3:Put*
    assert {a for a in after if "*" in a} == {"s3:Get*", "s3:List*"} | ({"s3:Put*"} if tier else set())
    assert all(after[a] == {bucket} for a in after if "*" in a)
    assert ("s3:DeleteObject" in after) == tier
    assert (destructive_grants(seaweed) == []) == (not tier)  # make up's ingest user cannot expire either
    assert [st.get("Condition") for st in seaweed["Statement"]] == [None] * len(seaweed["Statement"])


def test_list_bucket_is_limited_to_the_prefix() -> None:
    policy = render_policy("acme-ckpts", "prod")
    (listing,) = [st for st in policy["Statement"] if "s3:ListBucket" in _as_list(st["Action"])]
    # both listings take s3:prefix: the objects, and their versions (point-in-time reads, the tamper check)
    assert _as_list(listing["Action"]) == ["s3:ListBucket", "s3:ListBucketVersions"]
    # IfExists: HeadBucket (check_bucket, kind detection) is authorised by s3:ListBucket and has no prefix
    assert listing["Condition"] == {"StringLikeIfExists": {"s3:prefix": ["prod/*"]}}


def test_the_bucket_lifecycle_rules_match_the_code() -> None:
    """Terraform owns the lifecycle configuration; its rules must be the ones the flows look for, or the
    ingest flow rewrites the configuration on every pass (and Terraform reverts it)."""
    from ckptvault.store import ABORT_MPU_RULE_NAME
    from ckptvault.store.lifecycle import rule_id
    from ckptvault.tiering.apply import TIER_TAG, lifecycle_rules

    main = (TERRAFORM / "main.tf").read_text()
    # Terraform's IDs are rule_id's: "ckptvault-<name>" plus "-<prefix>" when there is a prefix
    assert 'rule_suffix       = var.prefix == "" ? "" : "-${var.prefix}"' in main
    assert f'abort_mpu_rule_id = "{rule_id(ABORT_MPU_RULE_NAME, "")}${{local.rule_suffix}}"' in main
    assert rule_id(ABORT_MPU_RULE_NAME, "prod") == rule_id(ABORT_MPU_RULE_NAME, "") + "-prod"
    assert '"ckptvault-tier-${rule.key}${local.rule_suffix}"' in main and f'"{TIER_TAG}" = rule.key' in main
    (rule,) = lifecycle_rules("prod", {"cold": "GLACIER"}, ["cold"])
    assert rule["ID"] == "ckptvault-tier-cold-prod"
    assert rule["Filter"]["And"]["Tags"] == [{"Key": TIER_TAG, "Value": "cold"}]
    assert rule["Filter"]["And"]["Prefix"] == "prod/"
    for setting in ("versioning_configuration", "block_public_acls", "restrict_public_buckets", "aws:kms"):
        assert setting in main, setting
    assert "days_after_initiation = var.abort_incomplete_multipart_days" in main


# -- Terraform itself: skipped where it is not installed, failed then with CI=true -------------------------

PLUGIN_DIRS = [os.environ.get("CKPTVAULT_TF_PLUGIN_DIR", ""), "/opt/tf-plugins"]
AWS_PROVIDER = "registry.terraform.io/hashicorp/aws"
TERRAFORM_INSTALL = (
    "not in Debian's archive nor on PyPI: put HashiCorp's terraform (>= 1.5) on PATH (infra/terraform/README.md)"
)


def provider_mirror() -> str | None:
    return next((d for d in PLUGIN_DIRS if d and (Path(d) / AWS_PROVIDER).is_dir()), None)


@pytest.fixture(scope="module")
def terraform_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of infra/terraform, initialised from a local provider mirror (no registry download)."""
    require_tool("terraform", TERRAFORM_INSTALL)
    plugins = provider_mirror()
    if plugins is None:
        missing_tool(
            f"no local mirror of the hashicorp/aws provider ({AWS_PROVIDER} under any of "
            f"{', '.join(d for d in PLUGIN_DIRS if d)}): set CKPTVAULT_TF_PLUGIN_DIR to one "
            "(`terraform providers mirror DIR` in infra/terraform, with network access once)"
        )
    work = tmp_path_factory.mktemp("terraform")
    for f in TERRAFORM.iterdir():
        if f.suffix in (".tf", ".tftpl") or f.name == ".terraform.lock.hcl":
            shutil.copy(f, work / f.name)
    shutil.copytree(TERRAFORM / "tests", work / "tests")
    # With the committed lock file in place, init checks the mirror's provider against its hash: a lock
    # file that does not match the provider tested here fails this init.
    _terraform(work, "init", "-backend=false", "-input=false", "-lockfile=readonly", f"-plugin-dir={plugins}")
    return work


def _terraform(cwd: Path, *args: str, stdin: str | None = None) -> str:
    env = {
        **os.environ,
        "TF_IN_AUTOMATION": "1",
        "CHECKPOINT_DISABLE": "1",  # no version check over the network
        "TF_CLI_CONFIG_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",  # never look for instance credentials
    }
    proc = subprocess.run(
        ["terraform", *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, f"terraform {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_terraform_validate_and_fmt(terraform_dir: Path) -> None:
    assert "The configuration is valid" in _terraform(terraform_dir, "validate", "-no-color")
    _terraform(terraform_dir, "fmt", "-check", "-diff", "-no-color")


@pytest.mark.parametrize(
    ("local", "template"),
    [("worker_policy", TEMPLATE), ("ingest_policy", INGEST_TEMPLATE), ("recover_policy", RECOVER_TEMPLATE)],
)
@pytest.mark.parametrize("kms", [None, "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"])
def test_terraform_renders_the_policy_the_test_checks(
    terraform_dir: Path, kms: str | None, local: str, template: Path
) -> None:
    args = ["console", "-no-color", "-var", "region=us-east-1", "-var", "bucket_name=acme-ckpts", "-var", "prefix=prod"]
    if kms:
        args += ["-var", f"sse_kms_key_arn={kms}"]
    out = _terraform(terraform_dir, *args, stdin=f"local.{local}\n")
    policy = json.loads(json.loads(out.strip()))  # console prints the JSON string as an HCL string literal
    statements = policy["Statement"]
    kms_statements = [st for st in statements if any(a.startswith("kms:") for a in _as_list(st["Action"]))]
    s3_only = {**policy, "Statement": [st for st in statements if st not in kms_statements]}
    assert s3_only == render_policy("acme-ckpts", "prod", template=template)
    if kms:
        assert kms_statements == [
            {"Sid": "UseTheBucketKmsKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
             "Resource": kms}
        ]  # fmt: skip
    else:
        assert kms_statements == []


@pytest.mark.parametrize("lock", [False, True])
def test_terraform_renders_the_replica_policy_the_test_checks(terraform_dir: Path, lock: bool) -> None:
    args = ["console", "-no-color", "-var", "region=us-east-1", "-var", "bucket_name=acme-ckpts"]
    args += ["-var", "replica_bucket_name=acme-dr"]
    args += ["-var", "replica_prefix=dr", "-var", f"replica_object_lock={str(lock).lower()}"]
    out = _terraform(terraform_dir, *args, stdin="local.replica_policy\n")
    policy = json.loads(json.loads(out.strip()))
    statements = policy["Statement"]
    lock_statements = [st for st in statements if st.get("Sid") == "LockTheCopies"]
    base = {**policy, "Statement": [st for st in statements if st not in lock_statements]}
    assert base == render_policy("acme-dr", "dr", template=REPLICA_TEMPLATE)
    want = [{"Sid": "LockTheCopies", "Effect": "Allow", "Action": sorted(REPLICA_LOCK_ACTIONS),
             "Resource": "arn:aws:s3:::acme-dr/dr/*"}]  # fmt: skip
    assert lock_statements == (want if lock else [])
    assert set(granted(policy)) == set(REPLICA_ACTIONS) - (set() if lock else REPLICA_LOCK_ACTIONS)


# `terraform test` (infra/terraform/tests/*.tftest.hcl): Terraform's mock providers plan the example and a
# variant with Object Lock, a replica and KMS, and check the two roles' trust and policies; offline.
TFTEST_RUNS = (
    "example",
    "object_lock_replica_and_kms",
    "noncurrent_versions_outlive_the_lock",
    "noncurrent_versions_without_a_lock",
    "each_role_gets_its_own_policy",
    "without_a_cluster_no_roles",
    "a_default_retention_needs_a_mode_and_days",
    "lock_modes_are_spelt_as_in_the_config",
    "the_oidc_provider_is_an_arn",
    "the_break_glass_role",
    "without_principals_no_break_glass_role",
    "break_glass_principals_are_iam_arns",
)


def test_terraform_test_with_mock_providers(terraform_dir: Path) -> None:
    out = _terraform(terraform_dir, "test", "-no-color")
    for run in TFTEST_RUNS:
        assert f'run "{run}"... pass' in out, out[-3000:]
    assert f"Success! {len(TFTEST_RUNS)} passed, 0 failed." in out, out[-3000:]


def test_the_lock_file_pins_the_tested_provider_within_the_constraint() -> None:
    lock = (TERRAFORM / ".terraform.lock.hcl").read_text()
    versions = (TERRAFORM / "versions.tf").read_text()
    assert 'version = ">= 5.0, < 6.0"' in versions
    (pinned,) = re.findall(r'version\s+=\s+"([0-9.]+)"', lock)
    assert int(pinned.split(".")[0]) == 5, pinned
    plugins = provider_mirror()
    if plugins is not None:  # the version the mirror holds is the one every test here ran
        assert (Path(plugins) / AWS_PROVIDER / pinned).is_dir(), (
            pinned,
            sorted((Path(plugins) / AWS_PROVIDER).iterdir()),
        )


def test_the_backend_example_is_a_valid_backend(terraform_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "with-backend"
    shutil.copytree(terraform_dir, work, ignore=shutil.ignore_patterns("tests"))
    shutil.copy(TERRAFORM / "backend.tf.example", work / "backend.tf")
    # -backend=false: the backend block is parsed and checked, no state bucket is reached
    _terraform(work, "init", "-backend=false", "-input=false", "-lockfile=readonly", f"-plugin-dir={provider_mirror()}")
    assert "The configuration is valid" in _terraform(work, "validate", "-no-color")
    _terraform(work, "fmt", "-check", "-no-color", "backend.tf")
