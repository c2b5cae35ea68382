"""The S3 adapter: `ObjectStore` on boto3, for AWS S3 and S3-compatible servers (Ceph RGW,
SeaweedFS, MinIO, moto).

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
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import boto3
import botocore.session
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from ckptvault.checksum import crc32c_update, from_b64, to_b64
from ckptvault.config import StoreConfig
from ckptvault.store import download, lifecycle, upload
from ckptvault.store.errors import error_code, http_status, translate
from ckptvault.store.limits import MIB
from ckptvault.store.port import (
    ARCHIVE_CLASSES,
    Capabilities,
    ChecksumMismatchError,
    LifecycleRules,
    NotFoundError,
    ObjectInfo,
    PreconditionFailedError,
    ProgressFn,
    RestoreState,
    StoreError,
    TransferConfig,
    UploadResult,
)
from ckptvault.store.probe import detect_capabilities, kind_from_headers
from ckptvault.store.upload_request import UploadRequest

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
    session = botocore.session.Session()
    session.register_component("data_loader", _shared_loader())
    client = session.create_client("s3", endpoint_url=cfg.endpoint_url, verify=verify, config=botocfg)
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


_loader: Any = None
_loader_lock = threading.Lock()


def _shared_loader() -> Any:
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.session.Session().get_component("data_loader")
        return _loader


class S3Store:
    """One bucket of an S3-like store (see ckptvault.store.port.ObjectStore for the contract)."""

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

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            signing = self._signing_client()  # the probe asks RestoreObject too
            with self._caps_lock:
                if self._caps is None:
                    prefix = f"{self.cfg.prefix}/{PROBE_DIR}" if self.cfg.prefix else PROBE_DIR
                    self._caps = detect_capabilities(
                        signing, self.bucket, prefix, kind=self.kind(), endpoint=self.endpoint
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
                    f"Create it (aws s3 mb s3://{self.bucket}) or fix [store].bucket"
                ) from e
            if status in (401, 403):
                raise StoreError(
                    f"access to bucket {self.bucket} at {self._at} was denied ({status}): "
                    f"{_credentials_source()} Check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                    "AWS_PROFILE, and that the user may access this bucket"
                ) from e
            raise self._err(e, "checking") from e
        except Exception as e:
            raise self._err(e, "checking") from e

    # -- objects ------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        try:
            h = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as e:
            if http_status(e) == 404:
                return None
            raise self._err(e, "reading metadata of", key) from e
        except Exception as e:
            raise self._err(e, "reading metadata of", key) from e
        etag = str(h.get("ETag", ""))
        server = h.get("ChecksumCRC32C")
        whole_object = h.get("ChecksumType") == "FULL_OBJECT" or "-" not in etag
        return ObjectInfo(
            key=key,
            size=int(h["ContentLength"]),
            etag=etag,
            storage_class=h.get("StorageClass") or "STANDARD",
            last_modified=h["LastModified"].timestamp(),
            metadata=dict(h.get("Metadata", {})),
            restore=h.get("Restore"),
            server_crc32c=server if server and whole_object and "-" not in server else None,
            archive_status=h.get("ArchiveStatus"),
        )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        try:
            for page in pages:
                for o in page.get("Contents", []):
                    yield ObjectInfo(
                        key=o["Key"],
                        size=int(o["Size"]),
                        etag=str(o.get("ETag", "")),
                        storage_class=o.get("StorageClass") or "STANDARD",
                        last_modified=o["LastModified"].timestamp(),
                    )
        except Exception as e:
            raise self._err(e, f"listing {prefix!r} in") from e

    def _put_args(self, content_type: str = "application/octet-stream") -> dict[str, Any]:
        args: dict[str, Any] = {"ContentType": content_type}
        if self.cfg.sse != "none":
            args["ServerSideEncryption"] = self.cfg.sse
            if self.cfg.sse == "aws:kms" and self.cfg.sse_kms_key_id:
                args["SSEKMSKeyId"] = self.cfg.sse_kms_key_id
        return args

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        tags: Mapping[str, str] | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        crc = to_b64(crc32c_update(data))
        args: dict[str, Any] = {**self._put_args(content_type), "Metadata": {"crc32c": crc}}
        caps = self.capabilities()
        if caps.checksums_validated:
            args["ChecksumCRC32C"] = crc
        if tags:
            args["Tagging"] = urllib.parse.urlencode(dict(tags), quote_via=urllib.parse.quote)
        if if_none_match:
            if caps.conditional_writes:
                args["IfNoneMatch"] = "*"
            elif self.head(key) is not None:
                # Without server-side conditional writes this check-then-put is racy: two writers
                # can both see "absent". Acceptable for manifests: same content from a rerun.
                raise PreconditionFailedError(f"writing s3://{self.bucket}/{key}: the object already exists")
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, **args)
        except Exception as e:
            err = self._err(e, "writing", key)
            if isinstance(err, PreconditionFailedError) and self._is_our_write(key, len(data), crc):
                # botocore retried a conditional PUT whose first attempt the server applied but whose
                # response was lost (connection reset): the object there is ours, byte for byte.
                return
            raise err from e

    def _is_our_write(self, key: str, size: int, crc: str) -> bool:
        info = self.head(key)
        return info is not None and info.size == size and info.metadata.get("crc32c") == crc

    def get_bytes(self, key: str) -> bytes:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
            data = resp["Body"].read()
        except Exception as e:
            raise self._err(e, "reading", key) from e
        stored = resp.get("Metadata", {}).get("crc32c")
        if stored and from_b64(stored) != crc32c_update(data):
            got = to_b64(crc32c_update(data))
            raise ChecksumMismatchError(
                f"reading s3://{self.bucket}/{key}: CRC32C mismatch: expected {stored}, got {got}"
            )
        return bytes(data)

    def upload_file(
        self,
        path: Path,
        key: str,
        *,
        tags: Mapping[str, str] | None = None,
        sha256: bool = False,
        progress: ProgressFn | None = None,
        typesize: int | None = None,
    ) -> UploadResult:
        req = UploadRequest(
            client=self.client,
            bucket=self.bucket,
            key=key,
            path=Path(path),
            transfer=self.transfer,
            caps=self.capabilities(),
            put_args=self._put_args(),
            tags=tags,
            sha256=sha256,
            progress=progress,
            endpoint=self.endpoint,
        )
        if typesize is not None:
            from ckptvault.store import framed  # imports the codec library: only when compressing

            return framed.upload_framed(req, typesize)
        return upload.upload_file(req)

    def download_file(
        self,
        key: str,
        dest: Path,
        *,
        size: int,
        crc32c: str,
        progress: ProgressFn | None = None,
        frames: Sequence[tuple[int, int, int, str]] = (),
    ) -> None:
        req = self.download_request(key, dest, size=size, crc32c=crc32c, progress=progress)
        if frames:
            from ckptvault.codec import Frame
            from ckptvault.store import framed

            framed.download_framed(req, [Frame(*f) for f in frames])
        else:
            download.download_file(req)

    def download_request(
        self, key: str, dest: Path, *, size: int, crc32c: str, progress: ProgressFn | None = None
    ) -> download.DownloadRequest:
        """What download_file hands to ckptvault.store.download: this store's client, part size,
        shared connection budget and direct-I/O setting."""
        return download.DownloadRequest(
            client=self.client,
            bucket=self.bucket,
            key=key,
            dest=Path(dest),
            size=size,
            crc32c=crc32c,
            part_size=self.transfer.part_size,
            connections=self.download_connections,
            progress=progress,
            endpoint=self.endpoint,
            direct_io=self.cfg.direct_io,
        )

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if http_status(e) != 404:
                raise self._err(e, "deleting", key) from e
        except Exception as e:
            raise self._err(e, "deleting", key) from e

    def abort_multipart_uploads(self, prefix: str, older_than: float | None = None) -> int:
        aborted = 0
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for u in page.get("Uploads", []):
                    started: datetime | None = u.get("Initiated")
                    if older_than is not None and started is not None and started.timestamp() >= older_than:
                        continue
                    try:
                        self.client.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"])
                        aborted += 1
                    except ClientError as e:
                        if error_code(e) != "NoSuchUpload":  # completed or aborted meanwhile
                            raise
        except Exception as e:
            raise self._err(e, f"aborting incomplete uploads under {prefix!r} in") from e
        return aborted

    # -- tiering, restore, tags, lifecycle --------------------------------------------------------

    def copy_storage_class(self, key: str, storage_class: str, size: int) -> None:
        # `size` is only a hint: the copy decides single vs multipart from the HEAD it makes anyway.
        try:
            upload.copy_in_place(self.client, self.bucket, key, storage_class, self._put_args(), self.transfer)
        except Exception as e:
            raise self._err(e, f"moving to storage class {storage_class}:", key) from e

    def restore_object(self, key: str, days: int, tier: str) -> RestoreState:
        info = self.head(key)
        if info is None:
            raise NotFoundError(f"restoring s3://{self.bucket}/{key}: not found")
        if info.restore and 'ongoing-request="true"' in info.restore:
            return "in_progress"
        if not info.frozen:
            archived = info.storage_class in ARCHIVE_CLASSES or info.archive_status is not None
            return "restored" if archived else "not_needed"
        request: Any = {"GlacierJobParameters": {"Tier": tier}}
        if info.archive_status is None:
            request["Days"] = days  # Intelligent-Tiering archive tiers refuse Days
        try:
            resp = self._signing_client().restore_object(Bucket=self.bucket, Key=key, RestoreRequest=request)
        except ClientError as e:
            if error_code(e) == "RestoreAlreadyInProgress":
                return "in_progress"
            if error_code(e) in ("NotImplemented", "MethodNotAllowed") or http_status(e) in (405, 501):
                raise StoreError(
                    f"restoring s3://{self.bucket}/{key}: the store at {self._at} does not implement "
                    "RestoreObject, so it cannot serve archival storage classes"
                ) from e
            raise self._err(e, "restoring", key) from e
        except Exception as e:
            raise self._err(e, "restoring", key) from e
        # 202: a new restore job; 200: a restored copy already exists (its expiry is extended).
        return "restored" if resp["ResponseMetadata"]["HTTPStatusCode"] == 200 else "requested"

    def put_tags(self, key: str, tags: Mapping[str, str]) -> None:
        tagset: Any = [{"Key": k, "Value": v} for k, v in tags.items()]
        try:
            self.client.put_object_tagging(Bucket=self.bucket, Key=key, Tagging={"TagSet": tagset})
        except Exception as e:
            raise self._err(e, "tagging", key) from e

    def get_tags(self, key: str) -> dict[str, str]:
        try:
            resp = self.client.get_object_tagging(Bucket=self.bucket, Key=key)
        except Exception as e:
            raise self._err(e, "reading tags of", key) from e
        return {t["Key"]: t["Value"] for t in resp.get("TagSet", [])}

    def put_lifecycle(self, rules: LifecycleRules) -> None:
        try:
            if rules:
                conf: Any = {"Rules": rules}
                self.client.put_bucket_lifecycle_configuration(Bucket=self.bucket, LifecycleConfiguration=conf)
            else:
                self.client.delete_bucket_lifecycle(Bucket=self.bucket)
        except Exception as e:
            raise self._err(e, "writing the lifecycle configuration of") from e

    def get_lifecycle(self) -> LifecycleRules:
        try:
            resp = self.client.get_bucket_lifecycle_configuration(Bucket=self.bucket)
        except ClientError as e:
            if error_code(e) == "NoSuchLifecycleConfiguration" or http_status(e) == 404:
                return []
            raise self._err(e, "reading the lifecycle configuration of") from e
        except Exception as e:
            raise self._err(e, "reading the lifecycle configuration of") from e
        return [dict(r) for r in resp.get("Rules", [])]

    def ensure_abort_incomplete_mpu_rule(self, days: int = 1) -> bool:
        merged = lifecycle.with_abort_mpu_rule(self.get_lifecycle(), self.cfg.prefix, days)
        if merged is None:
            return False  # already in place: do not rewrite the bucket config
        self.put_lifecycle(merged)
        return True


def _credentials_source() -> str:
    creds = boto3.session.Session().get_credentials()
    if creds is None:
        return "boto3 found no credentials."
    return f"boto3 found credentials via {creds.method!r} (not shown)."


def open_store(cfg: StoreConfig) -> S3Store:
    return S3Store(cfg)


def ensure_bucket(cfg: StoreConfig) -> S3Store:
    """Create the bucket if it does not exist (the demo's and a first user's convenience); an existing
    bucket is left exactly as it is."""
    store = S3Store(cfg)
    try:
        store.check_bucket()
        return store
    except NotFoundError:
        pass
    try:
        if cfg.region and cfg.region != "us-east-1":
            store.client.create_bucket(Bucket=cfg.bucket, CreateBucketConfiguration={"LocationConstraint": cfg.region})  # type: ignore[typeddict-item]
        else:
            store.client.create_bucket(Bucket=cfg.bucket)
    except Exception as e:
        raise translate(e, op="creating", bucket=cfg.bucket, key=None, endpoint=store.endpoint) from e
    return store
