"""The TOML configuration, as pydantic models. Every error names the key and the fix.

Credentials never live here: the S3 side uses boto3's standard chain (environment, profile, role),
Slack uses an environment variable or a Prefect Secret block named in `[notify]`.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import string
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ckptvault.checkpoint.layout_names import LAYOUT_NAMES
from ckptvault.errors import CkptvaultError, InvalidArgumentError

ENV_VAR = "CKPTVAULT_CONFIG"
# "auto": each file stored as shuffle-zstd frames when a sample of it compresses (docs/FORMAT.md,
# "Compressed files"); "off": every object is the file, byte for byte, readable by any S3 tool.
Compression = Literal["auto", "off"]


class ConfigError(CkptvaultError):
    """A configuration problem, phrased for the operator: what is wrong, where, and how to fix it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreConfig(_Strict):
    """`[store]`: the bucket every checkpoint, manifest and catalog object goes into, and how to reach it."""

    bucket: Annotated[str, Field(min_length=3, max_length=63)] = Field(
        description="The bucket (it must exist: ckptvault never creates one); credentials come from boto3's "
        "standard chain (environment, profile, role), never from this file."
    )
    prefix: str = Field(
        default="",
        description="A key prefix inside the bucket, so that one bucket holds several deployments; "
        "slashes at either end are dropped.",
    )
    endpoint_url: str | None = Field(
        default=None, description="The S3 endpoint, e.g. `http://127.0.0.1:7480` for Ceph RGW; unset: AWS."
    )
    region: str = Field(default="us-east-1", description="The region requests are signed for.")
    kind: Literal["auto", "aws", "ceph", "seaweedfs", "minio", "moto"] = Field(
        default="auto",
        description="The server's kind (storage classes, defaults, quirks); `auto` guesses it from the "
        "response headers of a HEAD of the bucket.",
    )
    verify_tls: bool = Field(
        default=True, description="Verify the endpoint's TLS certificate; `false` only for a throw-away test cluster."
    )
    ca_bundle: str | None = Field(
        default=None,
        description="A CA bundle (PEM) to verify the endpoint's certificate with, e.g. a Ceph cluster's own CA.",
    )
    sse: Literal["none", "AES256", "aws:kms"] = Field(
        default="none",
        description="Server-side encryption of every object written: SSE-S3 (`AES256`) or SSE-KMS "
        "(`aws:kms`, with `sse_kms_key_id`).",
    )
    sse_kms_key_id: str | None = Field(
        default=None, description='The KMS key of `sse = "aws:kms"`; unset: the bucket\'s default key.'
    )
    part_size_mb: Annotated[int, Field(ge=5, le=5120)] = Field(
        default=32, description="The multipart upload part size and the ranged GET size, in MiB."
    )
    max_concurrency: Annotated[int, Field(ge=1, le=64)] = Field(
        default=4,
        description="Parts in flight per file; a restore shares 4 x this many connections among all its files.",
    )
    buffer_mb: Annotated[int, Field(ge=5)] | None = Field(
        default=None,
        description="Upload part buffers for the whole process, in MiB; unset: `part_size_mb` x "
        "(`max_concurrency` + 1). Must hold at least one part.",
    )
    # Restores write around the page cache (O_DIRECT) where the filesystem allows it: less CPU, and a
    # restore does not push out pages other jobs are using. Off: every write goes through the cache.
    direct_io: bool = Field(
        default=True,
        description="Restores write around the page cache (O_DIRECT) where the file system allows it; "
        "`false`: every write goes through the cache.",
    )
    # SHA-256 of every request body in its SigV4 signature: "auto" only over plain HTTP, where it is
    # the sole guard against a body changed on the way (TLS guards it otherwise, and CRC32C checks
    # every byte against corruption either way); "always" also over TLS; "never" not even over HTTP.
    sign_payload: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="SHA-256 of every request body in its signature: `auto` over plain HTTP only (TLS "
        "guards the body otherwise; CRC32C checks every byte either way), `always` also over TLS, `never` not even "
        "over HTTP (a network you trust).",
    )
    # Where restores read from, for the egress price in their estimate: "in-region" (the training
    # cluster beside the bucket: free on AWS; on-prem stores have no egress) or "internet".
    egress: Literal["in-region", "internet"] = Field(
        default="in-region",
        description="Where restores read from, for the egress price in their estimate: `in-region` "
        "(the training cluster beside the bucket) or `internet`.",
    )
    # Off by default while buckets are read by plain S3 tools or by ckptvault versions that cannot
    # decode frames (docs/compression.md); one source can turn it on with its own `compression`.
    compression: Compression = Field(
        default="off",
        description="`auto`: files that compress are stored as shuffle-zstd frames (docs/compression.md); "
        "`off`: every object is the file, byte for byte. A source's own `compression` wins.",
    )

    # Who may delete (docs/OPERATIONS.md, "Two roles"): with "tier-only" every flow but `tier` runs with
    # credentials that have no s3:DeleteObject (the Terraform ingest role), so their bookkeeping writes
    # without deleting and the tier flow clears what they leave.
    deletes: Literal["every-flow", "tier-only"] = Field(
        default="every-flow",
        description="`tier-only`: only `tier` deletes anything; `ingest`, `drill`, `restore`, `hold`/`release` "
        "and `watch` send no delete (for the ingest role without `s3:DeleteObject`): catalog compaction writes "
        "snapshots without deleting, the alert state is written without folding, the probes leave their "
        "objects, and `tier --apply` clears what they left. `every-flow`: each flow tidies what it writes.",
    )

    @property
    def flows_delete(self) -> bool:
        """Whether flows other than `tier` may send deletes (their role has s3:DeleteObject)."""
        return self.deletes == "every-flow"

    # Who writes the bucket's lifecycle configuration. A lifecycle rule can expire every unlocked object, so
    # where Terraform owns the configuration (infra/terraform) no role but an operator's may write it: the
    # ingest and replica policies have no s3:PutLifecycleConfiguration, and with "external" no flow tries.
    lifecycle: Literal["managed", "external"] = Field(
        default="managed",
        description="Who writes this bucket's lifecycle rules: `managed`: the flows install the rules they need "
        "(the abort rule for incomplete uploads, `tier`'s server-mode rules, a replica's retention), and their "
        "credentials need `s3:PutLifecycleConfiguration`; `external`: Terraform (infra/terraform) or an operator "
        "installs them and no flow writes the lifecycle (for the ingest and replica roles, which cannot): `tier` "
        "in server mode and `replicate` check that the rules they rely on are there and say which is missing.",
    )

    @property
    def manages_lifecycle(self) -> bool:
        """Whether the flows write this bucket's lifecycle configuration themselves."""
        return self.lifecycle == "managed"

    @model_validator(mode="after")
    def _budget_holds_a_part(self) -> StoreConfig:
        if self.buffer_mb is not None and self.buffer_mb < self.part_size_mb:
            raise ValueError(
                f"buffer_mb = {self.buffer_mb} cannot hold one part of part_size_mb = {self.part_size_mb}; "
                f"set buffer_mb to at least {self.part_size_mb} or remove it"
            )
        return self

    @field_validator("prefix")
    @classmethod
    def _clean_prefix(cls, v: str) -> str:
        return v.strip("/")


# What `verify_command` may name (docs/drills.md, "Resume check"; ckptvault/restore/verify.py fills them in).
VERIFY_PLACEHOLDERS = ("dest", "run", "step", "save", "format", "metrics_json", "python")


class VerifyCommandError(InvalidArgumentError):
    """A verify command that cannot be run as written (an unknown placeholder, an empty command)."""


def verify_placeholders_in(arg: str) -> list[str]:
    """The placeholders `{name}` in one argument of a verify command, in order; VerifyCommandError for a brace
    that does not close, a name not in VERIFY_PLACEHOLDERS, or one with a conversion or format spec (`{{`
    and `}}` are literal braces, as in str.format)."""
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as e:
        raise VerifyCommandError(f"{arg!r}: {e}; write a literal brace as {{{{ or }}}}") from None
    names: list[str] = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in VERIFY_PLACEHOLDERS or spec or conversion:
            shown = f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
            known = ", ".join("{" + p + "}" for p in VERIFY_PLACEHOLDERS)
            raise VerifyCommandError(
                f"{arg!r}: {shown} is not a placeholder; use {known} (a literal brace is {{{{ or }}}})"
            )
        names.append(name)
    return names


def check_verify_command(command: list[str]) -> None:
    """VerifyCommandError naming what is wrong with `command` (empty, an empty program, a bad placeholder)."""
    if not command:
        raise VerifyCommandError("the command is empty; give the program and its arguments, e.g. "
                                 '["python", "resume_check.py", "{dest}"]')  # fmt: skip
    if not command[0].strip():
        raise VerifyCommandError("the program (the first argument) is empty")
    for arg in command:
        verify_placeholders_in(arg)


def _verify_command(v: Any) -> Any:
    """A `verify_command` as TOML gave it, checked before pydantic's types: a list of strings whose
    placeholders exist."""
    if v is None:
        return v
    if isinstance(v, str):
        raise ValueError(
            "write the command as a list of arguments (it runs without a shell), e.g. "
            'verify_command = ["python", "resume_check.py", "{dest}"]'
        )
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise ValueError('a list of strings, e.g. verify_command = ["python", "resume_check.py", "{dest}"]')
    try:
        check_verify_command(v)
    except VerifyCommandError as e:
        raise ValueError(str(e)) from None
    return v


class SourceConfig(_Strict):
    """`[[sources]]`: one training run's checkpoint root, one entry per run."""

    run: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] = Field(
        description="The run's name in the bucket and the catalog (letters, digits, `.`, `_`, `-`)."
    )
    path: Path = Field(description="The run's checkpoint root on the hot file system (it must exist).")
    # "auto" or a name in layout_names.LAYOUT_NAMES, the names of formats.LAYOUTS
    format: str = Field(default="auto", description="The checkpoint layout, or `auto` to detect it (docs/frameworks/).")
    settle_seconds: Annotated[float, Field(ge=0)] = Field(
        default=60, description="A finished checkpoint is picked up only once nothing in it changed for this long."
    )
    stale_after_hours: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Alert (`watch`) when the run saved no checkpoint for this long; unset: never."
    )
    compression: Compression | None = Field(
        default=None, description="This run's `compression`, over `[store] compression`; unset: the store's."
    )
    # "node": each node holds its own ranks' files on its local disk, at this same `path`
    # (docs/OPERATIONS.md, "Node-local shards"); every file is read and uploaded by the Dask worker of its node.
    locality: Literal["shared", "node"] = Field(
        default="shared",
        description="`shared`: one file system every ingest host sees; `node`: each node holds its own "
        "ranks' files on its local disk at this same `path`, read by that node's Dask worker.",
    )
    nodes: Annotated[int, Field(ge=1, le=100_000)] | None = Field(
        default=None,
        description='With `locality = "node"`: the number of nodes, `node-0` .. `node-(N-1)` (the workers\' '
        "Dask resources).",
    )
    # searched in each file's path inside the checkpoint; its group `rank` (or `node`) says the node;
    # files it does not match (metadata, configs, tracker files) are node 0's, where rank 0 writes them
    node_pattern: str | None = Field(
        default=None,
        description='With `locality = "node"`: a regular expression searched in each file\'s path inside the '
        "checkpoint, with one group `rank` or `node`; files it does not match are node 0's.",
    )
    ranks_per_node: Annotated[int, Field(ge=1)] = Field(
        default=1, description="With a `rank` group in `node_pattern`: node = rank // ranks_per_node."
    )
    verify_command: list[str] | None = Field(
        default=None,
        description="This run's resume check, over `[drill] verify_command` (runs differ in code); the same "
        "placeholders, and the rest of `[drill]`'s verify keys.",
    )

    @field_validator("verify_command", mode="before")
    @classmethod
    def _command_is_a_list(cls, v: Any) -> Any:
        return _verify_command(v)

    @field_validator("node_pattern")
    @classmethod
    def _one_group(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            groups = re.compile(v).groupindex
        except re.error as e:
            raise ValueError(f"{v!r} is not a regular expression ({e})") from None
        if ("rank" in groups) == ("node" in groups):
            raise ValueError(
                f"{v!r} needs exactly one named group: (?P<rank>\\d+) for a rank number (node = rank // "
                "ranks_per_node) or (?P<node>\\d+) for a node number"
            )
        return v

    @model_validator(mode="after")
    def _node_keys(self) -> SourceConfig:
        node_keys = self.nodes is not None or self.node_pattern is not None
        if self.locality == "node" and (self.nodes is None or self.node_pattern is None):
            raise ValueError(
                'locality = "node" needs nodes = N and node_pattern (docs/OPERATIONS.md, "Node-local shards")'
            )
        if self.locality == "shared" and node_keys:
            raise ValueError('nodes and node_pattern apply only with locality = "node"')
        return self

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v != "auto" and v not in LAYOUT_NAMES:
            raise ValueError("Input should be " + ", ".join(repr(n) for n in ("auto", *LAYOUT_NAMES)))
        return v


class KeepBest(_Strict):
    """`[policy] keep_best`: the best checkpoints of each run by a recorded metric are kept as milestones."""

    metric: str = Field(description="The metric a checkpoint records, e.g. `eval_loss`.")
    mode: Literal["min", "max"] = Field(
        default="min", description="Whether the lowest (`min`) or highest value is best."
    )
    k: Annotated[int, Field(ge=1)] = Field(default=1, description="How many of each run's best are kept.")
    lock_days: Annotated[int, Field(ge=0, le=36_500)] = Field(
        default=0,
        description="With `[lock]` on, `tier --apply` extends the Object Lock of these checkpoints to this many days "
        "after their commit (never shortens it); 0: only `[lock] days`.",
    )


class TierStep(_Strict):
    """One entry of `[policy] tiers`: after so many days, move down to this tier."""

    after_days: Annotated[float, Field(ge=0)] = Field(description="The checkpoint's age, in days, when it moves.")
    tier: Literal["warm", "cold", "archive"] = Field(
        description="The tier it moves to; `[policy.classes]` names its storage class."
    )


class PolicyConfig(_Strict):
    """`[policy]`: retention and tiering, planned by `ckptvault plan` and carried out by `tier --apply`."""

    keep_hot: Annotated[int, Field(ge=1)] = Field(
        default=3, description="The newest N verified saves of a run stay in the hot class."
    )
    milestone_every_steps: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="Steps that are multiples of this are milestones: never expired."
    )
    milestone_every_hours: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="The first checkpoint of each window of this many hours is a milestone."
    )
    milestone_lock_days: Annotated[int, Field(ge=0, le=36_500)] = Field(
        default=0,
        description="With `[lock]` on, `tier --apply` extends the Object Lock of the milestones of "
        "`milestone_every_steps` and `milestone_every_hours` to this many days after their commit (never "
        "shortens it); 0: only `[lock] days`. `keep_best` has its own `lock_days`.",
    )
    keep_best: KeepBest | None = Field(
        default=None,
        description="Each run's k best checkpoints by a metric are milestones, e.g. "
        '`{ metric = "eval_loss", mode = "min", k = 2 }`.',
    )
    tiers: list[TierStep] = Field(
        default_factory=list,
        description="When checkpoints move down the storage classes, e.g. "
        '`[{ after_days = 7, tier = "warm" }, { after_days = 30, tier = "archive" }]`; empty: they stay hot.',
    )
    expire_after_days: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Delete non-milestone checkpoints this many days old; unset: never."
    )
    keep_local: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Keep this many newest verified copies on the hot file system; older ones may be deleted "
        "there after a re-check. Unset: nothing is deleted locally.",
    )
    horizon_days: Annotated[float, Field(gt=0)] = Field(
        default=365, description="A move is planned only if it saves more than it costs over this many days."
    )
    apply_mode: Literal["client", "server", "both"] = Field(
        default="client",
        description="How moves happen: `client` (CopyObject now), `server` (tags + the bucket's lifecycle "
        "rules, later) or `both` (copy now, lifecycle for archived objects).",
    )
    # tier -> storage class name on this store; defaults depend on the store kind (cost.py)
    classes: dict[str, str] = Field(
        default_factory=dict,
        description='Tier -> storage class on this store, e.g. `{ cold = "COLD" }` on Ceph; '
        "unset tiers take the store kind's defaults.",
    )
    hot_fs_usd_per_gb_month: Annotated[float, Field(ge=0)] = Field(
        default=0.10, description="What the parallel file system costs per GB-month, for the saving `plan` shows."
    )
    # user price overrides, class name -> $/GB-month (Ceph users set their own)
    prices: dict[str, float] = Field(
        default_factory=dict,
        description="Storage class -> $/GB-month, over ckptvault/data/prices.toml; a Ceph class must be priced here.",
    )


class ValidationRules(_Strict):
    """`[validation]`: the quality gates' thresholds and severities (`block` quarantines, `warn` uploads and flags)."""

    enabled: bool = Field(default=True, description="Run the quality gates; `false`: record that nothing was checked.")
    # Evaluate Great Expectations in a short-lived child process (see ckptvault/ingest/quality.py).
    isolate: bool = Field(
        default=True,
        description="Evaluate the gates in a short-lived child process (its memory leaves with it); `false`: "
        "in-process and warm.",
    )
    history: Annotated[int, Field(ge=1)] = Field(
        default=10, description="How many of the run's last verified checkpoints are the baseline."
    )
    size_band: Annotated[float, Field(gt=0, lt=10)] = Field(
        default=0.20, description="Total bytes must be within this fraction of the baseline's median."
    )
    size_severity: Literal["block", "warn"] = Field(default="block", description="Severity of the size band rule.")
    shape_severity: Literal["block", "warn"] = Field(
        default="warn", description="Severity of a changed file count or shard size against the previous checkpoint."
    )
    missing_rank_severity: Literal["block", "warn"] = Field(
        default="block", description="Severity of a missing rank file."
    )
    step_severity: Literal["block", "warn"] = Field(
        default="warn", description="Severity of a step that does not go up."
    )
    loss_jump_factor: Annotated[float, Field(gt=1)] = Field(
        default=3.0, description="A loss above this times the recent median is a jump."
    )
    loss_severity: Literal["block", "warn"] = Field(
        default="block", description="Severity of a loss that is not finite."
    )
    interval_factor: Annotated[float, Field(gt=1)] = Field(
        default=3.0, description="A gap between checkpoints above this times the median interval is irregular."
    )
    loss_jump_severity: Literal["block", "warn"] = Field(default="warn", description="Severity of a loss jump.")
    interval_severity: Literal["block", "warn"] = Field(
        default="warn", description="Severity of an irregular interval."
    )
    # A shard present in both checkpoints may change size by this fraction before it counts as a change.
    shard_size_tolerance: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.10,
        description="A shard in both checkpoints may change size by this fraction before it counts as changed.",
    )
    # Statistical rules (size band, loss jump, interval) need this many points; fewer gives a note.
    min_history: Annotated[int, Field(ge=1)] = Field(
        default=3,
        description="The statistical rules (size band, loss jump, interval) need this many points; fewer: a note.",
    )


class NotifyConfig(_Strict):
    """`[notify]`: where alerts go. The console always; Slack when a token or webhook is found."""

    # "console" always; "slack" when a token or webhook is found in the environment or a Prefect Secret
    channel: str = Field(default="#ckptvault", description="The Slack channel a bot token posts to.")
    slack_token_env: str = Field(
        default="CKPTVAULT_SLACK_TOKEN", description="The environment variable holding a Slack bot token."
    )
    slack_webhook_env: str = Field(
        default="CKPTVAULT_SLACK_WEBHOOK", description="The environment variable holding a Slack incoming-webhook URL."
    )
    slack_secret_block: str | None = Field(
        default=None, description="A Prefect Secret block holding the Slack token (reading it needs a Prefect API)."
    )
    slack_base_url: str | None = Field(default=None, description="A Slack-compatible API endpoint; unset: Slack's.")
    dedup_window_minutes: Annotated[float, Field(ge=0)] = Field(
        default=60, description="The same alert is sent at most once per this many minutes."
    )
    budget_usd_per_month: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Alert (`watch`) when the bucket's monthly cost exceeds this; unset: no budget."
    )


class DrillConfig(_Strict):
    """`[drill]`: restore drills (docs/drills.md)."""

    # How many checkpoints each drill takes from the rotation, on top of each run's newest and any suspect.
    sample: Annotated[int, Field(ge=1)] = Field(
        default=2,
        description="Checkpoints each drill takes from the rotation, on top of each run's newest and any suspect.",
    )
    # Grow the sample so that every drillable checkpoint is drilled within this many days at the drill
    # deployment's interval (see ckptvault/restore/drill.py); none: the sample stays as set.
    cover_days: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="Grow the sample so every drillable checkpoint is drilled within this many days; unset: "
        "the sample stays as set.",
    )
    scratch: Path = Field(
        default=Path("/tmp/ckptvault-drill"), description="Where drills restore into (always cleaned)."
    )
    restore_tier: Literal["Expedited", "Standard", "Bulk"] = Field(
        default="Bulk", description="The thaw tier for archived objects a drill restores."
    )
    # The resume check (docs/drills.md, "Resume check"; ckptvault/restore/verify.py): the training's own
    # code run against each restored save once its load checks pass.
    verify_command: list[str] | None = Field(
        default=None,
        description="The resume check run against each restored save once its load checks pass: the program and "
        "its arguments (no shell), with placeholders `{dest}` (the restored checkpoint), `{run}`, `{step}`, "
        "`{save}`, `{format}` and `{metrics_json}` (a file of the manifest's recorded metrics); unset: none. A "
        "`[[sources]]` entry's own `verify_command` wins for its run.",
    )
    verify_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        default=3600,
        description="The verify command is killed, with every process it started, after this long: a `verify_error`.",
    )
    verify_env: dict[str, str] = Field(
        default_factory=dict,
        description="Variables set for the verify command, over the few it inherits (PATH, HOME, USER, LANG, TZ, "
        "TMPDIR, CUDA_VISIBLE_DEVICES, ...); a value `${NAME}` passes this process's NAME. Nothing else of the "
        "drill's environment reaches it: the store's credentials only if named here.",
    )
    verify_cwd: Path | None = Field(
        default=None,
        description="The verify command's working directory (it must exist); unset: the scratch directory the "
        "save was restored into.",
    )
    verify_fail_codes: list[int] = Field(
        default=[1],
        description="Exit codes that say the checkpoint is bad (the save is marked suspect); any other code but 0, "
        "a signal or the timeout is a `verify_error` (the drill fails, the save is not marked).",
    )
    verify_metric: Annotated[str, Field(min_length=1)] = Field(
        default="loss",
        description="The key the verify command's last stdout line (a JSON object) may hold, compared with the "
        "manifest's recorded value of the same name (or the line's own `reference`).",
    )
    verify_tolerance: Annotated[float, Field(ge=0)] = Field(
        default=0.05,
        description="How far (relative to the recorded value) the printed metric may be from it; outside: the "
        "checkpoint fails.",
    )

    @field_validator("verify_command", mode="before")
    @classmethod
    def _command_is_a_list(cls, v: Any) -> Any:
        return _verify_command(v)

    @field_validator("verify_fail_codes")
    @classmethod
    def _some_codes(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("name at least one exit code that fails the checkpoint, e.g. verify_fail_codes = [1]")
        if bad := [c for c in v if not 1 <= c <= 255]:
            raise ValueError(f"{bad[0]} is not an exit code that can fail a check: use 1 to 255 (0 passes)")
        return sorted(set(v))

    @field_validator("verify_env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits and _)")
        return v


class ScrubConfig(_Strict):
    """`[scrub]`: the scheduled scrub flow (docs/replicas.md, "The scrub flow")."""

    # Off by default: a repair writes to the copy it repairs (under Object Lock a new version beside the
    # locked one, billed until that retention ends), and what a scrub finds (a wiped replica bucket, a
    # disk going bad under Ceph) deserves a person's look before anything is written there. So the
    # scheduled scrub reports and alerts, and the alert says what to run. The command line repairs only
    # with --repair, whatever this says.
    repair: bool = Field(
        default=False,
        description="Whether the scheduled scrub flow repairs what it finds from a good copy; off: it reports "
        "and alerts only (`ckptvault scrub` repairs only with --repair).",
    )


class LockConfig(_Strict):
    """`[lock]`: S3 Object Lock on every committed save (docs/FORMAT.md, "Object Lock"); the bucket
    must have been created with Object Lock."""

    mode: Literal["off", "governance", "compliance"] = Field(
        default="off",
        description="`governance`: only credentials with s3:BypassGovernanceRetention may delete a locked save "
        "early; `compliance`: nobody may, the root account included; `off`: no lock.",
    )
    days: Annotated[int, Field(ge=0, le=36_500)] = Field(
        default=0,
        description="Every object of a save and its manifest stay locked at least this many days after the "
        "commit (at most 2 more); 0: no lock at upload.",
    )

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


_REPLICA_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_TAKES = re.compile(r"all|milestones|newest ([1-9][0-9]{0,5})")


class ReplicaConfig(StoreConfig):
    """`[[replicas]]`: a second (third, ...) copy of committed saves in another store (docs/FORMAT.md,
    "Replicas"). Its store keys are `[store]`'s, with the same validation."""

    name: str = Field(
        description="How `ls`, `restore --from`, alerts and the catalog name this copy: lower-case letters, "
        "digits, `-` and `_`, at most 32; not `primary`."
    )
    profile: str | None = Field(
        default=None,
        description="The credentials profile (~/.aws/credentials, ~/.aws/config) this store is reached with; "
        "unset: boto3's standard chain, as for `[store]`.",
    )
    storage_class: str | None = Field(
        default=None,
        description="The storage class every object is written in, e.g. `DEEP_ARCHIVE` or Ceph's `COLD`; "
        "unset: the server's default.",
    )
    takes: str = Field(
        default="all",
        description='Which committed saves it holds: `"all"`, `"milestones"` (the steps `[policy]` keeps '
        'forever) or `"newest N"` (each run\'s N newest).',
    )
    # What the primary bills per GB it sends this replica (ckptvault/data/prices.toml [egress]): the
    # route decides the price, and only the operator knows it for sure; `auto` guesses from where the
    # two stores are. An on-premises primary (Ceph, SeaweedFS, MinIO) bills nothing whatever the route.
    copy_egress: Literal["auto", "in-region", "inter-region", "internet"] = Field(
        default="auto",
        description="How the primary's bytes reach this replica, for the egress `plan` and `catalog stats` "
        "price: `in-region`, `inter-region` (another region of the same provider) or `internet`; `auto`: the same "
        "endpoint_url and region is in-region, the same endpoint_url in another region inter-region, any other "
        "endpoint internet.",
    )
    prices: dict[str, float] = Field(
        default_factory=dict,
        description="Storage class -> $/GB-month on this replica's store, over `[policy.prices]` and "
        "ckptvault/data/prices.toml (AWS list prices), e.g. `{ COLD = 0.002 }`; a Ceph class must be priced "
        "here or in `[policy.prices]`.",
    )
    max_lag_hours: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="The watch alerts when a save this replica should hold has been committed on the primary "
        "for longer than this without reaching it; unset: no alert.",
    )
    expire_after_days: Annotated[int, Field(ge=1, le=36_500)] | None = Field(
        default=None,
        description="The replica's own retention: a lifecycle rule on its bucket (installed by `ckptvault "
        "replicate`) deletes its objects this many days after they were copied, and a save committed on the "
        "primary longer ago than this is not copied. Expiry on the primary never deletes a replica's copy; unset: "
        "kept until removed by hand. With `[lock]`: at least `[lock] days` + 2.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _REPLICA_NAME.fullmatch(v) or v == "primary":
            raise ValueError(
                "use lower-case letters, digits, - and _ (at most 32), not 'primary' (the [store] is called "
                'that), e.g. name = "ceph-dr"'
            )
        return v

    @field_validator("storage_class")
    @classmethod
    def _class(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", v):
            raise ValueError("a storage class is spelt in upper case as S3 spells it, e.g. DEEP_ARCHIVE or COLD")
        return v

    @field_validator("prices")
    @classmethod
    def _prices(cls, v: dict[str, float]) -> dict[str, float]:
        for name, usd in v.items():
            if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", name):
                raise ValueError(f"{name!r}: a storage class is spelt in upper case as S3 spells it, e.g. COLD")
            if not math.isfinite(usd) or usd < 0:
                raise ValueError(f"{name} = {usd!r}: write a non-negative USD per GB-month, e.g. {name} = 0.002")
        return v

    @field_validator("takes")
    @classmethod
    def _takes(cls, v: str) -> str:
        v = " ".join(v.split())
        if not _TAKES.fullmatch(v):
            raise ValueError('write "all", "milestones" or "newest N" with N a whole number, e.g. "newest 3"')
        return v

    @model_validator(mode="after")
    def _stored_as_the_primary(self) -> ReplicaConfig:
        if "compression" in self.model_fields_set:
            raise ValueError(
                "compression: a replica stores the primary's objects byte for byte, compressed or not; remove "
                "compression from this [[replicas]] entry"
            )
        return self

    @property
    def newest(self) -> int | None:
        """N of `takes = "newest N"`, else None."""
        m = _TAKES.fullmatch(self.takes)
        return int(m.group(1)) if m and m.group(1) else None


DASK_SCHEMES = ("tcp", "tls")


def parse_dask_address(value: str) -> str:
    """A Dask scheduler address as `tcp://host:port` (or `tls://`), checked; InvalidArgumentError (a
    ValueError, which pydantic reports as the key's error) names the fix.

    Bare `host:port` is refused rather than guessed: Dask reads it as tcp, but a `tls` cluster named
    that way would fail only at the first connection, far from the config line that is wrong."""
    scheme, sep, rest = value.strip().partition("://")
    host, colon, port = rest.rpartition(":")
    if not sep or scheme not in DASK_SCHEMES or not colon or not host.strip("[]") or not port.isdigit():
        raise InvalidArgumentError(
            f"{value!r} is not a Dask scheduler address; write it as tcp://HOST:PORT "
            "(the scheduler's default port is 8786), e.g. tcp://dask-scheduler:8786"
        )
    if not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"{value!r}: port {port} is out of range 1-65535")
    return f"{scheme}://{host}:{int(port)}"


class ScaleConfig(_Strict):
    """`[scale]`: where ingest's per-file upload tasks (and restore's downloads) run (docs/OPERATIONS.md,
    "Scale-out on Dask"). Neither key: a thread pool in the flow's own process. The command line's
    --dask-address / --dask-workers take precedence."""

    dask_address: str | None = Field(
        default=None,
        description="An existing Dask cluster's scheduler, `tcp://HOST:PORT` (or `tls://`); needs `PREFECT_API_URL`.",
    )
    local_workers: Annotated[int, Field(ge=1, le=256)] | None = Field(
        default=None, description="Or a new LocalCluster of this many workers on this host."
    )
    # How long to wait for the scheduler before giving up with exit 2: a typo'd host must not hang
    # the command for Dask's default 30 s, nor the 10-minute schedule.
    connect_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = Field(
        default=10, description="A scheduler that does not answer by then is exit 2, naming it."
    )
    # How long a node's worker may take to list a node-local checkpoint (locality = "node"): a node
    # whose worker vanished is named after this long, never waited on for ever.
    node_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = Field(
        default=120, description="Node-local sources: a node's worker that does not list its files by then is named."
    )
    # A file larger than this is split into ranges of about this many MiB (whole parts, at least one),
    # each range its own task: on a cluster one big file is sent (ingest) or fetched (restore) by
    # several workers at once. 0: every file is one task. Files stored compressed, and with
    # `sha256 = true` (a whole-file hash cannot be combined from ranges), are never split.
    split_size_mb: Annotated[int, Field(ge=0)] = Field(
        default=2048,
        description="A bigger file goes up (and comes back) in ranges of about this many MiB, each its own "
        "task; `0`: never split.",
    )

    @field_validator("dask_address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        return None if v is None else parse_dask_address(v)

    @model_validator(mode="after")
    def _one_cluster(self) -> ScaleConfig:
        if self.dask_address is not None and self.local_workers is not None:
            raise ValueError(
                "dask_address and local_workers both set: one names an existing cluster, the other starts "
                "one here; keep one of them"
            )
        return self


class MetricsConfig(_Strict):
    """`[metrics]`: `/metrics` for Prometheus from `ckptvault serve` (docs/metrics.md). Off unless `port` is set."""

    port: Annotated[int, Field(ge=1, le=65535)] | None = Field(
        default=None,
        description="The port `ckptvault serve` serves `/metrics` on (e.g. 9464); unset: no metrics server.",
    )
    bind_address: str = Field(
        default="127.0.0.1",
        description="The address it listens on: loopback by default; `0.0.0.0` (or `::`) for a Prometheus on "
        "another machine (the metrics name runs, classes and costs, and carry no credentials).",
    )


class Config(_Strict):
    """The whole file: one `[store]`, a `[[sources]]` entry per run, and the optional sections."""

    store: StoreConfig = Field(description="The bucket and how to reach it.")
    sources: list[SourceConfig] = Field(default_factory=list, description="One entry per training run.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="Retention and tiering.")
    validation: ValidationRules = Field(default_factory=ValidationRules, description="The quality gates.")
    notify: NotifyConfig = Field(default_factory=NotifyConfig, description="Alerts.")
    drill: DrillConfig = Field(default_factory=DrillConfig, description="Restore drills.")
    scale: ScaleConfig = Field(default_factory=ScaleConfig, description="Scale-out on Dask.")
    lock: LockConfig = Field(default_factory=LockConfig, description="Object Lock retention.")
    replicas: list[ReplicaConfig] = Field(
        default_factory=list, description="Further copies of committed saves, each in a store of its own."
    )
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="Prometheus metrics.")
    scrub: ScrubConfig = Field(default_factory=ScrubConfig, description="The scheduled scrub.")
    sha256: bool = Field(
        default=False,
        description="Also record each file's SHA-256 in the manifest (such files are never split into ranges).",
    )

    @model_validator(mode="after")
    def _unique_runs(self) -> Config:
        seen: set[str] = set()
        for s in self.sources:
            if s.run in seen:
                raise ValueError(f"run name {s.run!r} appears in two [[sources]]; each run needs its own name")
            seen.add(s.run)
        return self

    @model_validator(mode="after")
    def _replicas_elsewhere(self) -> Config:
        where: dict[tuple[str | None, str, str], str] = {
            (self.store.endpoint_url, self.store.bucket, self.store.prefix): "the [store]"
        }
        names: set[str] = set()
        for r in self.replicas:
            if r.name in names:
                raise ValueError(f"two [[replicas]] are named {r.name!r}; each copy needs its own name")
            names.add(r.name)
            at = (r.endpoint_url, r.bucket, r.prefix)
            if at in where:
                raise ValueError(
                    f"[[replicas]] {r.name!r} is the same place as {where[at]} (endpoint, bucket and prefix): "
                    "a copy must live elsewhere; give it another bucket or prefix"
                )
            where[at] = f"[[replicas]] {r.name!r}"
        for r in self.replicas:
            if r.expire_after_days is not None:
                self._retention_covers_only(r, where)
        return self

    def _retention_covers_only(self, r: ReplicaConfig, where: dict[tuple[str | None, str, str], str]) -> None:
        """A replica's retention rule deletes everything under its prefix in its bucket: nothing else may
        live there (the primary's saves, another copy), and with `[lock]` it must not come before the lock's
        date (a versioned bucket would hide the locked objects behind delete markers)."""
        mine = r.prefix.strip("/")
        for (endpoint, bucket, prefix), what in where.items():
            other = prefix.strip("/")
            # either under the other: a primary's run could be named like the replica's prefix
            a, b = mine + "/", other + "/"
            nested = not mine or not other or a.startswith(b) or b.startswith(a)
            if what != f"[[replicas]] {r.name!r}" and (endpoint, bucket) == (r.endpoint_url, r.bucket) and nested:
                raise ValueError(
                    f"[[replicas]] {r.name!r} expire_after_days: its lifecycle rule would delete every object under "
                    f"{r.bucket}/{mine + '/' if mine else ''}, where {what} keeps objects too; give the replica a "
                    "bucket or a prefix of its own, or remove expire_after_days"
                )
        if self.lock.enabled and r.expire_after_days is not None and r.expire_after_days < self.lock.days + 2:
            raise ValueError(
                f"[[replicas]] {r.name!r} expire_after_days = {r.expire_after_days} ends before the lock its "
                f"objects are written with ([lock] days = {self.lock.days}, up to 2 days more): set it to at "
                f"least {self.lock.days + 2}"
            )

    @model_validator(mode="after")
    def _lock_days_need_a_lock(self) -> Config:
        asked = [
            name
            for name, days in (
                ("[policy] milestone_lock_days", self.policy.milestone_lock_days),
                ("[policy] keep_best.lock_days", self.policy.keep_best.lock_days if self.policy.keep_best else 0),
            )
            if days
        ]
        if asked and not self.lock.enabled:
            raise ValueError(
                f'{" and ".join(asked)} {"is" if len(asked) == 1 else "are"} set, but [lock] mode is "off", so '
                "nothing would be locked: "
                'set [lock] mode = "governance" or "compliance" (the bucket must have Object Lock), or remove them'
            )
        return self

    def compression_for(self, run: str) -> Compression:
        """The run's source's `compression`, else the store's (a run with no source: the store's)."""
        own = next((s.compression for s in self.sources if s.run == run), None)
        return own if own is not None else self.store.compression

    def verify_command_for(self, run: str) -> tuple[str, list[str]] | None:
        """The resume check of `run`'s saves and the key that sets it: its `[[sources]]` entry's
        `verify_command`, else `[drill]`'s; None when neither is set."""
        for i, s in enumerate(self.sources):
            if s.run == run and s.verify_command is not None:
                return f"sources[{i}].verify_command (run {run!r})", s.verify_command
        if self.drill.verify_command is not None:
            return "[drill] verify_command", self.drill.verify_command
        return None

    def node_local_runs(self) -> frozenset[str]:
        """The runs whose files live on each node's own disk (`locality = "node"`)."""
        return frozenset(s.run for s in self.sources if s.locality == "node")

    def source(self, run: str) -> SourceConfig:
        for s in self.sources:
            if s.run == run:
                return s
        names = ", ".join(s.run for s in self.sources) or "none"
        raise ConfigError(f"no [[sources]] entry has run = {run!r} (configured runs: {names})")


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _keys_beside(loc: tuple[int | str, ...]) -> list[str]:
    """The valid keys of the section an unknown key (`loc`'s last part) was found in; none when its
    place is not a section of these models (the near-miss hint is then left out)."""
    model: type[BaseModel] | None = Config
    for part in loc[:-1]:
        if model is None:
            return []
        if isinstance(part, int):  # an entry of an array of tables: the same model
            continue
        field = model.model_fields.get(part)
        model = _model_of(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds: itself, or inside `X | None`, `list[X]`, `Annotated[X, ...]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_of(arg)) is not None:
            return found
    return None


def _explain(err: ValidationError, origin: str) -> str:
    lines = [f"{origin}: the configuration is not valid:"]
    for e in err.errors():
        where = _loc(tuple(e["loc"]))
        kind = e["type"]
        if kind == "extra_forbidden":
            near = difflib.get_close_matches(str(e["loc"][-1]), _keys_beside(tuple(e["loc"])), n=1)
            if near:  # a typo (`keep_hott`): the key meant, by name
                lines.append(f"  - {where}: unknown key; did you mean {near[0]}?")
            else:
                lines.append(
                    f"  - {where}: unknown key. Remove it, or check its spelling against docs/reference/config.md."
                )
        elif kind == "missing":
            lines.append(f"  - {where}: required key is missing. Add it.")
        else:
            got = e.get("input")
            shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
            said = e["msg"].removeprefix("Value error, ")
            lines.append(f"  - {where}: {said}{shown}." if where else f"  - {said}.")  # a whole-file rule
    return "\n".join(lines)


def parse_config(text: str, origin: str = "<config>") -> Config:
    """Parse TOML text; raise ConfigError that names the key and the fix."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: not valid TOML: {e}. Fix the syntax at that line.") from None
    return validate_config(raw, origin)


def validate_config(raw: dict[str, Any], origin: str = "<config>") -> Config:
    """The configuration from TOML already parsed (a dict); raise ConfigError that names the key and the fix."""
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_explain(e, origin)) from None


def resolve_config_path(cli_value: str | None) -> Path:
    value = cli_value or os.environ.get(ENV_VAR)
    if not value:
        raise ConfigError(
            f"no configuration given. Pass --config FILE or set {ENV_VAR}=FILE "
            "(`make demo` writes an example to .demo/ckptvault.toml)."
        )
    return Path(value)


def load_config(cli_value: str | None = None) -> Config:
    path = resolve_config_path(cli_value)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist. Check the path given by --config or {ENV_VAR}."
        ) from None
    except (PermissionError, IsADirectoryError) as e:
        raise ConfigError(
            f"config file {path} cannot be read ({e.strerror}). Fix its permissions or the path."
        ) from None
    return parse_config(text, str(path))


NODE_ENV = "CKPTVAULT_NODE"
NODE_PLACEHOLDER = "${CKPTVAULT_NODE}"


def expand_node(path: Path, node: str | None = None) -> Path | None:
    """`path` as one node sees it: CKPTVAULT_NODE replaced by `node` (default: this process's
    CKPTVAULT_NODE); None when the path needs a node name and there is none."""
    text = os.fspath(path)
    if NODE_PLACEHOLDER not in text:
        return path
    node = node if node is not None else os.environ.get(NODE_ENV)
    return Path(text.replace(NODE_PLACEHOLDER, node)) if node else None


def check_sources(cfg: Config) -> list[str]:
    """Problems with the configured source paths, each naming the key and the fix (empty if fine).
    A node-local source's path is checked as this node sees it: the other nodes check their own."""
    problems = []
    for i, src in enumerate(cfg.sources):
        key = f"sources[{i}].path (run {src.run!r})"
        path = expand_node(src.path)
        if path is None:
            problems.append(
                f"{key}: {src.path} names {NODE_PLACEHOLDER}, but {NODE_ENV} is not set; set it to this node's name"
            )
            continue
        s = src.model_copy(update={"path": path})
        if not s.path.exists() and s.path.is_symlink():
            problems.append(
                f"{key}: {s.path} is a symbolic link that does not resolve (dangling, or a loop). "
                "Point the path at the real directory."
            )
        elif not s.path.exists():
            problems.append(f"{key}: {s.path} does not exist. Create it or fix the path.")
        elif not s.path.is_dir():
            problems.append(f"{key}: {s.path} is not a directory. Point it at the run's checkpoint root.")
        elif not os.access(s.path, os.R_OK | os.X_OK):
            problems.append(f"{key}: {s.path} is not readable by this user. Fix its permissions.")
    return problems
