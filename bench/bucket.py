"""The bench's bucket on a server, and the untimed housekeeping around the measured transfers: what a
tool stored, and deleting it again."""

from __future__ import annotations

import contextlib
from typing import Any

from bench.servers import ACCESS_KEY, SECRET_KEY, Server

BUCKET = "ckptvault-bench"


def s3_client(server: Server) -> Any:
    """tests/servers.py's S3Endpoint.client() with botocore's standard retries added: the bench's
    housekeeping has always run with them, against servers busy with multi-GiB transfers."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=server.url,
        region_name=server.region,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        config=Config(
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            retries={"mode": "standard"},
        ),
    )


def list_objects(client: Any, prefix: str, bucket: str = BUCKET) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def delete_prefix(client: Any, server: Server, prefix: str) -> None:
    for o in list_objects(client, prefix):
        client.delete_object(Bucket=BUCKET, Key=o["Key"])
    with contextlib.suppress(Exception):
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=BUCKET, Prefix=prefix):
            for u in page.get("Uploads", []):
                client.abort_multipart_upload(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"])
    server.vacuum()


def stored_bytes(client: Any, prefix: str, names: set[str], bucket: str = BUCKET) -> int:
    return sum(o["Size"] for o in list_objects(client, prefix, bucket) if o["Key"].rpartition("/")[2] in names)
