"""The facts about our three local S3 servers that the rest of the code and tests rely on, checked with the
real boto3 client over HTTP. If one of these fails, a server (or its start-up script) changed under us.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.servers import S3Endpoint

BucketFactory = Callable[[S3Endpoint], str]


def _error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def test_put_get_head_round_trip(any_s3: S3Endpoint, bucket_factory: BucketFactory) -> None:
    s3 = any_s3.client()
    bucket = bucket_factory(any_s3)
    body = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 B, every byte value
    put = s3.put_object(Bucket=bucket, Key="dir/obj.bin", Body=body, Metadata={"run": "r1"})

    head = s3.head_object(Bucket=bucket, Key="dir/obj.bin")
    assert head["ContentLength"] == len(body)
    assert head["ETag"] == put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    assert head["Metadata"] == {"run": "r1"}

    got = s3.get_object(Bucket=bucket, Key="dir/obj.bin")
    assert got["Body"].read() == body
    ranged = s3.get_object(Bucket=bucket, Key="dir/obj.bin", Range="bytes=1000-1009")
    assert ranged["Body"].read() == body[1000:1010]

    with pytest.raises(ClientError) as missing:
        s3.head_object(Bucket=bucket, Key="dir/absent")
    assert _status(missing.value) == 404


def test_if_none_match_star_refuses_overwrite(pipeline_s3: S3Endpoint, bucket_factory: BucketFactory) -> None:
    s3 = pipeline_s3.client()
    bucket = bucket_factory(pipeline_s3)
    s3.put_object(Bucket=bucket, Key="manifest.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as second:
        s3.put_object(Bucket=bucket, Key="manifest.json", Body=b"second", IfNoneMatch="*")
    assert _status(second.value) == 412
    assert _error_code(second.value) == "PreconditionFailed"
    assert s3.get_object(Bucket=bucket, Key="manifest.json")["Body"].read() == b"first"


def test_ceph_custom_storage_class_cold(ceph: S3Endpoint, bucket_factory: BucketFactory) -> None:
    s3 = ceph.client()
    bucket = bucket_factory(ceph)
    cold: Any = "COLD"  # a Ceph placement class; not in boto3-stubs' list of AWS classes
    s3.put_object(Bucket=bucket, Key="cold.bin", Body=b"frozen", StorageClass=cold)
    s3.put_object(Bucket=bucket, Key="hot.bin", Body=b"warm")
    assert str(s3.head_object(Bucket=bucket, Key="cold.bin")["StorageClass"]) == "COLD"
    # STANDARD is the default and, as on AWS, not echoed by HEAD.
    assert s3.head_object(Bucket=bucket, Key="hot.bin").get("StorageClass", "STANDARD") == "STANDARD"
    listed = {o["Key"]: str(o["StorageClass"]) for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert listed == {"cold.bin": "COLD", "hot.bin": "STANDARD"}
    # Unlike GLACIER on AWS, COLD on Ceph is a placement, not a frozen state: GET still works.
    assert s3.get_object(Bucket=bucket, Key="cold.bin")["Body"].read() == b"frozen"


def test_moto_glacier_needs_restore(moto_server: S3Endpoint, bucket_factory: BucketFactory) -> None:
    s3 = moto_server.client()
    bucket = bucket_factory(moto_server)
    s3.put_object(Bucket=bucket, Key="old.ckpt", Body=b"ancient", StorageClass="GLACIER")
    assert s3.head_object(Bucket=bucket, Key="old.ckpt")["StorageClass"] == "GLACIER"

    with pytest.raises(ClientError) as frozen:
        s3.get_object(Bucket=bucket, Key="old.ckpt")
    assert _error_code(frozen.value) == "InvalidObjectState"
    assert _status(frozen.value) == 403

    s3.restore_object(Bucket=bucket, Key="old.ckpt", RestoreRequest={"Days": 1})
    # moto completes a restore at once and reports it the AWS way.
    assert 'ongoing-request="false"' in s3.head_object(Bucket=bucket, Key="old.ckpt")["Restore"]
    assert s3.get_object(Bucket=bucket, Key="old.ckpt")["Body"].read() == b"ancient"


def test_seaweedfs_has_room_for_a_bucket_per_test_whatever_the_free_disk(seaweedfs: S3Endpoint) -> None:
    """Each SeaweedFS bucket holds at least one volume, and weed's own cap on volumes is the free disk over
    the volume size (1 GiB): on a CI box with a few GiB free, the buckets the Object Lock tests cannot
    delete used them all, and every later bucket's first PUT failed with InternalError. seaweedfs.sh sets
    the cap (VOLUME_MAX); the master reports it."""
    import json
    import urllib.parse
    import urllib.request

    s3_port = urllib.parse.urlsplit(seaweedfs.url).port
    assert s3_port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{s3_port + 1}/dir/status", timeout=10) as r:
        status = json.load(r)
    assert status["Topology"]["Max"] == 1000, status["Topology"]
