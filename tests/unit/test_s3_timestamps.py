"""The S3 client's timestamp parser (ckptvault/store/s3_client.py, `parse_timestamp`): the same instant
as botocore's own parser for every form a response carries, the ISO 8601 of a LIST without dateutil."""

from __future__ import annotations

from typing import Any

import botocore.parsers
import pytest

from ckptvault.config import StoreConfig
from ckptvault.store.s3_client import make_client, parse_timestamp


@pytest.mark.parametrize(
    "value",
    [
        "2026-12-04T22:00:07.000Z",  # a LIST's LastModified (AWS, Ceph)
        "2026-12-04T22:00:07Z",  # SeaweedFS
        "2026-12-04T22:00:07.123456+00:00",
        "2026-12-04T23:00:07+01:00",
        "Fri, 04 Dec 2026 22:00:07 GMT",  # a Last-Modified header
        "Thu, 03 Dec 2026 22:00:07 GMT",  # a weekday with a T, not ISO 8601
        "2026-12-04T22:00:07",  # no zone: botocore's reading of it, not ours
        "1796421607",
        1796421607,
        1796421607.5,
    ],
)
def test_the_same_instant_as_botocores_parser(value: Any) -> None:
    ours, theirs = parse_timestamp(value), botocore.parsers.DEFAULT_TIMESTAMP_PARSER(value)
    assert ours == theirs and ours.timestamp() == theirs.timestamp()
    assert (ours.tzinfo is None) == (theirs.tzinfo is None)  # aware where botocore's is


def test_every_client_parses_with_it() -> None:
    client = make_client(StoreConfig(bucket="bkt", endpoint_url="http://127.0.0.1:9"), 2)
    parser = client._endpoint._response_parser_factory.create_parser("rest-xml")  # type: ignore[attr-defined]
    assert parser._timestamp_parser is parse_timestamp
