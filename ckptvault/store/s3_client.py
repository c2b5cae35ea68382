"""The S3 adapter's connection to one bucket: the boto3 client, its settings and credentials, and what
the server can do (its kind, its capabilities, whether the bucket answers). The ObjectStore methods
on top are ckptvault/store/s3.py's S3Store.

Client settings and why:
- request_checksum_calculation / response_checksum_validation = "when_required": boto3 >= 1.36
  otherwise sends aws-chunked CRC trailers that several servers reject (Ceph Pacific over HTTPS).
  We send our own precomputed x-amz-checksum-crc32c where the server validates it (no awscrt needed).
- standard retry mode, 5 attempts: botocore retries throttling, 5xx and connection errors itself.
- payload signing per [store] sign_payload (signs_payload): by default bodies are hashed into the
  signature over plain HTTP only, as the AWS SDKs do.
- path-style addressing with a custom endpoint: local and on-prem servers rarely have wildcard DNS.
- credentials from boto3's standard chain only (environment, profile, role); never from our config.
"""

from __future__ import annotations

import threading
import urllib.parse
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self, cast

import botocore.parsers
import botocore.session
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError, ProfileNotFound

from ckptvault.config import StoreConfig
from ckptvault.store import quick_ack
from ckptvault.store.botocore_errors import error_code, http_status, translate
from ckptvault.store.errors import NotFoundError, StoreError
from ckptvault.store.limits import MIB
from ckptvault.store.port import Capabilities, LockStatus, Retention, TransferConfig
from ckptvault.store.probe import detect_capabilities, kind_from_headers

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PROBE_DIR = "_ckptvault_probe/"


def transfer_config(cfg: StoreConfig) -> TransferConfig:
    part = cfg.part_size_mb * MIB
    # Single PUT up to one part; anything bigger streams as multipart.
    budget = cfg.buffer_mb * MIB if cfg.buffer_mb else 0
    return TransferConfig(
        part_size=part, multipart_threshold=part, max_concurrency=cfg.max_concurrency, buffer_budget=budget
    )


def make_client(
    cfg: StoreConfig,
    max_pool: int,
    *,
    attempts: int = 5,
    connect_timeout: float = 10,
    sign_payload: bool | None = None,
) -> S3Client:
    """A client for `cfg`; `sign_payload` None follows [store] sign_payload (signs_payload)."""
    signed = signs_payload(cfg) if sign_payload is None else sign_payload
    botocfg = BotoConfig(
        region_name=cfg.region,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"mode": "standard", "max_attempts": attempts},
        max_pool_connections=max_pool,
        connect_timeout=connect_timeout,
        read_timeout=120,
        s3={
            "payload_signing_enabled": signed,
            **({"addressing_style": "path"} if cfg.endpoint_url else {}),
        },
    )
    verify: bool | str = cfg.ca_bundle if cfg.ca_bundle else cfg.verify_tls
    # A fresh session per client, so each resolves credentials anew (tests and long-lived workers
    # change them), sharing one loader: loading and parsing S3's service model is most of the ~60 ms a
    # new session costs, and a CLI run makes four clients. A botocore session, not a boto3 one: boto3's
    # appends its resource path to the loader's search path on every construction, and a client needs
    # nothing boto3 adds (we use neither its resources nor its transfer methods).
    # A replica's `profile` (ReplicaConfig) picks its credentials from ~/.aws; [store] has none.
    profile: str | None = getattr(cfg, "profile", None)
    session = botocore.session.Session(profile=profile)
    session.register_component("data_loader", _shared_loader())
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
    try:
        client = session.create_client("s3", endpoint_url=cfg.endpoint_url, verify=verify, config=botocfg)
    except ProfileNotFound as e:
        name = getattr(cfg, "name", "[store]")
        raise StoreError(
            f"replica {name}: the credentials profile {profile!r} does not exist in ~/.aws/credentials or "
            "~/.aws/config (or AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE). Add the profile, or fix "
            f"profile in the [[replicas]] entry named {name}"
        ) from e
    quick_ack.install(client)  # Ceph RGW's small responses waited ~40 ms each without it (quick_ack.py)
    return cast("S3Client", client)  # the same class boto3.client("s3") builds, minus boto3's add-ons


def signs_payload(cfg: StoreConfig) -> bool:
    """Whether request bodies are SHA-256 hashed into their signatures ([store] sign_payload).

    botocore decides this itself only when a Content-MD5 or a checksum it computed is present, and
    we send our own precomputed CRC32C: left alone, it would hash every byte even over TLS (~0.7 CPU
    s/GB in `make bench`, one more pass over each part). "auto" follows the AWS SDKs' rule: unsigned over HTTPS,
    signed over plain HTTP. No endpoint means AWS, over HTTPS."""
    if cfg.sign_payload != "auto":
        return cfg.sign_payload == "always"
    return urllib.parse.urlsplit(cfg.endpoint_url or "https://s3.amazonaws.com").scheme != "https"


def parse_timestamp(value: Any) -> datetime:
    """A response's timestamp as botocore's own parser reads it, ISO 8601 with a zone (every key's
    LastModified in a LIST) by `datetime.fromisoformat` first: botocore's parser (dateutil's) took two
    thirds of a LIST's CPU, ~0.09 s of the 2,000 keys a fleet's catalog lists (bench/README.md)."""
    if isinstance(value, str):
        try:
            got = datetime.fromisoformat(value)
        except ValueError:
            pass  # an HTTP date (a Last-Modified header), epoch seconds: botocore's own parser
        else:
            if got.tzinfo is not None:
                return got
    parsed: datetime = botocore.parsers.DEFAULT_TIMESTAMP_PARSER(value)
    return parsed


_loader: Any = None
_loader_lock = threading.Lock()


def _shared_loader() -> Any:
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.session.Session().get_component("data_loader")
        return _loader


def prime() -> None:
    """Build one S3 client and throw it away: the shared loader then holds S3's service model, its
    endpoint rules and the partitions parsed, and botocore's lazy imports are done. For a process that
    forks a child per command (`ckptvault warm`): each child's first client then takes ~10 ms, not ~67.
    No request is made and no credentials are looked up (explicit dummy ones; the endpoint is never
    contacted)."""
    session = botocore.session.Session()
    session.register_component("data_loader", _shared_loader())
    session.create_client(
        "s3", endpoint_url="http://127.0.0.1:9", region_name="us-east-1", aws_access_key_id="prime",
        aws_secret_access_key="prime", config=BotoConfig(s3={"addressing_style": "path"}),
    )  # fmt: skip


def _credentials_source(profile: str | None = None) -> str:
    # botocore's session, as boto3's wraps it: importing boto3 (and s3transfer, multiprocessing) costs
    # a read command's start-up ~50 ms for nothing a client uses
    creds = botocore.session.Session(profile=profile).get_credentials()
    if creds is None:
        return "boto3 found no credentials."
    return f"boto3 found credentials via {creds.method!r} (not shown)."


class S3Connection:
    """One bucket of an S3-like server as a client sees it; S3Store adds the ObjectStore methods."""

    def __init__(
        self, cfg: StoreConfig, *, transfer: TransferConfig | None = None, client: S3Client | None = None
    ) -> None:
        self.cfg = cfg
        self.bucket = cfg.bucket
        self.transfer = transfer or transfer_config(cfg)
        self.endpoint = cfg.endpoint_url
        # Flows move up to 4 files at once, each with max_concurrency part requests, and downloads pool
        # their ranges (download_connections): a smaller connection pool would drop and reopen
        # connections under load.
        self.client: S3Client = client or make_client(cfg, self.download_connections + 2)
        self._signing: S3Client | None = None
        self._caps: Capabilities | None = None
        self._caps_lock = threading.Lock()
        self._kind: str | None = None if cfg.kind == "auto" else cfg.kind
        self.retention: Retention | None = None
        # the class new objects are written in: a replica's `storage_class`; None the server's default
        self.write_class: str | None = getattr(cfg, "storage_class", None)
        self._bucket_lock: LockStatus | None = None  # read once where needed (S3Store._bucket_lock_if_defaulted)

    # -- pickling: a store crosses process boundaries (Dask worker processes) as its configuration --
    # A boto3 client cannot be pickled (SSLContext, dynamically created classes), nor can a lock. We
    # send the configuration and what was already learnt (capabilities, server kind) so the receiving
    # process neither re-probes the server nor shares a connection pool; it builds its own client.
    # A client injected into __init__ (tests) is not carried over: the copy uses make_client(cfg).

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["client"], state["_caps_lock"], state["_signing"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._caps_lock = threading.Lock()
        self.client = make_client(self.cfg, self.download_connections + 2)
        self._signing = None

    @property
    def download_connections(self) -> int:
        """Range GETs in flight for the whole process, shared by every file being downloaded."""
        return 4 * self.transfer.max_concurrency

    @property
    def section(self) -> str:
        """The configuration entry this store is, as an operator finds it in the file."""
        name: str | None = getattr(self.cfg, "name", None)  # only a ReplicaConfig has one
        return f"[[replicas]] {name}" if name else "[store]"

    @property
    def _at(self) -> str:
        return self.endpoint or "AWS S3"

    def _err(self, e: Exception, op: str, key: str | None = None) -> StoreError:
        return translate(e, op=op, bucket=self.bucket, key=key, endpoint=self.endpoint)

    # -- capabilities and health ------------------------------------------------------------

    def kind(self) -> str:
        """The configured server kind, or the one guessed from a HEAD bucket's response headers."""
        if self._kind is None:
            try:
                resp = self.client.head_bucket(Bucket=self.bucket)
            except Exception as e:
                raise self._err(e, "checking") from e
            self._kind = kind_from_headers(resp["ResponseMetadata"].get("HTTPHeaders", {}), self.endpoint)
        return self._kind

    def _signing_client(self) -> S3Client:
        """For the requests whose (small) bodies stay signed whatever [store] sign_payload says: Ceph
        RGW 16 refuses an unsigned RestoreObject as a malformed browser upload (InvalidArgument,
        "Request Content-Type is not multipart/form-data"). Every other request, data or control,
        takes an unsigned payload on every server we test."""
        if signs_payload(self.cfg):
            return self.client
        with self._caps_lock:
            if self._signing is None:
                self._signing = make_client(self.cfg, 2, sign_payload=True)
            return self._signing

    def with_retention(self, retention: Retention | None) -> Self:
        # The same client and what was learnt (no new connection pool, no second probe): copy.copy
        # would go through __getstate__ and build a client.
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.retention = retention
        return other

    def writing_in(self, storage_class: str | None) -> Self:
        other = self.with_retention(self.retention)
        other.write_class = storage_class
        return other

    @property
    def _probe_prefix(self) -> str:
        return f"{self.cfg.prefix}/{PROBE_DIR}" if self.cfg.prefix else PROBE_DIR

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            signing = self._signing_client()  # the probe asks RestoreObject too
            with self._caps_lock:
                if self._caps is None:
                    self._caps = detect_capabilities(
                        signing,
                        self.bucket,
                        self._probe_prefix,
                        kind=self.kind(),
                        endpoint=self.endpoint,
                        delete=self.cfg.flows_delete,
                    )
        return self._caps

    def check_bucket(self) -> None:
        # A client that fails fast: an operator running `ckptvault check` against a dead endpoint
        # should not wait through five backed-off attempts.
        quick = make_client(self.cfg, 2, attempts=2, connect_timeout=5)
        try:
            quick.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            status = http_status(e)
            if status == 404 or error_code(e) == "NoSuchBucket":
                raise NotFoundError(
                    f"bucket {self.bucket} does not exist at {self._at}. "
                    f"Create it (aws s3 mb s3://{self.bucket}) or fix {self.section}.bucket"
                ) from e
            if status in (401, 403):
                raise StoreError(
                    f"access to bucket {self.bucket} at {self._at} was denied ({status}): "
                    f"{_credentials_source(getattr(self.cfg, 'profile', None))} Check AWS_ACCESS_KEY_ID/"
                    f"AWS_SECRET_ACCESS_KEY or AWS_PROFILE ({self.section} profile for a replica), and that the "
                    "user may access this bucket"
                ) from e
            raise self._err(e, "checking") from e
        except Exception as e:
            raise self._err(e, "checking") from e
