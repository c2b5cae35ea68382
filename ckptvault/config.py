"""The TOML configuration, as pydantic models. Every error names the key and the fix.

Credentials never live here: the S3 side uses boto3's standard chain (environment, profile, role),
Slack uses an environment variable or a Prefect Secret block named in `[notify]`.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ckptvault.errors import CkptvaultError, InvalidArgumentError
from ckptvault.formats import LAYOUTS

ENV_VAR = "CKPTVAULT_CONFIG"
# "auto": each file stored as shuffle-zstd frames when a sample of it compresses (docs/FORMAT.md,
# "Compressed files"); "off": every object is the file, byte for byte, readable by any S3 tool.
Compression = Literal["auto", "off"]


class ConfigError(CkptvaultError):
    """A configuration problem, phrased for the operator: what is wrong, where, and how to fix it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreConfig(_Strict):
    bucket: Annotated[str, Field(min_length=3, max_length=63)]
    prefix: str = ""
    endpoint_url: str | None = None
    region: str = "us-east-1"
    kind: Literal["auto", "aws", "ceph", "seaweedfs", "minio", "moto"] = "auto"
    verify_tls: bool = True
    ca_bundle: str | None = None
    sse: Literal["none", "AES256", "aws:kms"] = "none"
    sse_kms_key_id: str | None = None
    part_size_mb: Annotated[int, Field(ge=5, le=5120)] = 32
    max_concurrency: Annotated[int, Field(ge=1, le=64)] = 4
    # Upload part buffers for the whole process; default part_size_mb * (max_concurrency + 1).
    buffer_mb: Annotated[int, Field(ge=5)] | None = None
    # Restores write around the page cache (O_DIRECT) where the filesystem allows it: less CPU, and a
    # restore does not push out pages other jobs are using. Off: every write goes through the cache.
    direct_io: bool = True
    # SHA-256 of every request body in its SigV4 signature: "auto" only over plain HTTP, where it is
    # the sole guard against a body changed on the way (TLS guards it otherwise, and CRC32C checks
    # every byte against corruption either way); "always" also over TLS; "never" not even over HTTP.
    sign_payload: Literal["auto", "always", "never"] = "auto"
    # Where restores read from, for the egress price in their estimate: "in-region" (the training
    # cluster beside the bucket: free on AWS; on-prem stores have no egress) or "internet".
    egress: Literal["in-region", "internet"] = "in-region"
    # Off by default while buckets are read by plain S3 tools or by ckptvault versions that cannot
    # decode frames (README.md, "Compression"); one source can turn it on with its own `compression`.
    compression: Compression = "off"

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


class SourceConfig(_Strict):
    run: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    path: Path
    format: str = "auto"  # "auto" or a name in formats.LAYOUTS, the one list of layouts
    settle_seconds: Annotated[float, Field(ge=0)] = 60
    stale_after_hours: Annotated[float, Field(gt=0)] | None = None
    compression: Compression | None = None  # None: the store's `compression`
    # "node": each node holds its own ranks' files on its local disk, at this same `path` (README,
    # "Node-local shards"); every file is read and uploaded by the Dask worker of its node.
    locality: Literal["shared", "node"] = "shared"
    nodes: Annotated[int, Field(ge=1, le=100_000)] | None = None  # node-0 .. node-(N-1), with "node"
    # searched in each file's path inside the checkpoint; its group `rank` (or `node`) says the node;
    # files it does not match (metadata, configs, tracker files) are node 0's, where rank 0 writes them
    node_pattern: str | None = None
    ranks_per_node: Annotated[int, Field(ge=1)] = 1

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
            raise ValueError('locality = "node" needs nodes = N and node_pattern (README, "Node-local shards")')
        if self.locality == "shared" and node_keys:
            raise ValueError('nodes and node_pattern apply only with locality = "node"')
        return self

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v != "auto" and v not in LAYOUTS:
            raise ValueError("Input should be " + ", ".join(repr(n) for n in ("auto", *LAYOUTS)))
        return v


class KeepBest(_Strict):
    metric: str
    mode: Literal["min", "max"] = "min"
    k: Annotated[int, Field(ge=1)] = 1


class TierStep(_Strict):
    after_days: Annotated[float, Field(ge=0)]
    tier: Literal["warm", "cold", "archive"]


class PolicyConfig(_Strict):
    keep_hot: Annotated[int, Field(ge=1)] = 3
    milestone_every_steps: Annotated[int, Field(ge=1)] | None = None
    milestone_every_hours: Annotated[float, Field(gt=0)] | None = None
    keep_best: KeepBest | None = None
    tiers: list[TierStep] = Field(default_factory=list)
    expire_after_days: Annotated[float, Field(gt=0)] | None = None
    keep_local: Annotated[int, Field(ge=1)] | None = None
    horizon_days: Annotated[float, Field(gt=0)] = 365
    apply_mode: Literal["client", "server", "both"] = "client"
    # tier -> storage class name on this store; defaults depend on the store kind (cost.py)
    classes: dict[str, str] = Field(default_factory=dict)
    hot_fs_usd_per_gb_month: Annotated[float, Field(ge=0)] = 0.10
    # user price overrides, class name -> $/GB-month (Ceph users set their own)
    prices: dict[str, float] = Field(default_factory=dict)


class ValidationRules(_Strict):
    enabled: bool = True
    # Evaluate Great Expectations in a short-lived child process (see ckptvault/ingest/quality.py).
    isolate: bool = True
    history: Annotated[int, Field(ge=1)] = 10
    size_band: Annotated[float, Field(gt=0, lt=10)] = 0.20
    size_severity: Literal["block", "warn"] = "block"
    shape_severity: Literal["block", "warn"] = "warn"
    missing_rank_severity: Literal["block", "warn"] = "block"
    step_severity: Literal["block", "warn"] = "warn"
    loss_jump_factor: Annotated[float, Field(gt=1)] = 3.0
    loss_severity: Literal["block", "warn"] = "block"
    interval_factor: Annotated[float, Field(gt=1)] = 3.0
    loss_jump_severity: Literal["block", "warn"] = "warn"
    interval_severity: Literal["block", "warn"] = "warn"
    # A shard present in both checkpoints may change size by this fraction before it counts as a change.
    shard_size_tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.10
    # Statistical rules (size band, loss jump, interval) need this many points; fewer gives a note.
    min_history: Annotated[int, Field(ge=1)] = 3


class NotifyConfig(_Strict):
    # "console" always; "slack" when a token or webhook is found in the environment or a Prefect Secret
    channel: str = "#ckptvault"
    slack_token_env: str = "CKPTVAULT_SLACK_TOKEN"
    slack_webhook_env: str = "CKPTVAULT_SLACK_WEBHOOK"
    slack_secret_block: str | None = None
    slack_base_url: str | None = None  # for a Slack-compatible endpoint; default Slack's
    dedup_window_minutes: Annotated[float, Field(ge=0)] = 60
    budget_usd_per_month: Annotated[float, Field(gt=0)] | None = None


class DrillConfig(_Strict):
    # How many checkpoints each drill takes from the rotation, on top of each run's newest and any suspect.
    sample: Annotated[int, Field(ge=1)] = 2
    # Grow the sample so that every drillable checkpoint is drilled within this many days at the drill
    # deployment's interval (see ckptvault/restore/drill.py); none: the sample stays as set.
    cover_days: Annotated[float, Field(gt=0)] | None = None
    scratch: Path = Path("/tmp/ckptvault-drill")
    restore_tier: Literal["Expedited", "Standard", "Bulk"] = "Bulk"


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
    """Where ingest's per-file upload tasks run (README "Scale-out"). Neither key: a thread pool in the
    flow's own process. The command line's --dask-address / --dask-workers take precedence."""

    dask_address: str | None = None  # an existing cluster's scheduler, tcp://host:8786
    local_workers: Annotated[int, Field(ge=1, le=256)] | None = None  # a LocalCluster of N workers
    # How long to wait for the scheduler before giving up with exit 2: a typo'd host must not hang
    # the command for Dask's default 30 s, nor the 10-minute schedule.
    connect_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 10
    # How long a node's worker may take to list a node-local checkpoint (locality = "node"): a node
    # whose worker vanished is named after this long, never waited on for ever.
    node_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 120
    # A file larger than this is split into ranges of about this many MiB (whole parts, at least one),
    # each range its own task: on a cluster one big file is sent (ingest) or fetched (restore) by
    # several workers at once. 0: every file is one task. Files stored compressed, and with
    # `sha256 = true` (a whole-file hash cannot be combined from ranges), are never split.
    split_size_mb: Annotated[int, Field(ge=0)] = 2048

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


class Config(_Strict):
    store: StoreConfig
    sources: list[SourceConfig] = Field(default_factory=list)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    validation: ValidationRules = Field(default_factory=ValidationRules)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    drill: DrillConfig = Field(default_factory=DrillConfig)
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    sha256: bool = False

    @model_validator(mode="after")
    def _unique_runs(self) -> Config:
        seen: set[str] = set()
        for s in self.sources:
            if s.run in seen:
                raise ValueError(f"run name {s.run!r} appears in two [[sources]]; each run needs its own name")
            seen.add(s.run)
        return self

    def compression_for(self, run: str) -> Compression:
        """The run's source's `compression`, else the store's (a run with no source: the store's)."""
        own = next((s.compression for s in self.sources if s.run == run), None)
        return own if own is not None else self.store.compression

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


def _explain(err: ValidationError, origin: str) -> str:
    lines = [f"{origin}: the configuration is not valid:"]
    for e in err.errors():
        where = _loc(tuple(e["loc"]))
        kind = e["type"]
        if kind == "extra_forbidden":
            lines.append(f"  - {where}: unknown key. Remove it, or check its spelling against README.md#configuration.")
        elif kind == "missing":
            lines.append(f"  - {where}: required key is missing. Add it.")
        else:
            got = e.get("input")
            shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
            lines.append(f"  - {where}: {e['msg'].removeprefix('Value error, ')}{shown}.")
    return "\n".join(lines)


def parse_config(text: str, origin: str = "<config>") -> Config:
    """Parse TOML text; raise ConfigError that names the key and the fix."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: not valid TOML: {e}. Fix the syntax at that line.") from None
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
